"""Audit throughput and memory on a GPT-2-small-, Pythia-160m- or SmolLM2-135M-shaped model against a bare forward pass.

    python benchmarks/bench_audit.py [--shape gpt2-small|pythia-160m|smollm2-135m] [--prompts N] [--tokens T]
                                     [--batch-size B] [--repeats R] [--ways W,...] [--memory-only] [--json PATH]

The model (``SHAPES``): ``gpt2-small`` is ``GPT2Config()``'s defaults (12 layers, 12 heads,
d_model 768, vocabulary 50,257, 124M parameters) with ``n_ctx`` set explicitly;
``pythia-160m`` is a ``GPTNeoXConfig`` with pythia-160m's sizes (hidden 768, 12 layers,
12 heads, intermediate 3072, rotary on a quarter of each head, vocabulary 50,304, 2,048
positions, untied unembedding, 162M parameters); ``smollm2-135m`` is a ``LlamaConfig`` with
SmolLM2-135M's sizes, the grouped-query-attention shape (hidden 576, 30 layers, 9 query heads
sharing 3 key/value heads, head size 64, SwiGLU intermediate 1536, RMSNorm eps 1e-5, rotary
on every head with theta 100,000, vocabulary 49,152, 8,192 positions, unembedding tied to the
embedding, 135M parameters). Random weights (seed 0), saved to a
temporary directory with the tests' byte-level tokenizer (filled up to the model's vocabulary
with added tokens) and loaded as ``sinkscope audit``
loads it (``sinkscope.pretrained_analysis.loading.load_model``: ``TransformerBridge``, raw weights).
The prompts: N random-token prompts of T tokens, BOS first (default 16 x 64, batches of 16).

Four ways to run the same prompts, one CPU thread, all under ``torch.no_grad``, the order
rotating between repeats, each figure the median over the repeats:
- ``bare hf``: the plain Hugging Face model's forward (``AutoModelForCausalLM``, eager attention);
- ``bare bridge``: the bridge's forward, no hooks: the bare forward of the audited model,
  logits included;
- ``bare trunk``: the same forward ended after the last block's ``hook_resid_post`` (the
  point where the audit stops), so without the final layer norm and the unembedding;
- ``audit``: ``sinkscope.pretrained_analysis.audit.audit`` without figures (``n_examples=0``):
  tokenizing, every probe metric (values and residual statistics included), batch by batch
  (grouped by length; all prompts here have the same length). The audit's probe passes run
  under ``torch.inference_mode`` and stop after the last block: the final layer norm and
  the unembedding (the ``[batch, pos, vocab]`` logits) never run, which the two bare ways
  do run. The unembedding is about 30% of the GPT-2 and Pythia shapes' multiply-adds per
  token (768 x ~50k of ~124M) and about a fifth of the SmolLM2 shape's (576 x 49,152 of
  ~135M), and roughly that share of the bare bridge's time, so the time ratio
  compares a pass without it against passes with it; ``x trunk`` compares the audit with
  ``bare trunk``, like with like: that is what the probes themselves cost. The memory
  ratio has no logits in its numerator;
- ``audit lean``: the same audit without the key geometry and the secondary sinks
  (``--no-key-geometry --no-secondary-sinks``): what those two measurements add;
- ``full cache``: ``run_with_cache`` on every hook of every batch, all caches kept, which
  is what computing the same metrics from cached activations would hold.
Writing the figures and JSON (``write_audit``, two example heatmaps) is timed once, apart.

Peak memory, the method of ``bench_probe_overhead.py``: each way runs in a fresh spawned
process that loads the model, runs once to warm up, resets the kernel's peak-RSS mark
(``/proc/self/clear_refs``), records the resident set, runs again and reads the new peak
(``VmHWM``); the figure is that peak minus the resident set before the run. RSS, because
torch's CPU allocator is invisible to ``tracemalloc``; ``MALLOC_MMAP_THRESHOLD_`` makes
glibc return freed large buffers at once so earlier runs cannot hide allocations.
Targets (issue 6): audit <= 1.3 x bare bridge time (and, stricter, <= 1.3 x bare trunk
time); audit peak <= 0.25 x the full cache's.

Long prompts (issue 24): ``--ways`` keeps some of the ways (the full cache of a 4,096-token
prompt would hold every layer's scores and pattern, tens of GiB, so leave it out there) and
``--memory-only`` skips the timing and ``write_audit`` (one 4,096-token forward takes minutes
on one thread), measuring only the peaks. ``--tokens`` goes up to the shape's positions
(``MAX_TOKENS``). The memory budget (``budget_check``): the audit's peak <= the bare bridge's
peak + ``BUDGET_PATTERNS`` one-layer ``[batch, head, query, key]`` float32 patterns: the
probes may hold up to two temporaries the size of one pattern beside the forward's own, never
one per layer (a kept pattern per layer would add 30 of them on the SmolLM2 shape).
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
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # tiny_models: the tests' offline tokenizer

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from sinkscope.pretrained_analysis.audit import AuditConfig, audit, write_audit  # noqa: E402
from sinkscope.pretrained_analysis.loading import LoadedModel, LoadSpec, load_model  # noqa: E402
from sinkscope.pretrained_analysis.prompts import (  # noqa: E402
    PromptSet,
    PromptSpec,
    TokenizedPrompts,
    load_prompt_set,
    tokenize_prompts,
)

MODES = ("bare hf", "bare bridge", "bare trunk", "audit", "audit lean", "full cache")
MiB = 2**20
MAX_TOKENS = {"gpt2-small": 1024, "pythia-160m": 2048, "smollm2-135m": 8192}  # each shape's positions
BUDGET_PATTERNS = 2  # one-layer float32 patterns the audit may add to the bare bridge's peak


@dataclass(frozen=True)
class Setup:
    model_dir: str
    prompts: int
    tokens: int
    batch_size: int


@dataclass(frozen=True)
class ModeResult:
    """One way's figures; times are None for a way that was not timed."""

    mode: str
    median_s: float | None
    tokens_per_s: float | None
    ratio_to_bare_bridge: float | None
    ratio_to_bare_trunk: float | None
    ratio_to_bare_hf: float | None
    runs_s: tuple[float, ...]
    peak_rss_increase_mib: float | None


