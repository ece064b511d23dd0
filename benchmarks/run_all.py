"""The benchmark suite: every ratio of issue 6 next to its target, written to RESULTS.md.

    python benchmarks/run_all.py [--quick] [--out benchmarks/RESULTS.md] [--only toy,seeds,audit,scaling,load]
                                 [--profile missed|always|never] [--json PATH]

Five sections, each run in its own Python subprocess (a clean heap, one CPU thread, its
own imports), each reusing the benchmark module named in brackets:
- ``toy``: training steps per second of the hooked toy model against a plain torch module
  of the same math (``bench_toy_training``); target hooked/plain >= 0.9 in every case;
- ``seeds``: K=8 seeds trained as one vectorised computation against 8 runs one after
  another (``bench_seeds``); target >= 3x faster; reported as not available when
  ``sinkscope.toy.train.train_seeds`` cannot be imported;
- ``audit``: the audit against the bare forward pass and against caching every hook, on a
  GPT-2-small-shaped (124M), a Pythia-160m-shaped (162M) and a SmolLM2-135M-shaped model
  (Llama with grouped-query attention, 9 query heads on 3 key/value heads, 135M), random
  local weights (``bench_audit``); targets audit time <= 1.3 x bare forward and audit peak
  memory <= 0.25 x the full cache's; each peak is measured in a fresh spawned process;
- ``scaling``: audit time against the number of prompts and the prompt length T on a
  small GPT-2, with fitted log-log exponents (``bench_scaling``); expected about 1 and
  between 1 and 2;
- ``load``: toy training speed beside a busy-looping process as a share of its idle speed,
  through the Python API and the CLI, with the old two-thread setting as the baseline
  (``bench_under_load``); target >= 0.8;
- ``executors``: the default ``toy sweep`` on the Ray executor (a local instance started
  for the run) against the local one, identical models required, and a batch of small
  synthetic units (``bench_executors``); target Ray / local <= 1.5.
Times are medians over several runs (the number is in each table). Whenever a target is
not met (or with ``--profile always``) the section profiles the slow path with
``torch.profiler`` and ``cProfile`` and RESULTS.md summarises where the time or memory
goes. ``--quick`` runs fewer repeats and sizes (about 4 minutes on 2 cores; the full
suite stays under 15). RESULTS.md is written atomically, after every section has run.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
SECTIONS = ("toy", "seeds", "audit", "scaling", "load", "executors")
SECTION_TIMEOUT_S = 15 * 60  # the audit section, three shapes, is the longest
VERSION_PACKAGES = ("torch", "transformer-lens", "transformers", "sinkscope")

# What each section runs, per preset. Sizes were chosen so that the full suite stays under
# 15 minutes and --quick about 4 on 2 cores (see the suite wall time in RESULTS.md).
PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "full": {
        "toy": {"steps": 300, "repeats": 7, "warmup": 10, "profile_steps": 50},
        "seeds": {"k": 8, "steps": 300, "repeats": 3, "cases": ["1x1", "2x2"], "profile_steps": 50},
        "audit": {
            "shapes": ["gpt2-small", "pythia-160m", "smollm2-135m"],
            "prompts": 16,
            "tokens": 64,
            "batch_size": 16,
            "repeats": 5,
            "memory_modes": ["bare hf", "bare bridge", "audit", "full cache"],
            "write": True,
            "timed_modes": ["bare hf", "bare bridge", "bare trunk", "audit", "full cache"],
        },
        "scaling": {
            "prompts": [4, 8, 16, 32],
            "tokens": [32, 64, 128, 256],
            "fixed_prompts": 16,
            "fixed_tokens": 64,
            "repeats": 5,
        },
        "load": {"cases": ["1x1", "2x2", "4x4"], "steps": {"1x1": 3000, "2x2": 1200, "4x4": 600}, "hogs": 1},
        "executors": {"workers": 2, "units": 8, "seconds": 0.5, "repeats": 3},
    },
    "quick": {
        "toy": {"steps": 100, "repeats": 3, "warmup": 5, "profile_steps": 20},
        "seeds": {"k": 8, "steps": 100, "repeats": 3, "cases": ["1x1"], "profile_steps": 20},
        "audit": {
            "shapes": ["gpt2-small", "pythia-160m", "smollm2-135m"],
            "prompts": 8,
            "tokens": 64,
            "batch_size": 8,
            "repeats": 3,
            "memory_modes": ["bare bridge", "audit", "full cache"],
            "write": False,
            "timed_modes": ["bare bridge", "bare trunk", "audit"],
        },
        "scaling": {
            "prompts": [4, 8, 16, 32],
            "tokens": [32, 64, 128, 256],
            "fixed_prompts": 8,
            "fixed_tokens": 64,
            "repeats": 3,
        },
        "load": {"cases": ["1x1", "4x4"], "steps": {"1x1": 1000, "4x4": 200}, "hogs": 1},
        "executors": {"workers": 2, "units": 4, "seconds": 0.5, "repeats": 1},
    },
}

TOY_TARGET, SEEDS_TARGET, AUDIT_TIME_TARGET, AUDIT_MEMORY_TARGET = 0.9, 3.0, 1.3, 0.25


_STARTED = time.perf_counter()


def log(message: str) -> None:
    """Progress on stderr, with the seconds since this process started."""
    print(f"{time.perf_counter() - _STARTED:6.0f}s {message}", file=sys.stderr, flush=True)


def target_row(
    label: str, value: float | None, target: str, ok: bool | None, status: str | None = None, kind: str = "target"
) -> dict:
    """One line of the summary table. ``status`` overrides the verdict (e.g. not available)."""
    if status is None:
        if kind == "target":
            status = "ok" if ok else "NOT MET"
        else:
            status = "as expected" if ok else "outside expectation"
    return {"label": label, "value": value, "target": target, "ok": ok, "status": status, "kind": kind}


def code_block(text: str) -> str:
    return f"```\n{text}\n```"


# --------------------------------------------------------------------------- sections
# Each runs inside its own subprocess and returns a JSON-serialisable dict:
# {"rows": [target_row...], "details": markdown, "profiles": [profiling dicts], "raw": ...}


def section_toy(p: dict, profile: str) -> dict:
    import torch

    import bench_toy_training as btt
    import profiling

    results = []
    for case in btt.CASES:
        log(f"[toy] {case.name}: {p['repeats']} x {p['steps']} steps per model")
        results.append(btt.bench_case(case, p["steps"], p["repeats"], p["warmup"]))
    rows = [
        target_row(
            f"toy training {r['case']}: hooked / plain steps per second",
            r["ratio_hooked_over_plain"],
            f">= {TOY_TARGET}",
            r["ratio_hooked_over_plain"] >= TOY_TARGET,
        )
        for r in results
    ]
    details = (
        f"Trainer's inner step (fresh batch of 128, forward, MSE, backward, Adam) on the hooked `ToyTransformer` and a "
        f"plain `nn.Module` with the same parameters and operations (outputs checked equal to 1e-6 before and after 5 "
        f"steps). {p['steps']} timed steps after {p['warmup']} warm-up steps, {p['repeats']} repeats alternating the order, "
        f"medians; 1 thread; torch {torch.__version__}.\n\n{code_block(btt.format_table(results))}"
    )
    profiles = []
    worst = min(results, key=lambda r: r["ratio_hooked_over_plain"])
    if profile == "always" or (profile == "missed" and worst["ratio_hooked_over_plain"] < TOY_TARGET):
        case = next(c for c in btt.CASES if c.name == worst["case"])
        task = btt.TaskConfig(d_model=case.model.d_model, seq_len=case.model.seq_len)
        hooked, plain = btt.build_pair(case.model)
        n = p["profile_steps"]
        log(f"[toy] profiling {case.name}, {n} steps per model")
        found = profiling.compare(
            f"toy training {case.name}: hooked vs plain, {n} steps",
            "hooked",
            lambda: btt.train_steps(hooked, case.model, task, n),
            "plain",
            lambda: btt.train_steps(plain, case.model, task, n),
        )
        found["summary"] += f" Per step: divide by {n}."
        profiles.append(found)
    return {"rows": rows, "details": details, "profiles": profiles, "raw": results}


def section_seeds(p: dict, profile: str) -> dict:
    import torch

    import bench_seeds
    import profiling

    train_batched, source = bench_seeds.load_batched_trainer()
    label = f"K={p['k']} seeds: sequential / vectorised time"
    if train_batched is None:
        return {
            "rows": [target_row(label, None, f">= {SEEDS_TARGET:g}x", None, status="not available")],
            "details": f"Not available: {source}. The benchmark runs as soon as `sinkscope.toy.train` provides "
            "`train_seeds(configs, run_dirs, progress=False) -> list[TrainResult]`.",
            "profiles": [],
            "raw": {"available": False, "reason": source},
        }
    results = []
    for case in p["cases"]:
        log(f"[seeds] {case}: K={p['k']}, {p['steps']} steps, {p['repeats']} repeats")
        results.append(bench_seeds.bench_case(train_batched, case, p["k"], p["steps"], p["repeats"]))
    rows = [
        target_row(f"{label}, {r['case']}", r["speedup"], f">= {SEEDS_TARGET:g}x", r["speedup"] >= SEEDS_TARGET)
        for r in results
    ]
    agreement_notes = []
    for r in results:
        a = r["agreement"]
        agreement_notes.append(
            f"- {r['case']}: same status and steps per seed: {a['same_status'] and a['same_steps']}; largest relative "
            f"difference in final loss {a['max_rel_loss']:.2e}, in final L-inf error {a['max_rel_linf']:.2e}"
        )
    details = (
        f"K={p['k']} configs identical except the seed, `TrainConfig(max_steps={p['steps']}, stop_linf=1e-12)` (no early "
        f"stop; trainer defaults otherwise: metrics every 100 steps, final checkpoint and weights written), fresh run "
        f"directories: `sinkscope.toy.train.train` once per seed vs one `{source}` call. {p['repeats']} repeats alternating the "
        f"order, medians; 1 thread; torch {torch.__version__}.\n\n{code_block(bench_seeds.format_table(results))}\n\n"
        "Batched vs one-by-one results (last repeat):\n" + "\n".join(agreement_notes)
    )
    profiles = []
    worst = min(results, key=lambda r: r["speedup"])
    if profile == "always" or (profile == "missed" and worst["speedup"] < SEEDS_TARGET):
        case = worst["case"].split()[0]
        n = p["profile_steps"]
        configs = bench_seeds.seed_configs(bench_seeds.CASES[case], p["k"], n)
        log(f"[seeds] profiling {case}, {n} steps")
        with tempfile.TemporaryDirectory(prefix="bench_seeds_profile_") as tmp:
            counter = iter(range(10**6))
            found = profiling.compare(
                f"K={p['k']} seeds {worst['case']}: vectorised vs sequential, {n} steps",
                "vectorised",
                lambda: bench_seeds.run_batched(train_batched, configs, Path(tmp) / f"b{next(counter)}"),
                "sequential",
                lambda: bench_seeds.run_sequential(configs, Path(tmp) / f"s{next(counter)}"),
            )
        found["summary"] = (
            "The target asks the vectorised run to take at most a third of the sequential run's time. Both do the same "
            "arithmetic (the same FLOPs, in K-times larger kernels when vectorised), so what vectorising can save is the "
            "per-operator, per-step and per-run overhead: compare the operator totals below with the wall times above. "
            + found["summary"]
        )
        profiles.append(found)
    return {"rows": rows, "details": details, "profiles": profiles, "raw": results}


def section_audit(p: dict, profile: str) -> dict:
    import torch

    import bench_audit
    import profiling

    rows, blocks, profiles, raw = [], [], [], []
    for shape in p["shapes"]:
        with tempfile.TemporaryDirectory(prefix=f"bench_audit_{shape}_") as model_dir:
            log(f"[audit] {shape}: building the random model")
            n_params = bench_audit.build_model(model_dir, shape)
            setup = bench_audit.Setup(model_dir, p["prompts"], p["tokens"], p["batch_size"])
            h = bench_audit.harness(setup, None)
            log(
                f"[audit] {shape}: timing {len(p['timed_modes'])} ways x {p['repeats']} repeats, "
                f"peak memory of {len(p['memory_modes'])} ways"
            )
            results, write_s = bench_audit.bench(
                setup, p["repeats"], tuple(p["memory_modes"]), p["write"], h, tuple(p["timed_modes"])
            )
            log(f"[audit] {shape}: measured")
            by_mode = {r.mode: r for r in results}
            time_ratio = by_mode["audit"].ratio_to_bare_bridge
            audit_peak, cache_peak = by_mode["audit"].peak_rss_increase_mib, by_mode["full cache"].peak_rss_increase_mib
            memory_ratio = None if audit_peak is None or not cache_peak else audit_peak / cache_peak
            name = bench_audit.SHAPES[shape].rsplit(" (", 1)[0]
            rows.append(
                target_row(
                    f"audit {name}: audit / bare forward time",
                    time_ratio,
                    f"<= {AUDIT_TIME_TARGET}",
                    time_ratio <= AUDIT_TIME_TARGET,
                )
            )
            trunk_ratio = by_mode["audit"].ratio_to_bare_trunk
            if trunk_ratio is not None:
                rows.append(
                    target_row(
                        f"audit {name}: audit / bare forward without the unembedding",
                        trunk_ratio,
                        f"<= {AUDIT_TIME_TARGET}",
                        trunk_ratio <= AUDIT_TIME_TARGET,
                    )
                )
                time_ratio = max(time_ratio, trunk_ratio)  # a profile when either comparison misses
            if memory_ratio is None:
                rows.append(
                    target_row(
                        f"audit {name}: audit / full-cache peak memory",
                        None,
                        f"<= {AUDIT_MEMORY_TARGET}",
                        None,
                        status="not measured (/proc/self/clear_refs not writable)",
                    )
                )
            else:
                rows.append(
                    target_row(
                        f"audit {name}: audit / full-cache peak memory",
                        memory_ratio,
                        f"<= {AUDIT_MEMORY_TARGET}",
                        memory_ratio <= AUDIT_MEMORY_TARGET,
                    )
                )
            text = bench_audit.format_table(results)
            if write_s is not None:
                text += f"\nwrite_audit (JSON, CSV, map, per-layer plot, 2 example heatmaps): {write_s:.2f} s, once"
            blocks.append(
                f"**{bench_audit.SHAPES[shape]}**, {n_params / 1e6:.0f}M parameters, random weights:\n\n{code_block(text)}"
            )
            raw.append(
                {
                    "shape": shape,
                    "n_params": n_params,
                    "write_audit_s": write_s,
                    "results": [r.__dict__ for r in results],
                }
            )
            missed_time = time_ratio > AUDIT_TIME_TARGET
            missed_memory = memory_ratio is not None and memory_ratio > AUDIT_MEMORY_TARGET
            if profile == "always" or (profile == "missed" and missed_time):
                log(f"[audit] {shape}: profiling audit vs bare bridge")
                audit_run = bench_audit.runner(h, "audit", setup.batch_size)
                bare_run = bench_audit.runner(h, "bare bridge", setup.batch_size)
                profiles.append(
                    profiling.compare(
                        f"audit {name}: audit vs bare forward", "audit", audit_run, "bare bridge", bare_run
                    )
                )
            if profile == "always" or (profile == "missed" and missed_memory):
                log(f"[audit] {shape}: memory profile of the audit")
                found = profiling.memory_profile(
                    f"audit {name}: what the audit allocates", "audit", bench_audit.runner(h, "audit", setup.batch_size)
                )
                logits_mib = p["batch_size"] * p["tokens"] * h.loaded.bridge.cfg.d_vocab * 4 / 2**20
                bare_peak = by_mode["bare bridge"].peak_rss_increase_mib
                if bare_peak is not None:
                    found["summary"] = (
                        f"Peak above the loaded model: bare forward {bare_peak:.0f} MiB ({bare_peak / cache_peak:.2f} of the "
                        f"full cache's {cache_peak:.0f} MiB), audit {audit_peak:.0f} MiB: the probes add "
                        f"{audit_peak - bare_peak:+.0f} MiB, so the audit's peak is the forward pass's own. "
                    ) + found["summary"]
                found["summary"] += (
                    f" For scale: one batch's float32 logits [{p['batch_size']}, {p['tokens']}, {h.loaded.bridge.cfg.d_vocab}] "
                    f"take {logits_mib:.0f} MiB, which the bare forward allocates and the audit, ending after the last block, does not."
                )
                profiles.append(found)
            del h
    details = (
        f"{p['prompts']} random-token prompts x {p['tokens']} tokens (BOS first), batches of {p['batch_size']}, loaded as "
        "`sinkscope audit` loads a model (TransformerBridge, raw weights). Ways: `bare hf` (Hugging Face forward), "
        "`bare bridge` (the bridge's forward: the reference for the time target), `bare trunk` (the same forward ended "
        "after the last block, where the audit ends: no final layer norm, no unembedding), `audit` (`audit(...)`, every "
        "probe metric, no figures, ending after the last block), `full cache` (`run_with_cache` on every hook, all batches kept). Times: medians of "
        f"{p['repeats']} runs, order rotating; 1 thread; torch {torch.__version__}. `peak +MiB`: peak RSS of a second, "
        "warm run above the RSS before it, each way in a fresh spawned process (`/proc/self/clear_refs` + `VmHWM`); "
        "`of cache`: that peak over the full cache's (`n/a`: not timed or not measured in this preset).\n\n"
        + "\n\n".join(blocks)
    )
    return {"rows": rows, "details": details, "profiles": profiles, "raw": raw}


def section_scaling(p: dict, profile: str) -> dict:
    import torch

    import bench_scaling
    import profiling
    from sinkscope.pretrained_analysis.audit import AuditConfig, audit
    from sinkscope.pretrained_analysis.loading import LoadSpec, load_model
    from sinkscope.pretrained_analysis.prompts import PromptSpec, load_prompt_set

    with tempfile.TemporaryDirectory(prefix="bench_scaling_") as model_dir:
        n_params = bench_scaling.build_model(model_dir)
        loaded = load_model(LoadSpec(model_dir, device="cpu"), progress=False)
        log(f"[scaling] prompts {p['prompts']} at T={p['fixed_tokens']}, {p['repeats']} repeats")
        by_prompts = bench_scaling.sweep(loaded, "prompts", p["prompts"], p["fixed_tokens"], p["repeats"])
        log(f"[scaling] T {p['tokens']} at {p['fixed_prompts']} prompts, {p['repeats']} repeats")
        by_tokens = bench_scaling.sweep(loaded, "tokens", p["tokens"], p["fixed_prompts"], p["repeats"])
        rows, profiles, notes = [], [], []
        for result in (by_prompts, by_tokens):
            low, high = result["expected"]
            exponent = result["audit_exponent"]
            what = "number of prompts" if result["axis"] == "prompts" else "tokens per prompt T"
            ok = low <= exponent <= high
            rows.append(
                target_row(
                    f"scaling: audit time exponent vs {what}", exponent, f"{low:g}..{high:g}", ok, kind="expectation"
                )
            )
            notes.append(bench_scaling.explain(result))
            if profile == "always" or (profile == "missed" and not ok):
                sizes = result["sizes"]
                small, large = min(sizes), max(sizes)

                def at(size: int, result: dict = result) -> Callable[[], object]:
                    n, t = (size, result["fixed"]) if result["axis"] == "prompts" else (result["fixed"], size)
                    prompt_set = load_prompt_set(PromptSpec(source="random", n_prompts=n, max_len=t))
                    config = AuditConfig(batch_size=bench_scaling.BATCH_SIZE, n_examples=0)
                    return lambda: audit(loaded, prompt_set, config, progress=False)

                log(f"[scaling] profiling the audit at {result['axis']}={large} vs {small}")
                found = profiling.compare(
                    f"scaling vs {what}: audit at {large} vs at {small}",
                    f"{result['axis']}={large}",
                    at(large),
                    f"{result['axis']}={small}",
                    at(small),
                )
                found["summary"] = (
                    f"Going from {small} to {large} multiplies the size by {large / small:g}. "
                    f"{bench_scaling.explain(result)[0].upper()}{bench_scaling.explain(result)[1:]} " + found["summary"]
                )
                profiles.append(found)
    details = (
        f"Random GPT-2, {bench_scaling.N_LAYERS} layers x {bench_scaling.N_HEADS} heads, d_model {bench_scaling.D_MODEL} "
        f"({n_params / 1e6:.1f}M parameters, vocabulary ~300), batches of {bench_scaling.BATCH_SIZE}; `audit` (no figures) "
        f"and the bare bridge forward at each point, medians of {p['repeats']} runs; 1 thread; torch {torch.__version__}. "
        "Exponent: least-squares slope of log time on log size.\n\n"
        f"{code_block(bench_scaling.format_sweep(by_prompts))}\n\n{code_block(bench_scaling.format_sweep(by_tokens))}\n\n"
        + "\n".join(f"- {note}" for note in notes)
    )
    return {"rows": rows, "details": details, "profiles": profiles, "raw": [by_prompts, by_tokens]}


LOAD_TARGET = 0.8


def section_load(p: dict, profile: str) -> dict:
    import torch

    import bench_under_load

    rows_found = bench_under_load.bench(p["cases"], p["steps"], p["hogs"])
    rows = [
        target_row(
            f"toy training {r.case} beside {p['hogs']} CPU hog: {r.way}, loaded / idle steps per second",
            r.ratio,
            f">= {LOAD_TARGET}",
            r.ratio >= LOAD_TARGET,
        )
        for r in rows_found
        if r.way != "api, 2 threads"
    ]
    budgets = ", ".join(f"{case}: {p['steps'][case]} steps" for case in p["cases"])
    details = (
        f"The same training run (softmax, {budgets}; a fresh run "
        f"directory each time) on the idle machine and beside {p['hogs']} busy-looping process, steps over the trainer's "
        "own wall time. `api, 1 thread` is `sinkscope.toy.train.train` with sinkscope's one-thread policy, `cli` is `sinkscope toy "
        "train` in a subprocess (same policy), `api, 2 threads` is `train(..., threads=2)`, torch's default on this "
        f"machine and what training used before: the baseline. torch {torch.__version__}. The 2-thread row has no "
        "target; it shows why the policy exists.\n\n"
        f"{bench_under_load.format_table(rows_found, p['hogs'])}"
    )
    return {
        "rows": rows,
        "details": details,
        "profiles": [],
        "raw": [{**vars(r), "ratio": r.ratio} for r in rows_found],
    }


EXECUTOR_OVERHEAD_TARGET = 1.5


def section_executors(p: dict, profile: str) -> dict:
    import bench_executors

    sweep = bench_executors.bench_default_sweep(p["workers"])
    batch = bench_executors.bench(p["units"], p["seconds"], p["workers"], p["repeats"])
    rows = [
        target_row(
            f"default toy sweep ({sweep['models']} models, {sweep['workers']} workers): Ray / local executor wall",
            sweep["ratio"],
            f"<= {EXECUTOR_OVERHEAD_TARGET}",
            sweep["ratio"] <= EXECUTOR_OVERHEAD_TARGET,
        )
    ]
    details = (
        f"The default `toy sweep` grid run twice in fresh directories, `--executor local` ({sweep['local_s']:.1f} s) "
        f"and `--executor ray` on a local Ray instance started for the run ({sweep['ray_s']:.1f} s, its start-up "
        "and shutdown included), with identical models. Then a batch of small synthetic units "
        f"(`bench_executors.py`):\n\n```text\n{bench_executors.format_table(batch)}\n```"
    )
    return {"rows": rows, "details": details, "profiles": [], "raw": [sweep, batch]}


SECTION_FUNCTIONS: dict[str, Callable[[dict, str], dict]] = {
    "toy": section_toy,
    "seeds": section_seeds,
    "audit": section_audit,
    "scaling": section_scaling,
    "load": section_load,
    "executors": section_executors,
}
SECTION_TITLES = {
    "toy": "Toy training: hooked vs plain PyTorch",
    "seeds": "K=8 seeds: vectorised vs sequential",
    "audit": "Audit: probes vs bare forward, peak memory vs full cache",
    "scaling": "Scaling: audit time vs prompts and vs T",
    "load": "Toy training under load: beside a CPU hog vs idle",
    "executors": "Units on Ray: the Ray executor vs the local one",
}


def run_section_here(name: str, preset: str, profile: str, out: Path) -> int:
    """The child side: run one section, write its dict (or the error) as JSON to ``out``."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(BENCH_DIR))
    import torch

    torch.set_num_threads(1)
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()
    except ImportError:
        pass
    try:
        result = SECTION_FUNCTIONS[name](PRESETS[preset][name], profile)
        code = 0
    except Exception as error:  # recorded in RESULTS.md instead of stopping the suite
        traceback.print_exc()
        result = {"error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc()[-3000:]}
        code = 1
    out.write_text(json.dumps(result, default=str, allow_nan=True))
    log(f"[{name}] result written")
    return code


def run_section(name: str, preset: str, profile: str) -> dict:
    """The parent side: run one section in a subprocess; returns its dict plus ``seconds``."""
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_HUB_DISABLE_PROGRESS_BARS="1",
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
    )
    with tempfile.TemporaryDirectory(prefix=f"run_all_{name}_") as tmp:
        out = Path(tmp) / "section.json"
        command = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--section",
            name,
            "--section-out",
            str(out),
            "--profile",
            profile,
        ]
        if preset == "quick":
            command.append("--quick")
        started = time.perf_counter()
        try:
            completed = subprocess.run(command, env=env, cwd=ROOT, timeout=SECTION_TIMEOUT_S)
            code: int | str = completed.returncode
        except subprocess.TimeoutExpired:
            code = f"timeout after {SECTION_TIMEOUT_S} s"
        seconds = time.perf_counter() - started
        log(f"[{name}] process ended")
        if out.exists():
            result = json.loads(out.read_text())
        else:
            result = {"error": f"the section's process ended without a result (exit {code})"}
    result["seconds"] = seconds
    return result


