"""Write a report: ``report.html`` (self-contained), ``report.md`` and ``report_figures/``.

The builder draws the figures it generates into a private staging folder; once the
document renders, the figures replace ``report_figures/`` as a whole
(``atomic_directory``) and the two pages are written atomically, HTML last. An existing
report is refused unless ``overwrite``; the check runs before any work.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sinkscope.infra.atomic_io import atomic_directory, atomic_path, locked_directory
from sinkscope.infra.errors import InputError
from sinkscope.reports.document import ReportDocument
from sinkscope.reports.html import render_html
from sinkscope.reports.markdown import render_markdown

REPORT_HTML = "report.html"
REPORT_MD = "report.md"
FIGURE_DIR = "report_figures"


@dataclass(frozen=True)
class ReportKind:
    """A kind of result directory that has a report: ``markers`` are the files that
    identify it; ``build(result_dir, figure_dir)`` makes its document."""

    name: str
    markers: tuple[str, ...]
    build: Callable[[Path, Path], ReportDocument]

    def matches(self, directory: Path) -> bool:
        return all((directory / marker).is_file() for marker in self.markers)


@dataclass(frozen=True)
class ReportFiles:
    html: Path
    markdown: Path
    figures: tuple[Path, ...]


def _refuse_existing_report(out_dir: Path, overwrite: bool) -> None:
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError(f"{out_dir} is a file, not a directory; choose a directory for the report", field="out_dir")
    for name in (REPORT_HTML, REPORT_MD, FIGURE_DIR):
        if (out_dir / name).exists() and not overwrite:
            raise InputError(
                f"{out_dir / name} exists; overwrite the report or choose another output directory", field="overwrite"
            )


def write_report(
    build: Callable[[Path], ReportDocument],
    out_dir: str | os.PathLike,
    overwrite: bool = False,
    footer: str = "",
) -> tuple[ReportDocument, ReportFiles]:
    """``build(figure_dir)`` makes the document (drawing any new figures into
    ``figure_dir``); the rendered pages go to ``out_dir``."""
    out_dir = Path(out_dir)
    _refuse_existing_report(out_dir, overwrite)
    with locked_directory(out_dir):  # two reports into one directory: the second is refused
        return _write_report_locked(build, out_dir, overwrite, footer)


def _write_report_locked(
    build: Callable[[Path], ReportDocument], out_dir: Path, overwrite: bool, footer: str
) -> tuple[ReportDocument, ReportFiles]:
    _refuse_existing_report(out_dir, overwrite)  # again: another report may have landed meanwhile
    with tempfile.TemporaryDirectory(prefix="sinkscope-report-") as staging_name:
        staging = Path(staging_name)
        document = build(staging)

        real_staging = staging.resolve()

        def link(path: Path) -> str:  # path: a figure checked and resolved (Figure.real_path)
            if path.is_relative_to(real_staging):
                return f"{FIGURE_DIR}/{path.relative_to(real_staging).as_posix()}"
            return Path(os.path.relpath(path, out_dir.resolve())).as_posix()

        page = render_html(document, footer)
        markdown = render_markdown(document, link, footer)
        generated = sorted(path for path in staging.iterdir() if path.is_file())
        out_dir.mkdir(parents=True, exist_ok=True)
        if generated:
            with atomic_directory(out_dir / FIGURE_DIR) as figure_dir:
                for path in generated:
                    shutil.copyfile(path, figure_dir / path.name)
        elif (out_dir / FIGURE_DIR).exists():
            shutil.rmtree(out_dir / FIGURE_DIR)  # a stale folder from the replaced report
    for name, text in ((REPORT_MD, markdown), (REPORT_HTML, page)):  # HTML last: its presence means complete
        with atomic_path(out_dir / name) as tmp:
            tmp.write_text(text, encoding="utf-8")
    figures = tuple(out_dir / FIGURE_DIR / path.name for path in generated)
    return document, ReportFiles(out_dir / REPORT_HTML, out_dir / REPORT_MD, figures)