@dataclass
class Harness:
    loaded: LoadedModel
    prompt_set: PromptSet
    tokenized: TokenizedPrompts
    hf_model: Any | None


SHAPES: dict[str, str] = {
    "gpt2-small": "GPT-2-small shape (GPT2Config defaults)",
    "pythia-160m": "Pythia-160m shape (GPTNeoXConfig)",
    "smollm2-135m": "SmolLM2-135M (Llama GQA) shape (LlamaConfig)",
}


def build_model(directory: str, shape: str = "gpt2-small") -> int:
    """Save a random model of ``shape`` (see ``SHAPES``) and a tokenizer; returns its parameter count."""
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        GPTNeoXConfig,
        GPTNeoXForCausalLM,
        LlamaConfig,
        LlamaForCausalLM,
    )

    from tiny_models import train_byte_level_tokenizer

    tokenizer = train_byte_level_tokenizer()
    special = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id}
    if shape == "gpt2-small":
        config, model_class = GPT2Config(n_ctx=1024, **special), GPT2LMHeadModel
    elif shape == "pythia-160m":
        config = GPTNeoXConfig(
            vocab_size=50304,
            hidden_size=768,
            num_hidden_layers=12,
            num_attention_heads=12,
            intermediate_size=3072,
            rotary_pct=0.25,
            max_position_embeddings=2048,
            tie_word_embeddings=False,
            **special,
        )
        model_class = GPTNeoXForCausalLM
    elif shape == "smollm2-135m":
        config = LlamaConfig(
            vocab_size=49152,
            hidden_size=576,
            intermediate_size=1536,
            num_hidden_layers=30,
            num_attention_heads=9,
            num_key_value_heads=3,
            max_position_embeddings=8192,
            rms_norm_eps=1e-5,
            rope_theta=100000,
            tie_word_embeddings=True,
            attn_implementation="eager",
            **special,
        )
        model_class = LlamaForCausalLM
    else:
        raise ValueError(f"unknown shape {shape!r}; choose one of {', '.join(SHAPES)}")
    torch.manual_seed(0)
    model = model_class(config).eval()
    model.save_pretrained(directory)
    # filler tokens up to the model's vocabulary: the audit refuses a tokenizer far smaller
    # than the model's vocabulary (not the model's own), and random prompts draw from all of it
    tokenizer.add_tokens([f"<filler_{index}>" for index in range(config.vocab_size - len(tokenizer))])
    tokenizer.save_pretrained(directory)
    return sum(p.numel() for p in model.parameters())