# --------------------------------------------------------------------------- report


def machine_info() -> dict:
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    models = re.findall(r"^model name\s*:\s*(.+)$", cpuinfo, flags=re.M)
    meminfo = Path("/proc/meminfo").read_text() if Path("/proc/meminfo").exists() else ""
    total = re.search(r"^MemTotal:\s+(\d+) kB", meminfo, flags=re.M)
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    return {
        "cpu": models[0].strip() if models else platform.processor() or "unknown",
        "cores": os.cpu_count(),
        "usable_cores": usable,
        "ram_gib": int(total.group(1)) / 2**20 if total else None,
        "os": f"{platform.system()} {platform.release()}",
    }


def versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for package in VERSION_PACKAGES:
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            found[package] = "not installed"
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10
        )
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True, timeout=10)
        if commit.returncode == 0:
            found["git commit"] = commit.stdout.strip() + (" (uncommitted changes)" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return found


def _value(row: dict) -> str:
    value = row["value"]
    if value is None:
        return "-"
    return f"{value:.3f}x" if row["target"].endswith("x") else f"{value:.3f}"  # 3 decimals: 0.797 is not 0.80


def render(
    preset: str,
    machine: dict,
    found_versions: dict,
    loads: tuple,
    started: dt.datetime,
    wall_s: float,
    sections: dict[str, dict],
) -> str:
    lines = [
        "# sinkscope benchmark results",
        "",
        f"Written by `python benchmarks/run_all.py{' --quick' if preset == 'quick' else ''}` "
        f"({preset} preset) on {started.strftime('%Y-%m-%d %H:%M UTC')}; the suite took {wall_s / 60:.1f} minutes.",
        "Every comparison runs on one CPU thread (`torch.set_num_threads(1)`); times are medians of several runs.",
        "",
        "## Machine and versions",
        "",
        "| | |",
        "|---|---|",
        f"| CPU | {machine['cpu']} |",
        f"| cores | {machine['cores']} ({machine['usable_cores']} usable) |",
        f"| RAM | {machine['ram_gib']:.1f} GiB |" if machine["ram_gib"] else "| RAM | unknown |",
        f"| OS | {machine['os']} |",
        f"| load average (1 min) at start / end | {loads[0]:.2f} / {loads[1]:.2f} |",
    ]
    lines += [f"| {name} | {version} |" for name, version in found_versions.items()]
    if loads[0] > 0.5 or loads[1] > 1.5:  # the suite itself adds about 1 to the load at the end
        lines += [
            "",
            (
                f"Other processes were running (load average {loads[0]:.1f} before the suite, {loads[1]:.1f} at its "
                f"end, on {machine['usable_cores']} cores; the suite itself adds about 1), so the figures are "
                "noisier than on a quiet machine."
            ),
        ]
    lines += ["", "## Summary", "", "| benchmark | measured | target | verdict |", "|---|---:|---|---|"]
    for name, section in sections.items():
        if "error" in section:
            error = section["error"][:200].replace("|", "\\|").replace("\n", " ")
            lines.append(f"| {SECTION_TITLES[name]} | - | - | FAILED: {error} |")
            continue
        for row in section["rows"]:
            lines.append(f"| {row['label']} | {_value(row)} | {row['target']} | {row['status']} |")
    missed = [
        (name, row)
        for name, section in sections.items()
        if "error" not in section
        for row in section["rows"]
        if row["ok"] is False
    ]
    for name, section in sections.items():
        lines += ["", f"## {SECTION_TITLES[name]}", "", f"Section time: {section['seconds']:.0f} s.", ""]
        if "error" in section:
            lines += [f"The section failed: `{section['error']}`", "", code_block(section.get("traceback", "").strip())]
            continue
        lines.append(section["details"])
    lines += ["", "## Targets not met, with profiles", ""]
    failed = [SECTION_TITLES[name] for name, section in sections.items() if "error" in section]
    if not missed:
        lines.append(
            "None: every target measured was met."
            if not failed
            else f"No target was missed in the sections that ran; failed (see above): {', '.join(failed)}."
        )
    for name, section in sections.items():
        if "error" in section:
            continue
        rows = [row for row in section["rows"] if row["ok"] is False]
        if not rows and not section.get("profiles"):
            continue
        if lines[-1]:
            lines.append("")
        lines += [f"### {SECTION_TITLES[name]}" + ("" if rows else " (profiled on request; targets met)"), ""]
        lines += [f"- {row['label']}: {_value(row)} against {row['target']} ({row['status']})." for row in rows]
        if rows and not section.get("profiles"):
            lines.append("\n(No profile was captured: run with `--profile missed` or `--profile always`.)")
        for found in section.get("profiles", []):
            lines += ["", f"#### Profile: {found['title']}", "", found["summary"], ""]
            for table in found["tables"]:
                lines += [table, ""]
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats and sizes (about 4 minutes on 2 cores)")
    parser.add_argument(
        "--out", type=Path, default=BENCH_DIR / "RESULTS.md", help="the markdown report (default benchmarks/RESULTS.md)"
    )
    parser.add_argument(
        "--only", default=",".join(SECTIONS), help=f"comma-separated sections among {', '.join(SECTIONS)} (default all)"
    )
    parser.add_argument(
        "--profile",
        choices=("missed", "always", "never"),
        default="missed",
        help="profile the slow path when a target is missed (default), always, or never",
    )
    parser.add_argument(
        "--json", type=Path, default=None, metavar="PATH", help="also write every section's raw results as JSON"
    )
    parser.add_argument("--section", choices=SECTIONS, help=argparse.SUPPRESS)  # internal: run one section (child)
    parser.add_argument("--section-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    preset = "quick" if args.quick else "full"
    if args.section is not None:
        if args.section_out is None:
            parser.error("--section needs --section-out")
        code = run_section_here(args.section, preset, args.profile, args.section_out)
        # The result is on disk; skip the interpreter's teardown, which took from seconds to
        # minutes after a section had run torch.profiler on a busy machine.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    chosen = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = [name for name in chosen if name not in SECTIONS]
    if unknown or not chosen:
        parser.error(f"--only takes sections among {', '.join(SECTIONS)}, got {args.only!r}")
    out = args.out if args.out.is_absolute() else Path.cwd() / args.out
    if out.exists() and out.is_dir():
        parser.error(f"--out {out} is a directory; pass a file path such as benchmarks/RESULTS.md")

    started = dt.datetime.now(dt.timezone.utc)
    wall_start = time.perf_counter()
    load_start = os.getloadavg()[0]
    machine, found_versions = machine_info(), versions()
    sections: dict[str, dict] = {}
    for name in [name for name in SECTIONS if name in chosen]:
        log(f"== {name} ({preset}) ==")
        sections[name] = run_section(name, preset, args.profile)
        status = "failed: " + sections[name]["error"] if "error" in sections[name] else "done"
        log(f"== {name}: {status} in {sections[name]['seconds']:.0f} s ==")
    wall_s = time.perf_counter() - wall_start
    loads = (load_start, os.getloadavg()[0])
    text = render(preset, machine, found_versions, loads, started, wall_s, sections)
    print(text)
    sys.path.insert(0, str(ROOT))
    from sinkscope.infra.atomic_io import atomic_write_json, atomic_write_text

    atomic_write_text(out, text)
    log(f"wrote {out}")
    if args.json is not None:
        atomic_write_json(
            args.json,
            {
                "preset": preset,
                "started": started.isoformat(),
                "wall_s": wall_s,
                "machine": machine,
                "versions": found_versions,
                "load_average": loads,
                "presets": PRESETS[preset],
                "sections": {name: {k: v for k, v in s.items()} for name, s in sections.items()},
            },
        )
        log(f"wrote {args.json}")
    failed = [name for name, section in sections.items() if "error" in section]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
