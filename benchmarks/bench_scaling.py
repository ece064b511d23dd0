"""How audit time grows with the number of prompts and with the prompt length T.

    python benchmarks/bench_scaling.py [--prompts 4,8,16,32] [--tokens 32,64,128,256]
                                       [--fixed-prompts 16] [--fixed-tokens 64] [--repeats R] [--json PATH]

The model is small so the sweep stays fast: a random GPT-2 (6 layers, 8 heads, d_model 256,
512 positions, the tests' byte-level tokenizer of ~300 tokens), saved to a temporary
directory and loaded as ``sinkscope audit`` loads it. Two sweeps of random-token prompts:
the number of prompts at ``--fixed-tokens`` tokens, and the tokens per prompt at
``--fixed-prompts`` prompts, batches of 16. At each point ``sinkscope.pretrained_analysis.audit.audit``
(every probe metric, no figures) and the bridge's bare forward on the same batches are
timed, one CPU thread, alternating, after a warm-up; each time is the median over the
repeats. The exponent is the slope of a least-squares line through (log size, log time):
about 1 is expected for prompts (the work is per prompt), between 1 and 2 for T (the
projections and MLPs grow with T, the attention pattern and its probes with T^2).
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # tiny_models: the tests' offline tokenizer

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from sinkscope.pretrained_analysis.audit import AuditConfig, audit  # noqa: E402
from sinkscope.pretrained_analysis.loading import LoadedModel, LoadSpec, load_model  # noqa: E402
from sinkscope.pretrained_analysis.prompts import PromptSpec, load_prompt_set, tokenize_prompts  # noqa: E402

N_LAYERS, N_HEADS, D_MODEL, N_CTX = 6, 8, 256, 512
BATCH_SIZE = 16
EXPECTED = {"prompts": (0.8, 1.2), "tokens": (1.0, 2.0)}  # the exponent ranges the text above argues for


def build_model(directory: str) -> int:
    """Save the small random GPT-2 and its tokenizer; returns its parameter count."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from tiny_models import train_byte_level_tokenizer

    tokenizer = train_byte_level_tokenizer()
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=N_CTX,
        n_ctx=N_CTX,
        n_layer=N_LAYERS,
        n_head=N_HEADS,
        n_embd=D_MODEL,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config).eval()
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return sum(p.numel() for p in model.parameters())


def time_point(loaded: LoadedModel, n_prompts: int, tokens: int, repeats: int) -> dict:
    """Median seconds of the audit and of the bare forward for one (prompts, T)."""
    prompt_set = load_prompt_set(PromptSpec(source="random", n_prompts=n_prompts, max_len=tokens))
    tokenized = tokenize_prompts(prompt_set, loaded)
    batches = [tokenized.batch(start, start + BATCH_SIZE) for start in range(0, len(tokenized), BATCH_SIZE)]
    config = AuditConfig(batch_size=BATCH_SIZE, n_examples=0)

    def run_audit() -> None:
        audit(loaded, prompt_set, config, progress=False)

    def run_bare() -> None:
        with torch.no_grad():
            for ids, mask in batches:
                loaded.bridge(ids, attention_mask=mask.long())

    runs = {"audit": run_audit, "bare": run_bare}
    for run in runs.values():
        run()
    times: dict[str, list[float]] = {"audit": [], "bare": []}
    for repeat in range(repeats):
        for way in ("audit", "bare") if repeat % 2 == 0 else ("bare", "audit"):
            started = time.perf_counter()
            runs[way]()
            times[way].append(time.perf_counter() - started)
    return {
        "prompts": n_prompts,
        "tokens": tokens,
        "n_tokens": int(tokenized.attention_mask.sum()),
        "audit_s": statistics.median(times["audit"]),
        "bare_s": statistics.median(times["bare"]),
        "audit_runs_s": times["audit"],
        "bare_runs_s": times["bare"],
    }