def harness(setup: Setup, mode: str | None) -> Harness:
    loaded = load_model(LoadSpec(setup.model_dir, device="cpu"), progress=False)
    prompt_set = load_prompt_set(PromptSpec(source="random", n_prompts=setup.prompts, max_len=setup.tokens))
    hf_model = None
    if mode in (None, "bare hf"):
        from transformers import AutoModelForCausalLM

        hf_model = AutoModelForCausalLM.from_pretrained(setup.model_dir, attn_implementation="eager").eval()
    return Harness(loaded, prompt_set, tokenize_prompts(prompt_set, loaded), hf_model)


class _EndOfTrunk(Exception):
    """Raised at the last block's resid_post to end a ``bare trunk`` forward."""


def _end_trunk(tensor: torch.Tensor, hook: Any) -> None:
    raise _EndOfTrunk


def runner(h: Harness, mode: str, batch_size: int) -> Callable[[], None]:
    bridge, tokenized = h.loaded.bridge, h.tokenized
    last_block = f"blocks.{bridge.cfg.n_layers - 1}.hook_resid_post"
    batches = [tokenized.batch(start, start + batch_size) for start in range(0, len(tokenized), batch_size)]
    config = AuditConfig(batch_size=batch_size, n_examples=0)
    lean = AuditConfig(batch_size=batch_size, n_examples=0, key_geometry=False, secondary_sinks=False)

    def run() -> None:
        with torch.no_grad():
            if mode == "bare hf":
                for tokens, mask in batches:
                    h.hf_model(tokens, attention_mask=mask.long())
            elif mode == "bare bridge":
                for tokens, mask in batches:
                    bridge(tokens, attention_mask=mask.long())
            elif mode == "bare trunk":
                for tokens, mask in batches:
                    try:
                        bridge.run_with_hooks(tokens, fwd_hooks=[(last_block, _end_trunk)], attention_mask=mask.long())
                    except _EndOfTrunk:
                        pass
            elif mode in ("audit", "audit lean"):
                audit(h.loaded, h.prompt_set, config if mode == "audit" else lean, progress=False)
            else:
                caches = [bridge.run_with_cache(tokens, attention_mask=mask.long())[1] for tokens, mask in batches]
                del caches

    return run


def _status_kib() -> dict[str, int]:
    text = Path("/proc/self/status").read_text()
    return {key: int(value) for key, value in re.findall(r"(VmHWM|VmRSS):\s+(\d+) kB", text)}


def peak_rss_increase(setup: Setup, mode: str) -> float:
    """Runs in a fresh process: peak RSS during one warm run minus RSS before it, MiB."""
    torch.set_num_threads(1)
    run = runner(harness(setup, mode), mode, setup.batch_size)
    run()
    Path("/proc/self/clear_refs").write_text("5")
    before = _status_kib()["VmRSS"]
    run()
    return (_status_kib()["VmHWM"] - before) / 1024


def measure_memory(setup: Setup, mode: str) -> float | None:
    if not os.access("/proc/self/clear_refs", os.W_OK):
        return None
    os.environ["MALLOC_MMAP_THRESHOLD_"] = str(128 * 1024)  # inherited by the child only
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        return pool.submit(peak_rss_increase, setup, mode).result()


def time_modes(h: Harness, setup: Setup, repeats: int, modes: tuple[str, ...] = MODES) -> dict[str, list[float]]:
    """Seconds per run of each of ``modes``, after one warm-up run each, the order rotating between repeats."""
    runs = {mode: runner(h, mode, setup.batch_size) for mode in modes}
    for run in runs.values():
        run()
    times: dict[str, list[float]] = {mode: [] for mode in modes}
    for repeat in range(repeats):
        shift = repeat % len(modes)
        for mode in modes[shift:] + modes[:shift]:
            started = time.perf_counter()
            runs[mode]()
            times[mode].append(time.perf_counter() - started)
    return times


def time_write(h: Harness, setup: Setup) -> float:
    """Seconds of one ``write_audit`` (JSON, CSV, figures, two example heatmaps)."""
    with tempfile.TemporaryDirectory(prefix="bench_audit_out_") as out:
        result = audit(h.loaded, h.prompt_set, AuditConfig(batch_size=setup.batch_size), progress=False)
        started = time.perf_counter()
        write_audit(result, out)
        return time.perf_counter() - started


