"""Training speed of the hooked ToyTransformer against a plain torch module with the same math.

    python benchmarks/bench_toy_training.py [--steps N] [--repeats R] [--json PATH]

Both models run the trainer's inner step (``sinkscope.toy.train``): a fresh batch from
``sinkscope.toy.task.sample_batch``, forward, MSE loss, the batch L-inf error, backward and an Adam
step with the trainer's optimiser (`sinkscope.toy.run_member.paper_adam`: fused Adam, betas 0.9/0.95, no weight decay, the paper's lr for the
architecture). The plain model below has the same parameters (names and shapes) and the
same operations in the same order, only without ``HookPoint``s, so the ratio measures
what the hooks cost. Both run the circuit order of ``sinkscope.toy.attention`` (what training
runs); a third way, ``per head``, is the hooked model with a no-op hook on every
``hook_z``, which forces the per-head order (q, k, v, z materialised): the ratio
``circuits speedup`` = per-head time / circuit time is what the circuit order buys. Metric logging (``run_with_cache`` every ``log_every`` steps) and
checkpoint I/O are left out: they are not part of the per-step cost being compared.

One CPU thread, both models in one process, the order alternating between repeats;
each figure is the median over the repeats. Target: hooked/plain >= 0.9.
"""

from __future__ import annotations

import argparse
import math
import platform
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from sinkscope.interp.attention_kinds import (
    causal_mask,
    fixed_row_scale,
    score_scale,
    scores_to_pattern,
)
from sinkscope.interp.hook_names import attn_hook
from sinkscope.toy.model import ToyModelConfig, ToyTransformer
from sinkscope.toy.run_dir import RunConfig, TrainConfig
from sinkscope.toy.run_member import DATA_SEED_OFFSET, paper_adam
from sinkscope.toy.task import TaskConfig, sample_batch

SEED = 0


class PlainAttention(nn.Module):
    """``sinkscope.toy.attention.HookedAttention``'s circuit order (what training runs) without
    hook points: the same ops in the same order."""

    def __init__(self, config: ToyModelConfig) -> None:
        super().__init__()
        d_model, n_heads, d_head = config.d_model, config.n_heads, config.head_width
        if d_head < d_model:
            raise ValueError("the plain reference covers full-width heads (the circuit order) only")
        self.attention, self.n_heads, self.d_model = config.attention, n_heads, d_model
        self.scale = score_scale(d_head, config.scale_scores)
        self.W_Q = nn.Parameter(torch.empty(n_heads, d_model, d_head))
        self.W_K = nn.Parameter(torch.empty(n_heads, d_model, d_head))
        self.W_V = nn.Parameter(torch.empty(n_heads, d_model, d_head))
        self.W_O = nn.Parameter(torch.empty(n_heads, d_head, d_model))
        self._cache: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor | None]] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n_batch, n_pos, d_model = x.shape
        n_heads = self.n_heads
        key = (n_pos, str(x.device))
        if key not in self._cache:
            hidden = ~causal_mask(n_pos, n_pos, x.device)
            bias = torch.zeros(n_pos, n_pos, device=x.device).masked_fill(hidden, float("-inf"))
            row_scale = fixed_row_scale(self.attention, n_pos, x.device)
            self._cache[key] = (
                bias.unsqueeze(1).expand(n_pos, n_heads, n_pos).contiguous(),
                None if row_scale is None else row_scale.unsqueeze(-1),
            )
        bias, row_scale = self._cache[key]
        w_qk = (self.W_Q @ self.W_K.transpose(1, 2)).permute(1, 0, 2).reshape(d_model, n_heads * d_model)
        if self.scale != 1.0:
            w_qk = w_qk * self.scale
        w_ov = (self.W_V @ self.W_O).permute(1, 0, 2).reshape(d_model, n_heads * d_model)
        scores = ((x @ w_qk).view(n_batch, n_pos * n_heads, d_model) @ x.transpose(1, 2)).view(
            n_batch, n_pos, n_heads, n_pos
        )
        pattern = scores_to_pattern(self.attention, scores + bias, row_scale)  # [batch, query, head, key]
        values = (
            (x @ w_ov).view(n_batch, n_pos, n_heads, d_model).transpose(1, 2).reshape(n_batch, n_heads * n_pos, d_model)
        )
        return pattern.reshape(n_batch, n_pos, n_heads * n_pos) @ values