def fit_exponent(sizes: list[float], seconds: list[float]) -> tuple[float, float]:
    """Slope and R^2 of the least-squares line through (log size, log seconds)."""
    xs, ys = [math.log(s) for s in sizes], [math.log(t) for t in seconds]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if len(xs) < 2 or sxx == 0:
        return math.nan, math.nan
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    residual = sum((y - my - slope * (x - mx)) ** 2 for x, y in zip(xs, ys))
    total = sum((y - my) ** 2 for y in ys)
    return slope, (1.0 - residual / total) if total else 1.0


def polynomial_fit(sizes: list[float], seconds: list[float], degree: int) -> list[float]:
    """Non-negative least-squares coefficients of ``seconds ~ c0 + c1 size (+ c2 size^2)``,
    lowest order first (a cost cannot be negative, and noise at a few points easily makes
    an unconstrained fit say so); NaNs where there are too few points. Exact for this tiny
    problem: the best unconstrained fit over every subset of the terms, kept when all its
    coefficients are >= 0."""
    if len(sizes) <= degree:
        return [math.nan] * (degree + 1)
    x, y = np.asarray(sizes, dtype=float), np.asarray(seconds, dtype=float)
    columns = np.stack([x**power for power in range(degree + 1)], axis=1)
    best, best_residual = [0.0] * (degree + 1), float(np.sum(y**2))
    for mask in range(1, 2 ** (degree + 1)):
        chosen = [power for power in range(degree + 1) if mask >> power & 1]
        solution = np.linalg.lstsq(columns[:, chosen], y, rcond=None)[0]
        if np.any(solution < 0):
            continue
        residual = float(np.sum((columns[:, chosen] @ solution - y) ** 2))
        if residual < best_residual:
            coefficients = [0.0] * (degree + 1)
            for power, value in zip(chosen, solution, strict=True):
                coefficients[power] = float(value)
            best, best_residual = coefficients, residual
    return best


def sweep(loaded: LoadedModel, axis: str, sizes: list[int], fixed: int, repeats: int) -> dict:
    """Time the audit at each size along ``axis`` (``prompts`` or ``tokens``) and fit exponents."""
    points = [
        time_point(loaded, size, fixed, repeats) if axis == "prompts" else time_point(loaded, fixed, size, repeats)
        for size in sizes
    ]
    audit_exp, audit_r2 = fit_exponent(sizes, [p["audit_s"] for p in points])
    bare_exp, bare_r2 = fit_exponent(sizes, [p["bare_s"] for p in points])
    audit_s = [p["audit_s"] for p in points]
    # prompts: time = fixed + per-prompt cost; T: time = fixed + linear + quadratic in T
    coefficients = polynomial_fit(sizes, audit_s, 1 if axis == "prompts" else 2)
    return {
        "axis": axis,
        "fixed": fixed,
        "sizes": sizes,
        "points": points,
        "audit_exponent": audit_exp,
        "audit_r2": audit_r2,
        "bare_exponent": bare_exp,
        "bare_r2": bare_r2,
        "expected": EXPECTED[axis],
        "local_exponent": fit_exponent(sizes[-2:], audit_s[-2:])[0],
        "fit_coefficients": coefficients,
    }


