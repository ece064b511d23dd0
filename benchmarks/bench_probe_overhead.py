"""Probe overhead against a bare forward pass: time ratio and peak memory.

    python benchmarks/bench_probe_overhead.py [--repeats R] [--prompts N] [--tokens T] [--json PATH]

Two 12-layer models, each on N prompts x T tokens (default 64 x 64) in one batch:
- ``toy 12x4``: a random ``ToyTransformer`` (12 layers, 4 heads of 16, d_model 64) on
  trigger-task tokens;
- ``gpt2 12x4``: a random GPT-2 (12 layers, 4 heads, d_model 256, byte-level BPE vocab of
  ~300), saved to a temporary directory and loaded through
  ``TransformerBridge.boot_transformers``, on random token ids.

Three ways to run each, same process, one CPU thread, the order rotating between
repeats, each time the median over the repeats:
- ``bare``: ``model(inputs)`` under ``torch.inference_mode``: the reference;
- ``probe``: ``sinkscope.probes.runner.probe_model`` with every metric (values and residual
  statistics included), the whole set as one batch;
- ``cache``: ``run_with_cache`` keeping every layer's ``hook_pattern``, under
  ``torch.inference_mode``, what a probe that caches patterns first would hold.

Memory: each (model, way) runs in a fresh spawned process that builds the model and
records its resident set (RSS), runs once, records what stays resident (``kept``: memory
the model holds on to after a run, outputs dropped), resets the kernel's peak-RSS mark
(``/proc/self/clear_refs``, Linux), runs again and reads the peak (``VmHWM``): ``peak``
is that peak minus the RSS before the first run. Why RSS: on CPU, torch allocates
tensors through its own allocator (``posix_memalign``), which ``tracemalloc`` never
sees; ``torch.profiler(profile_memory=True)`` records per-op allocations but no peak,
which would have to be rebuilt from its event timeline while its own bookkeeping
distorts the run. The child sets ``MALLOC_MMAP_THRESHOLD_`` so glibc returns freed large
buffers to the system at once instead of keeping them for reuse, so RSS follows the
live tensors. The pattern line gives exact sizes for comparison: one layer's
``[batch, head, query, key]`` float32 pattern, and all layers'.

TransformerLens 4.3's ``JointQKVAttentionBridge`` (GPT-2, NeoX, ...) keeps each layer's
last pattern in ``attn._pattern`` after a forward pass, so a bridge run holds every
layer's pattern whatever the caller caches; ``kept`` shows it.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import multiprocessing
import os
import platform
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # tiny_models: the tests' offline GPT-2 builder

from sinkscope.interp.hooked_model import HookedModel  # noqa: E402
from sinkscope.probes.probe import ProbeConfig  # noqa: E402
from sinkscope.probes.runner import probe_model  # noqa: E402

MODES = ("bare", "probe", "cache")
CASES = ("toy 12x4", "gpt2 12x4")
N_LAYERS, N_HEADS = 12, 4
MiB = 2**20


@dataclass(frozen=True)
class Setup:
    """Which case to build, and its shape."""

    case: str
    prompts: int
    tokens: int
    gpt2_dir: str


@dataclass(frozen=True)
class Memory:
    """MiB above the RSS before the first run: held after one run, and the peak of the next."""

    kept_mib: float
    peak_mib: float


@dataclass(frozen=True)
class CaseResult:
    case: str
    mode: str
    median_s: float
    ratio_to_bare: float
    median_paired_ratio: float
    runs_s: tuple[float, ...]
    memory: Memory | None


def build(setup: Setup) -> tuple[HookedModel, torch.Tensor]:
    """The hooked model and its inputs: toy tokens ``[n, pos, d_model]`` or token ids ``[n, pos]``."""
    if setup.case == "toy 12x4":
        from sinkscope.toy.model import ToyModelConfig, ToyTransformer
        from sinkscope.toy.task import TaskConfig, eval_batch

        torch.manual_seed(0)
        config = ToyModelConfig(
            n_layers=N_LAYERS, n_heads=N_HEADS, d_model=64, d_head=16, seq_len=setup.tokens, init_std=0.1
        )
        task = TaskConfig(d_model=64, seq_len=setup.tokens, eval_trigger_position=setup.tokens // 2)
        return HookedModel(ToyTransformer(config)), eval_batch(task, setup.prompts, seed=0, target="residual").tokens
    from tiny_models import load_bridge

    bridge = load_bridge(setup.gpt2_dir)
    tokens = torch.randint(
        0, bridge.cfg.d_vocab, (setup.prompts, setup.tokens), generator=torch.Generator().manual_seed(0)
    )
    return HookedModel(bridge), tokens


def runner(hooked: HookedModel, inputs: torch.Tensor, mode: str) -> Callable[[], None]:
    """A no-argument function that runs ``inputs`` through ``hooked`` in ``mode``."""
    model = hooked.model
    if mode == "bare":

        def run() -> None:
            with torch.inference_mode():
                model(inputs)

    elif mode == "probe":
        config = ProbeConfig(batch_size=inputs.shape[0])

        def run() -> None:
            probe_model(hooked, inputs, config=config)

    else:

        def run() -> None:
            with torch.inference_mode():
                model.run_with_cache(inputs, names_filter=lambda name: name.endswith("hook_pattern"))

    return run


def _status_kib() -> dict[str, int]:
    text = Path("/proc/self/status").read_text()
    return {key: int(value) for key, value in re.findall(r"(VmHWM|VmRSS):\s+(\d+) kB", text)}


def measure_in_child(setup: Setup, mode: str) -> Memory:
    """Runs in a fresh process (see the module docstring)."""
    torch.set_num_threads(1)
    hooked, inputs = build(setup)
    run = runner(hooked, inputs, mode)
    start = _status_kib()["VmRSS"]
    run()
    kept = _status_kib()["VmRSS"] - start
    Path("/proc/self/clear_refs").write_text("5")
    run()
    return Memory(kept_mib=kept / 1024, peak_mib=(_status_kib()["VmHWM"] - start) / 1024)


def measure_memory(setup: Setup, mode: str) -> Memory | None:
    """``measure_in_child`` in a spawned process, or None where /proc cannot reset the peak."""
    if not os.access("/proc/self/clear_refs", os.W_OK):
        return None
    os.environ["MALLOC_MMAP_THRESHOLD_"] = str(128 * 1024)  # read by the child's glibc at start
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        return pool.submit(measure_in_child, setup, mode).result()


def bench_case(setup: Setup, repeats: int) -> list[CaseResult]:
    hooked, inputs = build(setup)
    runs = {mode: runner(hooked, inputs, mode) for mode in MODES}
    for run in runs.values():
        run()
    times: dict[str, list[float]] = {mode: [] for mode in MODES}
    for repeat in range(repeats):
        for mode in MODES[repeat % len(MODES) :] + MODES[: repeat % len(MODES)]:
            started = time.perf_counter()
            runs[mode]()
            times[mode].append(time.perf_counter() - started)
    bare = statistics.median(times["bare"])
    return [
        CaseResult(
            case=setup.case,
            mode=mode,
            median_s=statistics.median(times[mode]),
            ratio_to_bare=statistics.median(times[mode]) / bare,
            median_paired_ratio=statistics.median(t / b for t, b in zip(times[mode], times["bare"], strict=True)),
            runs_s=tuple(times[mode]),
            memory=measure_memory(setup, mode),
        )
        for mode in MODES
    ]


def pattern_mib(prompts: int, tokens: int) -> float:
    """One layer's float32 pattern ``[prompts, head, tokens, tokens]`` in MiB."""
    return prompts * N_HEADS * tokens * tokens * 4 / MiB


