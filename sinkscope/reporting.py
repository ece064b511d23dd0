"""``report(result_dir)``: any sinkscope result directory as ``report.html`` (one
self-contained page) and ``report.md``.

The kind of directory is recognised by its files (``sinkscope.toy.report.REPORT_KINDS``,
``sinkscope.pretrained_analysis.report.REPORT_KINDS``, ``sinkscope.probes.mechanism_report.REPORT_KINDS``); the kind's builder makes the document and
``sinkscope.reports.write`` renders and writes it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from sinkscope.infra.arguments import check_argument, check_path
from sinkscope.infra.errors import InputError
from sinkscope.infra.provenance import PROVENANCE_FILE, package_version
from sinkscope.pretrained_analysis.report import REPORT_KINDS as PRETRAINED_KINDS
from sinkscope.probes.circuit_report import REPORT_KINDS as CIRCUIT_KINDS
from sinkscope.probes.mechanism_report import REPORT_KINDS as MECHANISM_KINDS
from sinkscope.probes.window_report import REPORT_KINDS as WINDOW_KINDS
from sinkscope.reports.write import ReportKind, write_report
from sinkscope.toy.report import REPORT_KINDS as TOY_KINDS
from sinkscope.toy.run_dir import CONFIG_FILE, METRICS_FILE, RESULT_FILE
from sinkscope.toy.source_run import SOURCE_RUN_FILE

REPORT_KINDS: tuple[ReportKind, ...] = PRETRAINED_KINDS + TOY_KINDS + MECHANISM_KINDS + WINDOW_KINDS + CIRCUIT_KINDS


@dataclass(frozen=True)
class ReportResult:
    """What ``report`` wrote. findings: the summary sentences (also at the top of both
    pages); figures: the figures the report drew itself (in ``report_figures/``)."""

    kind: str
    source: Path
    html: Path
    markdown: Path
    figures: tuple[Path, ...]
    findings: tuple[str, ...]


def detect_kind(result_dir: Path) -> ReportKind:
    """The kind of result directory ``result_dir`` is; a one-line error naming the fix if none."""
    if not result_dir.is_dir():
        raise InputError(f"{result_dir} is not a directory; pass a directory written by sinkscope")
    for marker in sorted({marker for kind in REPORT_KINDS for marker in kind.markers}):
        path = result_dir / marker
        if os.path.lexists(path) and not path.is_file():  # a FIFO or folder must not demote the kind
            raise InputError(f"{path} is not a regular file; restore it or regenerate the result")
    for kind in REPORT_KINDS:
        if kind.matches(result_dir):
            return kind
    if (result_dir / CONFIG_FILE).is_file() and (result_dir / RESULT_FILE).is_file():
        probed = result_dir / "probe"  # where `toy probe` writes by default
        if probed.is_dir() and any(kind.matches(probed) for kind in REPORT_KINDS):
            raise InputError(
                f"{result_dir} is a toy training run, probed into {probed}; report on that: `sinkscope report {probed}`"
            )
        raise InputError(
            f"{result_dir} is a toy training run; probe it first with `sinkscope toy probe {result_dir}` "
            f"and report on its probe directory"
        )
    expected = ", ".join(" + ".join(kind.markers) + f" ({kind.name})" for kind in REPORT_KINDS)
    raise InputError(f"{result_dir} holds no sinkscope result; expected one of: {expected}")


# the files by which a directory is some sinkscope result (or a toy run): a report beside them
# would read as theirs
RESULT_FILES: tuple[str, ...] = tuple(
    sorted(
        {marker for kind in REPORT_KINDS for marker in kind.markers}
        | {CONFIG_FILE, RESULT_FILE, METRICS_FILE, PROVENANCE_FILE, SOURCE_RUN_FILE}
    )
)


def refuse_another_result(out_dir: Path, source: Path) -> None:
    """A report goes into its result's own directory or one that holds no result: written
    beside another result, its page would describe that directory's files as if they were
    the ones it reports."""
    if not out_dir.is_dir() or out_dir.resolve() == source.resolve():
        return
    held = [name for name in RESULT_FILES if os.path.lexists(out_dir / name)]
    if held:
        raise InputError(
            f"{out_dir} holds another result ({', '.join(held)}), which a report of {source} there would sit "
            "beside as if it described it; choose an empty or new output directory for the report",
            field="out_dir",
        )


def report(
    result_dir: str | os.PathLike, out: str | os.PathLike | None = None, overwrite: bool = False
) -> ReportResult:
    """Write ``report.html`` and ``report.md`` for ``result_dir`` into ``out`` (default:
    ``result_dir`` itself). An existing report is refused unless ``overwrite``."""
    check_path(result_dir, "result_dir", "a result directory (str or pathlib.Path)")
    if out is not None:
        check_path(out, "out", "a directory path (str or pathlib.Path) or None")
    check_argument(overwrite, bool, "overwrite", "True or False")
    source = Path(result_dir)
    kind = detect_kind(source)
    out_dir = source if out is None else Path(out)
    refuse_another_result(out_dir, source)
    footer = f"Generated by sinkscope {package_version('sinkscope')} (`sinkscope report`) from {source}."

    document, files = write_report(
        lambda figure_dir: kind.build(source, figure_dir), out_dir, overwrite, footer, inputs=[source]
    )
    return ReportResult(kind.name, source, files.html, files.markdown, files.figures, document.findings)