class PlainBlock(nn.Module):
    def __init__(self, config: ToyModelConfig) -> None:
        super().__init__()
        self.residual = config.has_residual
        self.attn = PlainAttention(config)

    def forward(self, resid: torch.Tensor) -> torch.Tensor:
        attn_out = self.attn(resid)
        return resid + attn_out if self.residual else attn_out


class PlainTransformer(nn.Module):
    """The paper's attention-only model as a plain module; parameter names match
    ``ToyTransformer`` so ``load_state_dict`` copies weights across."""

    def __init__(self, config: ToyModelConfig) -> None:
        super().__init__()
        if config.layer_norm or config.mlp or config.positional_embedding:
            raise ValueError("the plain reference covers the paper's models only (no LayerNorm, MLP or positions)")
        self.cfg = config
        self.blocks = nn.ModuleList(PlainBlock(config) for _ in range(config.n_layers))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        resid = tokens
        for block in self.blocks:
            resid = block(resid)
        return resid


@dataclass(frozen=True)
class Case:
    name: str
    model: ToyModelConfig


CASES = (
    Case("1x1 softmax", ToyModelConfig(n_layers=1, n_heads=1, attention="softmax")),
    Case("4x4 softmax", ToyModelConfig(n_layers=4, n_heads=4, attention="softmax")),
)


def build_pair(config: ToyModelConfig) -> tuple[ToyTransformer, PlainTransformer]:
    """A hooked model from the seed and a plain one holding a copy of its weights."""
    torch.manual_seed(SEED)
    hooked = ToyTransformer(config)
    plain = PlainTransformer(config)
    plain.load_state_dict(hooked.state_dict(), strict=True)
    return hooked, plain


def check_same_math(config: ToyModelConfig, task: TaskConfig) -> float:
    """Assert both models agree to 1e-6 on a batch, before and after a few training steps."""
    hooked, plain = build_pair(config)
    hooked_shapes = {n: tuple(p.shape) for n, p in hooked.named_parameters()}
    plain_shapes = {n: tuple(p.shape) for n, p in plain.named_parameters()}
    assert hooked_shapes == plain_shapes, (hooked_shapes, plain_shapes)
    batch = sample_batch(task, 64, torch.Generator().manual_seed(123), config.target)
    with torch.no_grad():
        diff = float((hooked(batch.tokens) - plain(batch.tokens)).abs().max())
    assert diff <= 1e-6, f"hooked and plain outputs differ by {diff:.3g}"
    train_steps(hooked, config, task, 5)
    train_steps(plain, config, task, 5)
    with torch.no_grad():
        trained_diff = float((hooked(batch.tokens) - plain(batch.tokens)).abs().max())
    assert trained_diff <= 1e-6, f"after 5 training steps the outputs differ by {trained_diff:.3g}"
    return max(diff, trained_diff)


def train_steps(model: nn.Module, config: ToyModelConfig, task: TaskConfig, steps: int) -> float:
    """``steps`` of the trainer's inner loop; returns the elapsed seconds."""
    train_cfg = TrainConfig(seed=SEED)
    optimizer = paper_adam(model.parameters(), RunConfig(config, task, train_cfg))
    generator = torch.Generator().manual_seed(SEED + DATA_SEED_OFFSET)
    target = config.target
    started = time.perf_counter()
    for _ in range(steps):
        batch = sample_batch(task, train_cfg.batch_size, generator, target)
        error = model(batch.tokens) - batch.targets
        loss = error.pow(2).mean()
        loss_value, linf_value = float(loss.detach()), float(error.detach().abs().max())
        if not (math.isfinite(loss_value) and math.isfinite(linf_value)):
            raise RuntimeError("loss became non-finite during the benchmark")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return time.perf_counter() - started


