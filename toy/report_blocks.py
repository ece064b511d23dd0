"""Report pieces shared by the toy reports: the task block, a run's configuration and
figures, the trade-off's findings and blocks."""

from __future__ import annotations

from pathlib import Path, PurePath

from sinkscope.infra.provenance import read_provenance
from sinkscope.probes.report_sections import (
    provenance_block,
)
from sinkscope.reports.document import (
    Block,
    Figure,
    KeyValues,
    Paragraph,
    Section,
    config_block,
    config_value,
    result_figures,
    sig,
)
from sinkscope.toy.evaluate import MEAN_FIGURE, STD_FIGURE, ToyDefaultState
from sinkscope.toy.model import ToyModelConfig
from sinkscope.toy.paper_reference import PAPER_CITATION
from sinkscope.toy.run_dir import TrainConfig
from sinkscope.toy.source_run import SOURCE_RUN_FILE, SourceRun
from sinkscope.toy.tables import TRADEOFF_TABLE
from sinkscope.toy.task import TaskConfig
from sinkscope.toy.tradeoff import (
    CONSTRUCTION_SERIES,
    RELU_SERIES,
    RUN_SERIES_SUFFIX,
    TRADEOFF_FIGURE,
    TradeoffResult,
    plot_tradeoff,
)

WHAT = "default-position MSE"


RUN_FIGURES = (
    (MEAN_FIGURE, "mean attention over the test sequences"),
    (STD_FIGURE, "std of attention over the test sequences"),
)


def existing_figures(root: Path, names_and_captions: list[tuple[str, str]]) -> list[Block]:
    """The figures of the result directory ``root`` that exist, each checked to be a PNG
    inside it; a line naming each missing one (a report never fails on a deleted PNG)."""
    return result_figures(root, names_and_captions, "re-run the command that wrote it")


def sinks_subject(state: ToyDefaultState) -> str:
    n = len(state.sink_heads)
    return "the sink head" if n == 1 else f"all {n} sink heads"


def citation_section() -> Section:
    """The paper the toy task comes from: the last section of every toy report."""
    return Section("Reference", (Paragraph(f"The toy task and the claims checked here are from {PAPER_CITATION}."),))


def model_block(caption: str, model: ToyModelConfig) -> KeyValues:
    """A toy model's settings, each unset one shown as the default it takes."""
    return config_block(
        caption,
        model,
        {
            "d_head": ("d_head", _or_default(model.d_head, f"d_model = {model.head_width}")),
            "residual": (
                "residual",
                _or_default(model.residual, f"{'on' if model.has_residual else 'off'}: the paper's, off for 1 layer"),
            ),
            "d_mlp": ("d_mlp", _or_default(model.d_mlp, f"4 x d_model = {model.mlp_width}")),
        },
    )


def training_block(caption: str, train: TrainConfig, model: ToyModelConfig) -> KeyValues:
    """A run's optimisation settings, an unset learning rate shown as the one it used."""
    return config_block(
        caption, train, {"lr": ("lr", _or_default(train.lr, f"{train.learning_rate(model):g} for this depth"))}
    )


def _or_default(value: object, default: str) -> str:
    return config_value(value) if value is not None else f"default ({default})"


def task_block(task: TaskConfig) -> KeyValues:
    """The task's settings, its trigger positions counted from 1 as the figures count
    them (the config's fields are 0-indexed, and say so)."""

    def position(label: str, field: str, value: int) -> tuple[str, str]:
        return (f"{label} (1-indexed)", f"{value + 1} ({field} {value}, 0-indexed)")

    return config_block(
        "Task",
        task,
        {
            "train_trigger_min": position(
                "first training trigger position", "train_trigger_min", task.train_trigger_min
            ),
            "train_trigger_max": position("last training trigger position", "train_trigger_max", task.trigger_max),
            "eval_trigger_position": position(
                "eval trigger position", "eval_trigger_position", task.eval_trigger_position
            ),
        },
    )


def tradeoff_findings(result: TradeoffResult) -> list[str]:
    findings = [f"Note: {note}." for note in result.notes]  # e.g. a run measured although unfinished
    series = result.series
    construction = series.get(CONSTRUCTION_SERIES, ())
    if construction:
        low, high = construction[0], construction[-1]
        findings.append(
            f"Trade-off (Theorem 1): the softmax construction's default-position MSE falls from {sig(low.default_mse)} "
            f"at BOS mass {low.anchor_mass_default:.3f} (scale {low.scale:g}) to {sig(high.default_mse)} at BOS mass "
            f"{high.anchor_mass_default:.4f} (scale {high.scale:g}): small error only with the sink."
        )
    for point in series.get(RELU_SERIES, ()):
        findings.append(
            f"The exact ReLU construction reaches default-position MSE {sig(point.default_mse)} with BOS "
            f"mass {point.anchor_mass_default:.3f}: no sink needed."
        )
    for name, points in result.series.items():
        trained = [p for p in points if p.scale == 1.0]
        if name.endswith(RUN_SERIES_SUFFIX) and trained:
            run = name.removesuffix(RUN_SERIES_SUFFIX)
            findings.append(
                f"{run} as trained: BOS mass {trained[0].anchor_mass_default:.4f}, default-position MSE "
                f"{sig(trained[0].default_mse)}."
            )
    return findings


def tradeoff_blocks(result: TradeoffResult, figure_dir: Path) -> list[Block]:
    """The trade-off figure, drawn again from the result's points into the report's
    ``figure_dir`` (so an older result gets today's labelled figure), and its table."""
    path = plot_tradeoff({name: list(points) for name, points in result.series.items()}, figure_dir / TRADEOFF_FIGURE)
    return [
        Figure(path, "default-position MSE against BOS mass at default queries", figure_dir),
        TRADEOFF_TABLE.table([(name, point) for name, points in result.series.items() for point in points]),
    ]


def source_name(source: Path, run: SourceRun | None) -> str:
    """The name of the run a probe or patch directory came from, as the result recorded it:
    its copy's, else (a result written before the copy) the last part of the path its
    provenance records, never looked up; else the directory's own name."""
    if run is not None:
        return run.name
    provenance = read_provenance(source)
    return PurePath(provenance.source).name if provenance is not None and provenance.source else source.name


def predates_copy_note(source: Path, command: str) -> str:
    """The one line a report of a result without ``source_run.json`` says about it."""
    provenance = read_provenance(source)
    run = provenance.source if provenance is not None and provenance.source else "RUN_DIR"
    return (
        f"Note: this result predates the copy of its training run into the result directory (no {SOURCE_RUN_FILE}), "
        "so the run's settings and logged steps are not shown (the run's path may hold another run by now); "
        f"regenerate it with `sinkscope {command} {run} --out {source} --overwrite` to show them."
    )


def source_files_block(run: SourceRun) -> KeyValues:
    """The run's files the result was computed from, each with its sha256 at the time."""
    return KeyValues("Training run's files, as read (sha256)", tuple((f.name, f.sha256) for f in run.files))


def run_configuration(source: Path, blocks: list[Block], run: SourceRun | None, with_training: bool = True) -> Section:
    """``blocks`` (what the result measured), then the training run's model, task and (if
    ``with_training``) optimisation settings as the result copied them, with the sha256 of
    the run's files, then provenance."""
    if run is not None:
        config = run.config
        blocks = [*blocks, model_block("Toy model (training run)", config.model), task_block(config.task)]
        if with_training:
            blocks.append(training_block("Training", config.train, config.model))
        blocks.append(source_files_block(run))
    return Section("Configuration", (*blocks, provenance_block(read_provenance(source))))