def bench(
    setup: Setup,
    repeats: int,
    memory_modes: tuple[str, ...] = MODES,
    with_write: bool = True,
    h: Harness | None = None,
    timed_modes: tuple[str, ...] = MODES,
) -> tuple[list[ModeResult], float | None]:
    """Time ``timed_modes`` (medians over ``repeats``; ``bare bridge`` always), measure the
    peak memory of ``memory_modes`` (each in a fresh process) and, with ``with_write``, time
    ``write_audit`` once."""
    h = harness(setup, None) if h is None else h
    timed = tuple(mode for mode in MODES if mode in timed_modes or mode == "bare bridge")
    times = time_modes(h, setup, repeats, timed)
    write_seconds = time_write(h, setup) if with_write else None
    n_tokens = int(h.tokenized.attention_mask.sum())
    medians = {mode: statistics.median(values) for mode, values in times.items()}
    hf, trunk = medians.get("bare hf"), medians.get("bare trunk")

    def result(mode: str) -> ModeResult:
        peak = measure_memory(setup, mode) if mode in memory_modes else None
        if mode not in medians:
            return ModeResult(mode, None, None, None, None, None, (), peak)
        median = medians[mode]
        return ModeResult(
            mode=mode,
            median_s=median,
            tokens_per_s=n_tokens / median,
            ratio_to_bare_bridge=median / medians["bare bridge"],
            ratio_to_bare_trunk=None if trunk is None else median / trunk,
            ratio_to_bare_hf=None if hf is None else median / hf,
            runs_s=tuple(times[mode]),
            peak_rss_increase_mib=peak,
        )

    return [result(mode) for mode in MODES], write_seconds


def measure_memory_only(setup: Setup, ways: tuple[str, ...]) -> list[ModeResult]:
    """The peak memory of ``ways`` (each in a fresh process), nothing timed; each printed as it
    is measured (a long prompt takes minutes per way)."""
    results = []
    for mode in ways:
        results.append(ModeResult(mode, None, None, None, None, None, (), measure_memory(setup, mode)))
        print(f"{mode}: peak +{results[-1].peak_rss_increase_mib} MiB", flush=True)
    return results


def pattern_mib(batch_size: int, n_heads: int, tokens: int) -> float:
    """One layer's ``[batch, head, query, key]`` float32 attention pattern, MiB."""
    return batch_size * n_heads * tokens * tokens * 4 / MiB


def budget_check(results: list[ModeResult], pattern: float) -> tuple[float, bool] | None:
    """(the budget in MiB, whether the audit's peak is within it); None when the audit or the
    bare bridge was not measured."""
    peaks = {r.mode: r.peak_rss_increase_mib for r in results}
    audit_peak, bridge_peak = peaks.get("audit"), peaks.get("bare bridge")
    if audit_peak is None or bridge_peak is None:
        return None
    budget = bridge_peak + BUDGET_PATTERNS * pattern
    return budget, audit_peak <= budget


def parse_ways(text: str) -> tuple[str, ...]:
    """``--ways``: comma-separated names of ``MODES``, kept in ``MODES``' order."""
    names = {name.strip() for name in text.split(",") if name.strip()}
    unknown = names - set(MODES)
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"ways are comma-separated names from: {', '.join(MODES)}")
    return tuple(mode for mode in MODES if mode in names)


