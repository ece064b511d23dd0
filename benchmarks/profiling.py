"""Profiles the benchmark suite captures when a target is not met, reduced to short tables.

``torch_ops(fn)`` runs ``fn`` under ``torch.profiler`` (CPU) and returns one row per
operator (calls, self and total CPU time, optionally self memory); ``python_functions(fn)``
runs it under ``cProfile`` and returns one row per Python function (calls, own and
cumulative time). ``extra_cost(slow, fast)`` lines up two profiles by name and returns
what the slow run spends beyond the fast one, largest first: the summary a missed target
is explained with. Everything is JSON-serialisable (plain dicts), so a section that runs
in a subprocess can hand its profiles back to ``run_all.py``.
"""

from __future__ import annotations

import cProfile
import os
import pstats
import sys
from collections.abc import Callable

MiB = 2**20
OWN_PACKAGES = ("interp/", "probes/", "toy/", "pretrained_analysis/", "sinkscope/")


def torch_ops(fn: Callable[[], object], repeats: int = 1, memory: bool = False) -> list[dict]:
    """Per-operator CPU time (ms per call of ``fn``), sorted by self time, largest first.
    With ``memory``, ``self_mib``: memory the operator itself allocated (MiB per call of ``fn``)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=memory) as prof:
        for _ in range(repeats):
            fn()
    rows = []
    for event in prof.key_averages():
        row = {
            "name": event.key,
            "calls": event.count / repeats,
            "self_ms": event.self_cpu_time_total / 1000 / repeats,
            "total_ms": event.cpu_time_total / 1000 / repeats,
        }
        if memory:
            row["self_mib"] = event.self_cpu_memory_usage / MiB / repeats
        rows.append(row)
    return sorted(rows, key=lambda r: -r["self_ms"])


def _short_path(path: str) -> str:
    for marker in ("site-packages" + os.sep, "dist-packages" + os.sep):
        if marker in path:
            return path.split(marker, 1)[1]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
    return path[len(root) :] if path.startswith(root) else os.path.basename(path)


def python_functions(fn: Callable[[], object], repeats: int = 1) -> list[dict]:
    """Per-function time under cProfile (ms per call of ``fn``), sorted by own time, largest first."""
    profiler = cProfile.Profile()
    profiler.enable()
    try:
        for _ in range(repeats):
            fn()
    finally:
        profiler.disable()
    stats = pstats.Stats(profiler, stream=sys.stderr)
    rows = []
    for (path, line, name), (_, n_calls, own, cumulative, _) in stats.stats.items():  # type: ignore[attr-defined]
        where = name if path == "~" else f"{_short_path(path)}:{line}({name})"
        rows.append(
            {
                "name": where,
                "calls": n_calls / repeats,
                "self_ms": own * 1000 / repeats,
                "total_ms": cumulative * 1000 / repeats,
            }
        )
    return sorted(rows, key=lambda r: -r["self_ms"])


def own_code(rows: list[dict], total_ms: float, top: int = 6) -> list[dict]:
    """sinkscope's own functions by cumulative time, wrappers of the main work (>= 50% of ``total_ms``)
    left out: which of the project's calls the time goes through."""
    inner = [row for row in rows if row["name"].startswith(OWN_PACKAGES) and row["total_ms"] < 0.5 * total_ms]
    return sorted(inner, key=lambda r: -r["total_ms"])[:top]


def total_self_ms(rows: list[dict]) -> float:
    return sum(row["self_ms"] for row in rows)


def extra_cost(slow: list[dict], fast: list[dict], top: int = 8, key: str = "self_ms") -> list[dict]:
    """Rows of ``slow`` with ``key`` larger than in ``fast`` (matched by name), by the
    difference, largest first; ``calls_extra`` is the difference in calls."""
    fast_by_name = {row["name"]: row for row in fast}
    diffs = []
    for row in slow:
        other = fast_by_name.get(row["name"], {"calls": 0.0, key: 0.0})
        delta = row[key] - other.get(key, 0.0)
        if delta > 0:
            diffs.append({"name": row["name"], "extra": delta, "calls_extra": row["calls"] - other["calls"]})
    return sorted(diffs, key=lambda r: -r["extra"])[:top]


def _cell(text: str, width: int = 90) -> str:
    text = text.replace("|", "\\|").replace("\n", " ")
    return text if len(text) <= width else text[: width - 3] + "..."


def rows_table(rows: list[dict], top: int = 10, memory: bool = False, total_ms: float | None = None) -> str:
    """A markdown table of the first ``top`` rows of ``torch_ops`` or ``python_functions``;
    ``self %`` is of ``total_ms`` (default: the rows' own total)."""
    total = (total_self_ms(rows) if total_ms is None else total_ms) or 1.0
    header = "| name | calls | self ms | self % | total ms |" + (" self MiB |" if memory else "")
    rule = "|---|---:|---:|---:|---:|" + ("---:|" if memory else "")
    lines = [header, rule]
    for row in rows[:top]:
        line = (
            f"| `{_cell(row['name'])}` | {row['calls']:.0f} | {row['self_ms']:.2f} | "
            f"{100 * row['self_ms'] / total:.1f} | {row['total_ms']:.2f} |"
        )
        if memory:
            line += f" {row.get('self_mib', 0.0):.1f} |"
        lines.append(line)
    return "\n".join(lines)


