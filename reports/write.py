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
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from sinkscope.infra.atomic_io import atomic_directory, atomic_path, inside, locked_directory
from sinkscope.infra.errors import InputError
from sinkscope.infra.output_files import OutputFiles
from sinkscope.reports.document import ReportDocument
from sinkscope.reports.html import render_html
from sinkscope.reports.markdown import render_markdown

REPORT_HTML = "report.html"
REPORT_MD = "report.md"
FIGURE_DIR = "report_figures"
# every entry write_report puts into its output directory (often the result directory itself)
REPORT_OUTPUTS = OutputFiles((REPORT_HTML, REPORT_MD, FIGURE_DIR))


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


def _refuse_existing_report(out_dir: Path, overwrite: bool, inputs: Sequence[Path] = ()) -> None:
    """Every target checked before anything is written: a page that is a directory is never
    replaced (it is not a report), nor is anything without ``overwrite``; the folder
    ``report_figures`` (replaced whole) must not hold the result it reports."""
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError(f"{out_dir} is a file, not a directory; choose a directory for the report", field="out_dir")
    for name in (REPORT_HTML, REPORT_MD):
        if (out_dir / name).is_dir():
            raise InputError(
                f"{out_dir / name} is a directory, not a report page; remove it or choose another output directory",
                field="out_dir",
            )
    for name in (REPORT_HTML, REPORT_MD, FIGURE_DIR):
        if os.path.lexists(out_dir / name) and not overwrite:
            raise InputError(
                f"{out_dir / name} exists; overwrite the report or choose another output directory", field="overwrite"
            )
    for item in inputs:
        if inside(item, out_dir / FIGURE_DIR):
            raise InputError(
                f"{out_dir / FIGURE_DIR}, which the report replaces, holds the result {item}; "
                "choose another output directory",
                field="out_dir",
            )


def _clear_figure_folder(folder: Path) -> None:
    """Remove an old ``report_figures`` that is not a real folder (a link, never followed out
    of the directory, or a file), or a folder when the new report has no figures."""
    if folder.is_symlink() or (os.path.lexists(folder) and not folder.is_dir()):
        folder.unlink()
    elif folder.is_dir():
        shutil.rmtree(folder)


def write_report(
    build: Callable[[Path], ReportDocument],
    out_dir: str | os.PathLike,
    overwrite: bool = False,
    footer: str = "",
    inputs: Sequence[str | os.PathLike] = (),
) -> tuple[ReportDocument, ReportFiles]:
    """``build(figure_dir)`` makes the document (drawing any new figures into
    ``figure_dir``); the rendered pages go to ``out_dir``. ``inputs``: the result
    directories the report reads, which ``report_figures`` must not hold."""
    out_dir = Path(out_dir)
    sources = [Path(item) for item in inputs]
    _refuse_existing_report(out_dir, overwrite, sources)
    with locked_directory(out_dir):  # two reports into one directory: the second is refused
        _refuse_existing_report(out_dir, overwrite, sources)  # again: another report may have landed meanwhile
        return _write_report_locked(build, out_dir, footer)


def _write_report_locked(
    build: Callable[[Path], ReportDocument], out_dir: Path, footer: str
) -> tuple[ReportDocument, ReportFiles]:
    with tempfile.TemporaryDirectory(prefix="sinkscope-report-") as staging_name:
        staging = Path(staging_name)
        document = build(staging)

        real_staging = staging.resolve()

        def link(path: Path) -> str:  # path: a figure checked and resolved (Figure.real_path)
            if path.is_relative_to(real_staging):
                return f"{FIGURE_DIR}/{path.relative_to(real_staging).as_posix()}"
            return Path(os.path.relpath(path, out_dir.resolve())).as_posix()

        texts = {REPORT_HTML: render_html(document, footer), REPORT_MD: render_markdown(document, link, footer)}
        generated = sorted(path for path in staging.iterdir() if path.is_file())
        out_dir.mkdir(parents=True, exist_ok=True)
        _put_in_place(out_dir, texts, generated)
    figures = tuple(out_dir / FIGURE_DIR / path.name for path in generated)
    return document, ReportFiles(out_dir / REPORT_HTML, out_dir / REPORT_MD, figures)


def _put_in_place(out_dir: Path, texts: dict[str, str], generated: list[Path]) -> None:
    """Both pages are written in full beside their names first, so a full disk or an
    interrupt leaves the old report as it was; then the figures are swapped in and the
    pages renamed over the old ones, HTML last (its presence means complete)."""
    with ExitStack() as pages:
        for name, text in texts.items():  # entered HTML first, so it is renamed last
            tmp = pages.enter_context(atomic_path(out_dir / name))
            tmp.write_text(text, encoding="utf-8")
        folder = out_dir / FIGURE_DIR
        if not generated or folder.is_symlink() or (os.path.lexists(folder) and not folder.is_dir()):
            _clear_figure_folder(folder)  # a stale folder, or what no folder swap may follow or replace
        if generated:
            with atomic_directory(folder) as figure_dir:
                for path in generated:
                    shutil.copyfile(path, figure_dir / path.name)