def format_table(results: list[ModeResult]) -> str:
    header = (
        f"{'way':<12} {'median s':>9} {'tokens/s':>9} {'x bridge':>9} {'x trunk':>8} {'x hf':>6} {'peak +MiB':>10}"
        f" {'of cache':>9}"
    )
    lines = [header, "-" * len(header)]
    cache = next((r.peak_rss_increase_mib for r in results if r.mode == "full cache"), None)  # None: not measured
    for r in results:
        peak = "n/a" if r.peak_rss_increase_mib is None else f"{r.peak_rss_increase_mib:.0f}"
        share = "n/a" if r.peak_rss_increase_mib is None or not cache else f"{r.peak_rss_increase_mib / cache:.2f}"

        def cell(value: float | None, width: int, digits: int) -> str:
            return f"{'n/a':>{width}}" if value is None else f"{value:>{width}.{digits}f}"

        lines.append(
            f"{r.mode:<12} {cell(r.median_s, 9, 2)} {cell(r.tokens_per_s, 9, 0)} {cell(r.ratio_to_bare_bridge, 9, 2)} "
            f"{cell(r.ratio_to_bare_trunk, 8, 2)} "
            f"{cell(r.ratio_to_bare_hf, 6, 2)} {peak:>10} {share:>9}"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=tuple(SHAPES), default="gpt2-small", help="model shape (default gpt2-small)")
    parser.add_argument("--prompts", type=int, default=16, help="random-token prompts (default 16)")
    parser.add_argument("--tokens", type=int, default=64, help="tokens per prompt, BOS included (default 64)")
    parser.add_argument("--batch-size", type=int, default=16, help="prompts per forward pass (default 16)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per way; the median is reported (default 3)")
    parser.add_argument(
        "--ways", type=parse_ways, default=MODES, help=f"comma-separated ways to run (default all: {', '.join(MODES)})"
    )
    parser.add_argument("--memory-only", action="store_true", help="measure the ways' peak memory only, time nothing")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args(argv)
    max_tokens = MAX_TOKENS[args.shape]
    if min(args.prompts, args.batch_size, args.repeats) < 1 or not 2 <= args.tokens <= max_tokens:
        parser.error(f"--prompts, --batch-size and --repeats must be >= 1 and --tokens in 2..{max_tokens}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    write_seconds = None
    with tempfile.TemporaryDirectory(prefix=f"bench_audit_{args.shape}_") as model_dir:
        n_params = build_model(model_dir, args.shape)
        from transformers import AutoConfig

        n_heads = AutoConfig.from_pretrained(model_dir).num_attention_heads
        setup = Setup(model_dir, args.prompts, args.tokens, args.batch_size)
        if args.memory_only:
            results = measure_memory_only(setup, args.ways)
        else:
            with_write = "audit" in args.ways
            results, write_seconds = bench(setup, args.repeats, args.ways, with_write, timed_modes=args.ways)
    pattern = pattern_mib(min(args.batch_size, args.prompts), n_heads, args.tokens)
    budget = budget_check(results, pattern)
    print(
        f"audit vs bare forward: {SHAPES[args.shape]} ({n_params / 1e6:.0f}M parameters, random weights), "
        f"{args.prompts} prompts x {args.tokens} tokens, batches of {args.batch_size}, "
        f"{'memory only' if args.memory_only else f'{args.repeats} repeats'}, 1 thread, torch {torch.__version__}"
    )
    print(format_table(results))
    if write_seconds is not None:
        print(f"write_audit (JSON, CSV, map, per-layer plot, 2 example heatmaps): {write_seconds:.2f} s, once")
    print(f"one layer's [batch, head, query, key] float32 pattern: {pattern:.0f} MiB")
    if budget is not None:
        print(
            f"budget: audit peak <= bare bridge peak + {BUDGET_PATTERNS} patterns = {budget[0]:.0f} MiB: "
            f"{'ok' if budget[1] else 'NOT MET'}"
        )
    if args.json is not None:
        write_json(args, n_params, results, write_seconds, pattern, budget)
    return 0


def write_json(
    args: argparse.Namespace,
    n_params: int,
    results: list[ModeResult],
    write_seconds: float | None,
    pattern: float,
    budget: tuple[float, bool] | None,
) -> None:
    from sinkscope.infra.atomic_io import atomic_write_json

    atomic_write_json(
        args.json,
        {
            "benchmark": "audit",
            "torch": torch.__version__,
            "python": platform.python_version(),
            "threads": torch.get_num_threads(),
            "shape": args.shape,
            "n_params": n_params,
            "prompts": args.prompts,
            "tokens": args.tokens,
            "batch_size": args.batch_size,
            "repeats": None if args.memory_only else args.repeats,
            "ways": list(args.ways),
            "write_audit_s": write_seconds,
            "pattern_mib": pattern,
            "budget_mib": None if budget is None else budget[0],
            "within_budget": None if budget is None else budget[1],
            "results": [asdict(result) for result in results],
        },
    )
    print(f"wrote {args.json}")


if __name__ == "__main__":
    raise SystemExit(main())
