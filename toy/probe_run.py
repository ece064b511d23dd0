"""`sinkscope toy probe RUN_DIR`: the shared probes and the default-state test on a
trained toy model, written as JSON, CSV and PNG.

The probes run on the figure set (trigger at 1-indexed position 8); "selected queries"
are the default (non-trigger) positions, so ``anchor_mass`` is the paper's
off-trigger BOS mass and ``anchor_mass_other`` the BOS mass at the trigger.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from sinkscope.infra.arguments import check_argument, check_number, check_path
from sinkscope.infra.atomic_io import atomic_directory, claim_output_directory
from sinkscope.infra.bounds import SAMPLES
from sinkscope.infra.codec import write_result
from sinkscope.infra.provenance import PROVENANCE_FILE, write_provenance
from sinkscope.probes.default_state import default_state_test
from sinkscope.probes.probe import HEADS_CSV, ProbeConfig, ProbeResult, check_layers, layer_selection
from sinkscope.probes.runner import probe_model
from sinkscope.probes.tables import anchor_mass_map
from sinkscope.reports.document import HeadMaps
from sinkscope.reports.embedded import read_embedded_png
from sinkscope.reports.plots import draw_head_maps
from sinkscope.toy.evaluate import FIGURE_SEED, MEAN_FIGURE, STD_FIGURE, ToyDefaultState, default_position_mse
from sinkscope.toy.run_dir import RunConfig, load_model, read_config, require_finished
from sinkscope.toy.source_run import SOURCE_RUN_FILE, SourceRun, copy_source_run
from sinkscope.toy.task import eval_batch
from sinkscope.toy.training_curves import SINK_FORMATION_FIGURE, sink_formation_figure

PROBE_FILE = "probe.json"
DEFAULT_STATE_FILE = "default_state.json"
ANCHOR_MASS_FIGURE = "anchor_mass.png"
SHARE_FIGURE = "value_weighted_anchor_share.png"


@dataclass
class ToyProbeReport:
    run_dir: str
    out_dir: str
    probe: ProbeResult
    default_state: ToyDefaultState
    files: list[str]


def _figure_set_probe(
    model: torch.nn.Module,
    tokens: torch.Tensor,
    default_mask: torch.Tensor,
    unfinished: str | None,
    layers: tuple[int, ...] | None = None,
) -> ProbeResult:
    """The toy probe: every shared probe over the default (non-trigger) queries of
    ``layers`` (None: all); the same call as ``sinkscope.toy.evaluate``'s, so a run's heads
    equal its ``evaluation.json`` rows on the same number of sequences."""
    config = ProbeConfig(batch_size=250, layers=layers)
    probe = probe_model(model, tokens, query_mask=default_mask, config=config)
    return probe if unfinished is None else replace(probe, notes=(*probe.notes, unfinished))


def _probed_share(probe: ProbeResult) -> np.ndarray:
    """The value-weighted anchor share per (layer, head): 0 where a probed head's anchor
    carries no value norm to share, NaN (a blank cell) in layers not probed."""
    share = probe.matrix("value_weighted_anchor_share").numpy()
    probed = [layer.layer for layer in probe.layers]
    share[probed] = np.nan_to_num(share[probed])
    return share


def _copy_run_figures(run_dir: Path, out_dir: Path) -> list[str]:
    """The training run's attention heatmaps, copied beside the probe (each checked to be a
    PNG inside the run), so that the probe's report embeds only files of its own directory."""
    copied = []
    for name in (MEAN_FIGURE, STD_FIGURE):
        if (run_dir / name).is_file():
            (out_dir / name).write_bytes(read_embedded_png(run_dir / name, run_dir))
            copied.append(name)
    return copied


def _draw_sink_formation(run_dir: Path, source: SourceRun, out_dir: Path) -> list[str]:
    """When the sink formed, from the steps training logged (two at least), as the result
    keeps them: the figure's name."""
    if len(source.logged) < 2:
        return []
    sink_formation_figure(source.records(), f"{run_dir.name}: sinks during training", out_dir / SINK_FORMATION_FIGURE)
    return [SINK_FORMATION_FIGURE]