def extra_table(diffs: list[dict], unit: str = "ms") -> str:
    lines = [f"| name | extra {unit} | extra calls |", "|---|---:|---:|"]
    lines += [f"| `{_cell(d['name'])}` | {d['extra']:.2f} | {d['calls_extra']:+.0f} |" for d in diffs]
    return "\n".join(lines)


def compare(
    title: str,
    slow_label: str,
    slow: Callable[[], object],
    fast_label: str,
    fast: Callable[[], object],
    repeats: int = 1,
    top: int = 8,
) -> dict:
    """Profile ``slow`` and ``fast`` with both profilers and summarise where the slow one's
    extra time goes. Operators are matched by name; Python functions too, and those that
    only the slow run calls (its own code path, e.g. hook functions) are listed apart.
    Returns ``{"title", "summary", "tables"}`` (markdown strings)."""
    slow_ops, fast_ops = torch_ops(slow, repeats), torch_ops(fast, repeats)
    slow_py, fast_py = python_functions(slow, repeats), python_functions(fast, repeats)
    fast_names = {row["name"] for row in fast_py}
    extra_ops = extra_cost(slow_ops, fast_ops, top)
    extra_shared = extra_cost([row for row in slow_py if row["name"] in fast_names], fast_py, top)
    slow_only = [row for row in slow_py if row["name"] not in fast_names][:top]
    slow_total, fast_total = total_self_ms(slow_ops), total_self_ms(fast_ops)
    slow_py_total, fast_py_total = total_self_ms(slow_py), total_self_ms(fast_py)
    slow_own = own_code([row for row in slow_py if row["name"] not in fast_names], slow_py_total)

    def listing(rows: list[dict], key: str) -> str:
        return (
            ", ".join(f"`{row['name']}` {'+' if key == 'extra' else ''}{row[key]:.1f} ms" for row in rows[:3]) or "none"
        )

    summary = (
        f"torch.profiler: {slow_label} {slow_total:.1f} ms of operator self time per run vs {fast_label} "
        f"{fast_total:.1f} ms ({slow_total - fast_total:+.1f} ms); largest extra operators: {listing(extra_ops, 'extra')}. "
        f"cProfile (its own overhead included): {slow_py_total:.1f} vs {fast_py_total:.1f} ms "
        f"({slow_py_total - fast_py_total:+.1f} ms); functions both run, largest extra: {listing(extra_shared, 'extra')}; "
        f"functions only {slow_label} runs, largest own time: {listing(slow_only, 'self_ms')}"
        + (
            f"; sinkscope calls only {slow_label} makes, by cumulative time: {listing(slow_own, 'total_ms')}."
            if slow_own
            else "."
        )
    )
    tables = [
        (f"Top operators, {slow_label} (torch.profiler, per run)", rows_table(slow_ops, top)),
        (f"Top operators, {fast_label} (torch.profiler, per run)", rows_table(fast_ops, top)),
        (f"Operators where {slow_label} spends more than {fast_label}", extra_table(extra_ops) if extra_ops else ""),
        (
            f"Python functions both run, where {slow_label} spends more (cProfile own time)",
            extra_table(extra_shared) if extra_shared else "",
        ),
        (
            f"Python functions only {slow_label} runs (cProfile, per run)",
            rows_table(slow_only, top, total_ms=slow_py_total) if slow_only else "",
        ),
        (
            f"sinkscope functions only {slow_label} calls, by cumulative time (cProfile, per run)",
            rows_table(slow_own, top, total_ms=slow_py_total) if slow_own else "",
        ),
        (f"Top Python functions, {fast_label} (cProfile, per run)", rows_table(fast_py, top)),
    ]
    tables = [f"{caption}:\n\n{table}" for caption, table in tables if table]
    return {"title": title, "summary": summary, "tables": tables}


def memory_profile(title: str, label: str, fn: Callable[[], object], top: int = 8) -> dict:
    """Which operators allocate the most in one run of ``fn`` (torch.profiler, profile_memory)."""
    rows = torch_ops(fn, 1, memory=True)
    by_memory = sorted(rows, key=lambda r: -r.get("self_mib", 0.0))
    allocated = sum(max(r.get("self_mib", 0.0), 0.0) for r in rows)
    biggest = ", ".join(f"`{r['name']}` {r['self_mib']:.0f} MiB" for r in by_memory[:3])
    summary = (
        f"torch.profiler (profile_memory): {label} allocates {allocated:.0f} MiB in total over one run "
        f"(freed memory is reused, so the peak is smaller); largest allocators: {biggest}."
    )
    return {
        "title": title,
        "summary": summary,
        "tables": [f"Operators by memory allocated, {label}:\n\n{rows_table(by_memory, top, memory=True)}"],
    }