def bench_case(case: Case, steps: int, repeats: int, warmup: int) -> dict:
    task = TaskConfig(d_model=case.model.d_model, seq_len=case.model.seq_len)
    max_diff = check_same_math(case.model, task)
    kinds = ("hooked", "plain", "per_head")
    rates: dict[str, list[float]] = {kind: [] for kind in kinds}
    for repeat in range(repeats):
        for kind in kinds[repeat % 3 :] + kinds[: repeat % 3]:  # rotate the order
            hooked, plain = build_pair(case.model)
            model = plain if kind == "plain" else hooked
            if kind == "per_head":
                for layer in range(case.model.n_layers):
                    hooked.add_hook(attn_hook(layer, "z"), lambda z, hook: None)
                assert not any(block.attn._circuits_apply() for block in hooked.blocks)
            train_steps(model, case.model, task, warmup)
            rates[kind].append(steps / train_steps(model, case.model, task, steps))
    hooked_rate, plain_rate = statistics.median(rates["hooked"]), statistics.median(rates["plain"])
    per_head_rate = statistics.median(rates["per_head"])
    paired = [h / p for h, p in zip(rates["hooked"], rates["plain"])]
    return {
        "case": case.name,
        "model": case.encode(model),
        "steps": steps,
        "repeats": repeats,
        "warmup": warmup,
        "hooked_steps_per_s": hooked_rate,
        "plain_steps_per_s": plain_rate,
        "ratio_hooked_over_plain": hooked_rate / plain_rate,
        "median_paired_ratio": statistics.median(paired),
        "per_head_steps_per_s": per_head_rate,
        "circuits_speedup": hooked_rate / per_head_rate,
        "hooked_runs": rates["hooked"],
        "plain_runs": rates["plain"],
        "per_head_runs": rates["per_head"],
        "max_output_diff": max_diff,
    }


def format_table(results: list[dict]) -> str:
    header = (
        f"{'config':<13} {'hooked steps/s':>15} {'plain steps/s':>14} {'hooked/plain':>13} {'paired median':>14}"
        f" {'per-head steps/s':>17} {'circuits speedup':>17}"
    )
    lines = [header, "-" * len(header)]
    for r in results:
        lines.append(
            f"{r['case']:<13} {r['hooked_steps_per_s']:>15.1f} {r['plain_steps_per_s']:>14.1f} "
            f"{r['ratio_hooked_over_plain']:>13.3f} {r['median_paired_ratio']:>14.3f}"
            f" {r['per_head_steps_per_s']:>17.1f} {r['circuits_speedup']:>16.2f}x"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200, help="timed training steps per run (default 200)")
    parser.add_argument("--repeats", type=int, default=5, help="runs per model; the median is reported (default 5)")
    parser.add_argument("--warmup", type=int, default=10, help="untimed steps before each run (default 10)")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.repeats < 1 or args.warmup < 0:
        parser.error("--steps and --repeats must be >= 1 and --warmup >= 0")

    torch.set_num_threads(1)
    results = [bench_case(case, args.steps, args.repeats, args.warmup) for case in CASES]
    print(f"toy training, {args.steps} steps x {args.repeats} repeats, 1 thread, torch {torch.__version__}")
    print(format_table(results))
    worst = min(r["ratio_hooked_over_plain"] for r in results)
    print(f"worst hooked/plain ratio {worst:.3f} (target >= 0.9): {'ok' if worst >= 0.9 else 'BELOW TARGET'}")
    if args.json is not None:
        from sinkscope.infra.atomic_io import atomic_write_json

        atomic_write_json(
            args.json,
            {
                "benchmark": "toy_training",
                "torch": torch.__version__,
                "python": platform.python_version(),
                "threads": torch.get_num_threads(),
                "results": results,
            },
        )
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