def _write_probe(tmp: Path, run_dir: Path, probe: ProbeResult, state: ToyDefaultState, source: SourceRun) -> list[str]:
    """The probe's files, into the directory ``tmp`` that is swapped in whole; returns the
    names of the figures copied or drawn from the run."""
    write_result(tmp / PROBE_FILE, probe)
    probe.write_heads_csv(str(tmp / HEADS_CSV), run_dir.resolve().name)
    write_result(tmp / DEFAULT_STATE_FILE, state)
    draw_head_maps(
        anchor_mass_map(
            probe, f"{run_dir.name}: BOS mass at non-trigger queries", "mean attention on BOS (anchor mass)"
        ),
        tmp / ANCHOR_MASS_FIGURE,
    )
    share = _probed_share(probe)
    draw_head_maps(
        HeadMaps(
            f"{run_dir.name}: value-weighted anchor share",
            "share of the head's output norm from BOS",
            (("", tuple(tuple(row) for row in share.tolist())),),
        ),
        tmp / SHARE_FIGURE,
    )
    copied = _copy_run_figures(run_dir, tmp) + _draw_sink_formation(run_dir, source, tmp)
    write_result(tmp / SOURCE_RUN_FILE, source)
    write_provenance(tmp, "toy probe", source=str(run_dir.resolve()))
    return copied


def probe_of_run(
    run_dir: str | os.PathLike,
    n_sequences: int = 1000,
    allow_unfinished: bool = False,
    layers: Sequence[int] | None = None,
) -> ProbeResult:
    """``probe_run``'s ``ProbeResult`` of a trained toy run, computed and returned, nothing
    written (for comparisons that read runs they do not own)."""
    run_dir = Path(run_dir)
    config = read_config(run_dir)
    chosen = _checked_layers(layers, config, run_dir)
    unfinished = require_finished(run_dir, allow_unfinished, "probe")
    check_number(n_sequences, SAMPLES, "n_sequences")  # the sequences are one tensor
    batch = eval_batch(config.task, n_sequences, FIGURE_SEED, config.model.target)
    return _figure_set_probe(load_model(run_dir), batch.tokens, batch.default_query_mask(), unfinished, chosen)


def _checked_layers(layers: Sequence[int] | None, config: RunConfig, run_dir: Path) -> tuple[int, ...] | None:
    """``layers`` as a probe takes them, refused before anything runs when the run's model
    has no such layer."""
    chosen = layer_selection(layers)
    check_layers(chosen, config.model.n_layers, f"the model of {run_dir.name}")
    return chosen


def probe_run(
    run_dir: str | os.PathLike,
    out_dir: str | os.PathLike | None = None,
    n_sequences: int = 1000,
    overwrite: bool = False,
    allow_unfinished: bool = False,
    layers: Sequence[int] | None = None,
) -> ToyProbeReport:
    """Probe a trained toy run; results go to ``out_dir`` (default ``RUN_DIR/probe``).
    An unfinished or diverged run is refused unless ``allow_unfinished`` (then the result
    says so in its notes). ``layers``: the layers probed (None: all); the default-state
    test removes the sinks of sink heads in these layers only."""
    check_path(run_dir, "run_dir", "a toy run directory (str or pathlib.Path)")
    if out_dir is not None:
        check_path(out_dir, "out_dir", "an output directory path (str or pathlib.Path) or None")
    check_argument(n_sequences, int, "n_sequences", "an integer")
    run_dir = Path(run_dir)
    config = read_config(run_dir)
    chosen = _checked_layers(layers, config, run_dir)
    unfinished = require_finished(run_dir, allow_unfinished, "probe")
    model = load_model(run_dir)
    source = copy_source_run(run_dir, config, with_metrics=True)  # what the report says of the run
    out_dir = Path(out_dir) if out_dir is not None else run_dir / "probe"
    check_number(n_sequences, SAMPLES, "n_sequences")  # the sequences are one tensor
    with claim_output_directory(out_dir, overwrite, [run_dir], "the run", own_places=[run_dir / "probe"]):
        batch = eval_batch(config.task, n_sequences, FIGURE_SEED, config.model.target)
        default_mask = batch.default_query_mask()
        probe = _figure_set_probe(model, batch.tokens, default_mask, unfinished, chosen)
        state = ToyDefaultState.from_result(
            default_state_test(
                model,
                batch.tokens,
                probe.sink_heads(),
                default_position_mse(batch.targets, default_mask),
            )
        )
        # built aside and swapped in whole: an old result stays complete until the new one is
        with atomic_directory(out_dir, replace=overwrite) as tmp:
            copied = _write_probe(tmp, run_dir, probe, state, source)
    files = [
        PROBE_FILE,
        HEADS_CSV,
        DEFAULT_STATE_FILE,
        ANCHOR_MASS_FIGURE,
        SHARE_FIGURE,
        *copied,
        SOURCE_RUN_FILE,
        PROVENANCE_FILE,
    ]
    return ToyProbeReport(str(run_dir), str(out_dir), probe, state, files)
