"""Training speed of every toy attention kind as a ratio to softmax, in one run.

    python benchmarks/bench_attention_kinds.py [--steps N] [--repeats R] [--json PATH]

Each kind runs the trainer's inner step (``sinkscope.toy.train``): a fresh batch from
``sinkscope.toy.task.sample_batch``, forward, MSE loss, backward and an Adam step with the
trainer's optimiser (``paper_adam``), for the paper's 1x1, 2x2 and 4x4 shapes, alone
(K = 1, the model itself) and as a stack of K = 3 seeds (``torch.func.stack_module_state``
and ``vmap``, as ``sinkscope.toy.seed_stack`` runs several seeds). One CPU thread; the
kinds' order rotates between repeats; each figure is the median over repeats, and the
ratio is softmax's median time per step over the kind's (1.0: as fast as softmax; the
issue's bound: >= 0.5).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from pathlib import Path

import torch
from torch.func import functional_call, stack_module_state, vmap

from sinkscope.toy.mitigations import MITIGATION_KINDS
from sinkscope.toy.model import ToyModelConfig, ToyTransformer
from sinkscope.toy.run_dir import RunConfig, TrainConfig
from sinkscope.toy.run_member import paper_adam
from sinkscope.toy.task import TaskConfig, sample_batch

SHAPES = ((1, 1), (2, 2), (4, 4))


def step_timer(kind: str, n_layers: int, n_heads: int, seeds: int):
    """A function running ``steps`` training steps and returning seconds per step."""
    task = TaskConfig()
    config = RunConfig(ToyModelConfig(n_layers=n_layers, n_heads=n_heads, attention=kind), task, TrainConfig())
    models = []
    for seed in range(seeds):
        torch.manual_seed(seed)
        models.append(ToyTransformer(config.model))
    target = config.model.target
    generator = torch.Generator().manual_seed(0)
    if seeds == 1:
        params = list(models[0].parameters())
        forward = lambda tokens: models[0](tokens[0]).unsqueeze(0)  # noqa: E731
    else:
        base = copy.deepcopy(models[0]).to("meta")
        stacked, buffers = stack_module_state(models)
        params = list(stacked.values())
        batched = vmap(lambda p, b, x: functional_call(base, (p, b), (x,)))
        forward = lambda tokens: batched(stacked, buffers, tokens)  # noqa: E731
    optimizer = paper_adam(params, config)

    def run(steps: int) -> float:
        started = time.perf_counter()
        for _ in range(steps):
            batches = [sample_batch(task, 128, generator, target) for _ in range(seeds)]
            tokens = torch.stack([b.tokens for b in batches])
            targets = torch.stack([b.targets for b in batches])
            loss = (forward(tokens) - targets).pow(2).mean(dim=(1, 2, 3)).sum()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        return (time.perf_counter() - started) / steps

    run(5)  # warm-up: allocations, first-call dispatch
    return run


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--shapes", default="1x1,2x2,4x4", help="layers x heads, comma-separated (default all three)")
    parser.add_argument("--seeds", default="1,3", help="stack sizes K, comma-separated (default 1,3)")
    args = parser.parse_args()
    shapes = [tuple(int(n) for n in shape.split("x")) for shape in args.shapes.split(",")]
    unknown = [shape for shape in shapes if shape not in SHAPES]
    if unknown:
        parser.error(f"--shapes takes the paper's shapes {', '.join(f'{a}x{b}' for a, b in SHAPES)}; got {unknown}")
    torch.set_num_threads(1)
    rows = []
    for n_layers, n_heads in shapes:
        for seeds in (int(k) for k in args.seeds.split(",")):
            timers = {kind: step_timer(kind, n_layers, n_heads, seeds) for kind in MITIGATION_KINDS}
            times: dict[str, list[float]] = {kind: [] for kind in MITIGATION_KINDS}
            for repeat in range(args.repeats):
                order = (
                    MITIGATION_KINDS[repeat % len(MITIGATION_KINDS) :]
                    + MITIGATION_KINDS[: repeat % len(MITIGATION_KINDS)]
                )
                for kind in order:
                    times[kind].append(timers[kind](args.steps))
            softmax = statistics.median(times["softmax"])
            for kind in MITIGATION_KINDS:
                median = statistics.median(times[kind])
                rows.append(
                    {
                        "shape": f"{n_layers}x{n_heads}",
                        "seeds": seeds,
                        "kind": kind,
                        "steps_per_s": round(1 / median, 1),
                        "ratio_to_softmax": round(softmax / median, 3),
                    }
                )
                print(
                    f"{n_layers}x{n_heads} K={seeds} {kind:>20}: {1 / median:8.1f} steps/s, "
                    f"{softmax / median:.3f} of softmax's speed",
                    flush=True,
                )
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