def format_table(results: list[CaseResult], prompts: int, tokens: int) -> str:
    header = f"{'model':<10} {'way':<6} {'median s':>9} {'x bare':>7} {'paired':>7} {'kept MiB':>9} {'peak MiB':>9} {'peak - bare':>12}"
    lines = [header, "-" * len(header)]
    bare = {r.case: r.memory for r in results if r.mode == "bare"}
    for r in results:
        if r.memory is None or bare[r.case] is None:
            memory = f"{'n/a':>9} {'n/a':>9} {'n/a':>12}"
        else:
            memory = f"{r.memory.kept_mib:>9.1f} {r.memory.peak_mib:>9.1f} {r.memory.peak_mib - bare[r.case].peak_mib:>+12.1f}"
        lines.append(
            f"{r.case:<10} {r.mode:<6} {r.median_s:>9.3f} {r.ratio_to_bare:>7.2f} {r.median_paired_ratio:>7.2f} {memory}"
        )
    one = pattern_mib(prompts, tokens)
    lines.append(
        f"patterns ({prompts} x {N_HEADS} x {tokens} x {tokens} float32): one layer {one:.1f} MiB, "
        f"all {N_LAYERS} layers {N_LAYERS * one:.1f} MiB"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per way; the median is reported (default 5)")
    parser.add_argument("--prompts", type=int, default=64, help="prompts in the batch (default 64)")
    parser.add_argument("--tokens", type=int, default=64, help="tokens per prompt, at most 64 (default 64)")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.prompts < 1 or not 2 <= args.tokens <= 64:
        parser.error("--repeats and --prompts must be >= 1 and --tokens in 2..64 (the GPT-2's context)")

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    torch.set_num_threads(1)
    from tiny_models import build_tiny_gpt2

    results: list[CaseResult] = []
    with tempfile.TemporaryDirectory(prefix="bench_probe_gpt2_") as gpt2_dir:
        build_tiny_gpt2(gpt2_dir, n_layer=N_LAYERS, n_head=N_HEADS, n_embd=256)
        for case in CASES:
            results += bench_case(Setup(case, args.prompts, args.tokens, gpt2_dir), args.repeats)
    print(
        f"probe overhead, {args.prompts} prompts x {args.tokens} tokens, {args.repeats} repeats, 1 thread, torch {torch.__version__}"
    )
    print(format_table(results, args.prompts, args.tokens))
    if args.json is not None:
        from sinkscope.infra.atomic_io import atomic_write_json

        atomic_write_json(
            args.json,
            {
                "benchmark": "probe_overhead",
                "torch": torch.__version__,
                "python": platform.python_version(),
                "threads": torch.get_num_threads(),
                "prompts": args.prompts,
                "tokens": args.tokens,
                "repeats": args.repeats,
                "pattern_mib_one_layer": pattern_mib(args.prompts, args.tokens),
                "pattern_mib_all_layers": N_LAYERS * pattern_mib(args.prompts, args.tokens),
                "results": [asdict(r) for r in results],
            },
        )
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