def explain(result: dict) -> str:
    """One sentence on what shapes the fitted exponent: the fixed per-call cost (and, for T,
    the share of the T^2 term at the largest size), and the slope between the two largest sizes."""
    axis, sizes, points = result["axis"], result["sizes"], result["points"]
    coefficients, small, large = result["fit_coefficients"], points[0], points[-1]
    fixed = coefficients[0]
    text = (
        f"vs {axis}: exponent {result['audit_exponent']:.2f} over {sizes[0]}..{sizes[-1]}, "
        f"{result['local_exponent']:.2f} between the two largest sizes; "
    )
    if not math.isfinite(fixed):
        return text + "too few sizes to separate a fixed cost."
    text += (
        f"a {'straight-line' if axis == 'prompts' else 'quadratic'} fit puts a fixed per-call cost of {1000 * fixed:.0f} ms "
        f"({100 * fixed / small['audit_s']:.0f}% of the time at {sizes[0]}, {100 * fixed / large['audit_s']:.0f}% at {sizes[-1]})"
    )
    if axis == "prompts":
        return text + "; a fixed cost flattens the log-log slope at small sizes."
    quadratic = coefficients[2] * sizes[-1] ** 2
    return text + (
        f" and the T^2 term at {100 * quadratic / large['audit_s']:.0f}% of the time at T={sizes[-1]} (non-negative "
        "fit of fixed + T + T^2); a fixed cost flattens the log-log slope at small T, the T^2 term steepens it at large T."
    )


def format_sweep(result: dict) -> str:
    axis, other = result["axis"], ("tokens" if result["axis"] == "prompts" else "prompts")
    header = f"{axis:>8} {'audit s':>9} {'bare s':>9} {'audit/bare':>11}"
    lines = [f"audit time vs {axis} ({other} fixed at {result['fixed']})", header, "-" * len(header)]
    for p in result["points"]:
        lines.append(f"{p[axis]:>8} {p['audit_s']:>9.3f} {p['bare_s']:>9.3f} {p['audit_s'] / p['bare_s']:>11.2f}")
    low, high = result["expected"]
    lines.append(
        f"exponent: audit {result['audit_exponent']:.2f} (R^2 {result['audit_r2']:.3f}), bare forward "
        f"{result['bare_exponent']:.2f} (R^2 {result['bare_r2']:.3f}); expected {low:g}..{high:g}"
    )
    return "\n".join(lines)


def _sizes(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=_sizes, default=[4, 8, 16, 32], help="prompt counts (default 4,8,16,32)")
    parser.add_argument(
        "--tokens", type=_sizes, default=[32, 64, 128, 256], help="tokens per prompt (default 32,64,128,256)"
    )
    parser.add_argument("--fixed-prompts", type=int, default=16, help="prompts in the T sweep (default 16)")
    parser.add_argument("--fixed-tokens", type=int, default=64, help="tokens in the prompts sweep (default 64)")
    parser.add_argument(
        "--repeats", type=int, default=5, help="timed runs per point; the median is reported (default 5)"
    )
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args(argv)
    if len(args.prompts) < 2 or len(args.tokens) < 2:
        parser.error("--prompts and --tokens need at least two sizes each to fit an exponent")
    if min(args.prompts + [args.fixed_prompts, args.repeats]) < 1 or not all(
        2 <= t <= N_CTX for t in args.tokens + [args.fixed_tokens]
    ):
        parser.error(f"prompt counts and --repeats must be >= 1 and token counts in 2..{N_CTX}")
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="bench_scaling_") as model_dir:
        n_params = build_model(model_dir)
        loaded = load_model(LoadSpec(model_dir, device="cpu"), progress=False)
        results = [
            sweep(loaded, "prompts", args.prompts, args.fixed_tokens, args.repeats),
            sweep(loaded, "tokens", args.tokens, args.fixed_prompts, args.repeats),
        ]
    print(
        f"audit scaling: random GPT-2 {N_LAYERS}x{N_HEADS}, d_model {D_MODEL} ({n_params / 1e6:.1f}M parameters), "
        f"batches of {BATCH_SIZE}, {args.repeats} repeats, 1 thread, torch {torch.__version__}"
    )
    for result in results:
        print(format_sweep(result))
        print(explain(result))
    if args.json is not None:
        from sinkscope.infra.atomic_io import atomic_write_json

        atomic_write_json(
            args.json,
            {
                "benchmark": "scaling",
                "torch": torch.__version__,
                "python": platform.python_version(),
                "threads": torch.get_num_threads(),
                "n_params": n_params,
                "results": results,
            },
        )
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
