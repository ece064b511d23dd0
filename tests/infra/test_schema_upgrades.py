"""Result files of schema version 1 still read after the one-vocabulary renames.

The files under ``tests/fixtures/v1-3107c0e`` were written by the code of commit 3107c0e
(see the README there): each is read with today's class through its ``UPGRADES``, the
renamed fields must carry the values the file held under the old names, no value may be
lost or changed on the way, and writing the result again gives a version-2 file that
reads back equal.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from sinkscope.infra.codec import encode, read_result, write_result
from sinkscope.pretrained_analysis.audit import AuditResult
from sinkscope.probes.default_state import DefaultStateConfig, default_state_test
from sinkscope.probes.mechanism import MechanismComparison
from sinkscope.probes.probe import ProbeResult
from sinkscope.toy.evaluate import ToyDefaultState, default_position_mse
from sinkscope.toy.experiment import ModelSummary
from sinkscope.toy.patching import TriggerPatching
from sinkscope.toy.reproduce import ReproduceSummary
from sinkscope.toy.sweep import SweepConfig, SweepResult
from sinkscope.toy.task import TaskConfig, eval_batch
from tiny_models import toy_sink_model

V1 = Path(__file__).resolve().parents[1] / "fixtures" / "v1-3107c0e"
# every version-1 file of the fixtures, with the class that reads it
FILES = {
    "probe/probe.json": ProbeResult,
    "probe/default_state.json": ToyDefaultState,
    "default_state_two_heads.json": ToyDefaultState,
    "default_state_capped.json": ToyDefaultState,
    "evaluation.json": ModelSummary,
    "reproduction/summary.json": ReproduceSummary,
    "sweep/summary.json": SweepResult,
    "sweep/sweep.json": SweepConfig,
    "patching.json": TriggerPatching,
    "audit/audit.json": AuditResult,
    "mechanism/mechanism.json": MechanismComparison,
}


def v1(name: str) -> dict[str, Any]:
    return json.loads((V1 / name).read_text())


def leaves(data: Any) -> set[Any]:
    """Every number, string, bool and null in ``data`` (keys aside): what a rename of keys
    must keep."""
    if isinstance(data, dict):
        return set().union(*(leaves(value) for value in data.values())) if data else set()
    if isinstance(data, list):
        return set().union(*(leaves(item) for item in data)) if data else set()
    return {data}


# fields added after version 1 with a default (NaN: null, or ""): a version-1 file has none of them
# fields added since version 1, each with the default an older file reads as (NaN: null)
ADDED_SINCE_V1 = {
    "null_mass": None,
    "effect_ci_low": None,
    "effect_ci_high": None,
    "normalised_effect_ci_low": None,
    "normalised_effect_ci_high": None,
    "anchor_how": "",
    "ablate_sink": "anchor",
    "sink": "anchor",
    # key geometry and secondary sinks (issue 25): not measured in a version-1 file
    "anchor_key_cos": None,
    "other_key_cos": None,
    "anchor_key_cos_rotated": None,
    "other_key_cos_rotated": None,
    "anchor_key_norm_ratio": None,
    "anchor_value_norm_ratio": None,
    "secondary_sinks": None,
    # the sink experiments (AuditConfig, AuditResult.experiments): not run in a version-1 file
    "input_types": None,
    "eps_curve": None,
    "lengths": None,
    "experiments": None,
    "input_protocol": "sinkscope",  # how the experiments' inputs are built: sinkscope's protocol before it was named
    # the eviction's interval over prompts: not recorded in a version-1 file
    "evict_anchor_increase": None,
    "prompts_used": None,  # a comparison's prompts each audit ran on
    # sink-head classes and the random-key null (issue 36): not measured in a version-1 file
    "sink_class": None,
    "anchor_projected_value_norm_ratio": None,
    "update_stable_rank": None,
    "random_key_mass": None,
    "above_random_key_p99": None,
    "random_key_p99": None,
    "random_key_seed": 0,
    # head ablations beside sink removal (issue 32): not run in a version-1 file
    "zero_increase": None,
    "mean_increase": None,
    "remove_minus_mean": None,
    "head_ablations": True,  # a version-1 default-state test ran them
    # the default-state result's interval level (issue 32): version-1 intervals were 95%
    "confidence": 0.95,
}


def without_added(data: Any) -> Any:
    """``data`` (encoded JSON) less the ``ADDED_SINCE_V1`` fields that hold their default."""
    if isinstance(data, dict):
        return {
            key: without_added(value)
            for key, value in data.items()
            if not (key in ADDED_SINCE_V1 and value == ADDED_SINCE_V1[key])
        }
    if isinstance(data, list):
        return [without_added(item) for item in data]
    return data


def same(a: Any, b: Any) -> bool:
    """JSON values equal, NaN (null in a file) equal to itself; fields added since version 1
    at their default aside."""
    return json.dumps(without_added(encode(a)), sort_keys=True) == json.dumps(without_added(encode(b)), sort_keys=True)


@pytest.mark.parametrize("name", sorted(FILES))
def test_a_version_1_file_reads_keeps_every_value_and_is_written_again_as_today_s_version(name, tmp_path):
    cls = FILES[name]
    data = v1(name)
    assert data["schema"] == cls.SCHEMA and data["schema_version"] == 1
    result = read_result(V1 / name, cls)
    upgraded = without_added(encode(result))
    old_values = leaves({key: value for key, value in data.items() if not key.startswith("schema")})
    # keys renamed and rows moved, no value lost, changed or invented; a field added since
    # reads as null (not measured), which is no value
    assert leaves(upgraded) - {None} == old_values - {None}
    write_result(tmp_path / "again.json", result)
    again = json.loads((tmp_path / "again.json").read_text())
    assert again["schema_version"] == cls.SCHEMA_VERSION
    assert same(read_result(tmp_path / "again.json", cls), result)


def test_the_changed_schemas_are_version_2_and_the_unchanged_stay_version_1():
    changed = {ProbeResult, ToyDefaultState, ModelSummary, ReproduceSummary, SweepResult, TriggerPatching}
    changed |= {AuditResult, MechanismComparison}
    assert {cls: cls.SCHEMA_VERSION for cls in changed} == dict.fromkeys(changed, 2)
    assert all(1 in cls.UPGRADES for cls in changed)
    assert SweepConfig.SCHEMA_VERSION == 1  # its grid axes keep their names (the CLI's flags map to them)


def test_a_probe_s_spec_and_layer_rows_take_the_new_names():
    data = v1("probe/probe.json")
    probe = read_result(V1 / "probe/probe.json", ProbeResult)
    assert probe.model.attention == data["model"]["attention_kind"] == "softmax"
    assert [layer.n_sink_heads for layer in probe.layers] == [layer["sink_heads"] for layer in data["layers"]]
    assert probe.sink_heads() == [(0, 0)]


def test_the_all_sink_heads_row_is_named_not_last():
    two = v1("default_state_two_heads.json")
    state = read_result(V1 / "default_state_two_heads.json", ToyDefaultState)
    assert state.sink_heads == ((0, 0), (1, 1))
    assert [row.label for row in state.rows] == ["L0H0", "L1H1"]
    assert state.all_sink_heads is not None and same(state.all_sink_heads, _renamed_row(two["heads"][-1]))
    assert state.all_sink_heads.head_set == ((0, 0), (1, 1))
    assert (
        state.default_error_after_remove == two["default_error_after_remove"] == two["heads"][-1]["error_after_remove"]
    )
    assert [row.label for row in state.tested_rows()] == ["L0H0", "L1H1", "all_sink_heads"]

    capped = read_result(V1 / "default_state_capped.json", ToyDefaultState)  # one head alone, then both
    assert [row.label for row in capped.rows] == ["L0H0"] and capped.all_sink_heads is not None
    assert capped.all_sink_heads.label == "all_sink_heads" and "1 of 2 sink heads" in capped.note

    one = v1("probe/default_state.json")  # one sink head: its row is the all-sink-heads row
    single = read_result(V1 / "probe/default_state.json", ToyDefaultState)
    assert [row.label for row in single.rows] == ["L0H0"] and single.all_sink_heads == single.rows[0]
    assert same(single.all_sink_heads, _renamed_row(one["heads"][0]))
    assert single.tested_rows() == single.rows


def _renamed_row(row: dict[str, Any]) -> dict[str, Any]:
    return {("head_set" if key == "heads" else key): value for key, value in row.items()}


def test_an_audit_s_probe_and_ablation_take_the_new_names():
    data = v1("audit/audit.json")
    audit = read_result(V1 / "audit/audit.json", AuditResult)
    assert audit.probe.model.attention == data["probe"]["model"]["attention_kind"]
    assert [layer.n_sink_heads for layer in audit.probe.layers] == [
        layer["sink_heads"] for layer in data["probe"]["layers"]
    ]
    assert audit.ablation is not None
    test, old = audit.ablation.default_state, data["ablation"]["sink_heads"]
    assert test.sink_heads == tuple(tuple(head) for head in old["sink_heads"]) == ((1, 1), (0, 0))
    assert [row.label for row in test.rows] == ["L1H1"]  # --ablate-heads 1: the strongest alone
    assert test.all_sink_heads is not None and same(test.all_sink_heads, _renamed_row(old["rows"][-1]))
    assert test.note == old["note"] and test.n_inputs == old["n_inputs"]


def test_model_summaries_take_the_new_names_alone_and_inside_experiments():
    data = v1("evaluation.json")
    summary = read_result(V1 / "evaluation.json", ModelSummary)
    assert (summary.n_layers, summary.n_heads) == (data["layers"], data["heads"]) == (1, 1)
    # the rows keep every old value; fields added since read as null
    heads = [
        {key: value for key, value in encode(row).items() if key in old}
        for row, old in zip(summary.heads, data["heads_table"])
    ]
    assert same(heads, data["heads_table"]) and summary.paper_n_sink_heads == data["paper_sink_heads"] == 1
    assert summary.default_state is not None and summary.default_state.all_sink_heads == summary.default_state.rows[0]
    assert summary.default_state.default_error_before == data["default_state_test"]["default_error_before"]

    reproduction = read_result(V1 / "reproduction/summary.json", ReproduceSummary)
    old_models = v1("reproduction/summary.json")["models"]
    assert [(m.name, m.n_layers, m.n_heads) for m in reproduction.models] == [
        (m["name"], m["layers"], m["heads"]) for m in old_models
    ]
    assert same(reproduction.models[0], summary)  # the run's evaluation.json is its row

    sweep_data = v1("sweep/summary.json")
    sweep = read_result(V1 / "sweep/summary.json", SweepResult)
    assert [(r.n_layers, r.n_heads) for r in sweep.rows] == [(r["layers"], r["heads"]) for r in sweep_data["rows"]]
    assert [m.n_heads for m in sweep.models] == [m["heads"] for m in sweep_data["models"]]
    assert sweep.rows[0].label == "softmax 1x1 d6 L6"


def test_patching_and_mechanism_take_the_new_names():
    data = v1("patching.json")
    patching = read_result(V1 / "patching.json", TriggerPatching)
    for result, old in ((patching.per_head, data["heads"]), (patching.per_position, data["positions"])):
        assert same(result.rows, old["rows"]) and result.hook == old["hook"]
        assert result.model.attention == old["model"]["attention_kind"] == "softmax"
    comparison = read_result(V1 / "mechanism/mechanism.json", MechanismComparison)
    old = v1("mechanism/mechanism.json")["models"]
    assert (
        [m.attention for m in comparison.models] == [m["attention_kind"] for m in old] == ["softmax", "relu", "softmax"]
    )
    frame = comparison.to_dataframe()
    assert "attention" in frame.columns and "attention_kind" not in frame.columns
    assert not math.isnan(comparison.model("tiny-gpt2").n_sink_heads)


# The fixture's numbers were computed on another machine. The toy model runs in float32, and
# another processor kind or library build sums in another order (ATen picks its AVX-512,
# AVX2 or plain kernels when it starts), which moves each error by a few float32 ulps
# (1.2e-7 each): 6.661679585e-06 stored, 6.661679741e-06 and 6.661679762e-06 on two AMD EPYC
# machines (AVX2), 6.661678405e-06 under ATEN_CPU_CAPABILITY=default (1.8e-7 relative).
# So today's numbers are held to:
# - an error, or a ratio of two errors, within rel 1e-6 (about 8 ulps);
# - a difference of two errors (an increase, its interval's ends) within 1e-6 of the errors
#   it subtracts: the subtraction keeps their absolute drift, not their relative one (measured
#   up to 4.2e-6 relative on the difference itself);
# - Cohen's d (an increase's mean over its spread, both such differences) within rel 1e-4
#   (measured up to 1.2e-6).
# Anything else (labels, heads, notes, which fields exist) is exact. Another input, bootstrap
# draw or rule moves these numbers by far more than these tolerances. Exactness is tested
# where it is a property: the same run twice on one machine (the test after this one).
ERROR_REL = 1e-6
COHENS_D_REL = 1e-4


def differences_from_stored(today: Any, stored: Any, error_scale: float, where: str = "") -> list[str]:
    """Where the encoded ``today`` differs from ``stored`` beyond the tolerances above; the
    path ``where`` of a number (``.rows[1].control_increase.ci_high``) decides its tolerance."""
    if isinstance(today, dict) and isinstance(stored, dict):
        if today.keys() != stored.keys():
            return [f"{where or 'top'}: fields {sorted(today)} against {sorted(stored)}"]
        return [
            line
            for key in today
            for line in differences_from_stored(today[key], stored[key], error_scale, f"{where}.{key}")
        ]
    if isinstance(today, list) and isinstance(stored, list):
        if len(today) != len(stored):
            return [f"{where}: {len(today)} items against {len(stored)}"]
        return [
            line
            for k, (a, b) in enumerate(zip(today, stored))
            for line in differences_from_stored(a, b, error_scale, f"{where}[{k}]")
        ]
    if isinstance(today, float) and isinstance(stored, float):
        if where.endswith(".cohens_d"):
            tolerance = pytest.approx(stored, rel=COHENS_D_REL)
        elif "increase" in where:  # a difference of two errors, or an end of its interval
            tolerance = pytest.approx(stored, rel=ERROR_REL, abs=ERROR_REL * error_scale)
        else:
            tolerance = pytest.approx(stored, rel=ERROR_REL)
        return [] if today == tolerance else [f"{where}: {today!r} against {stored!r}"]
    return [] if type(today) is type(stored) and today == stored else [f"{where}: {today!r} against {stored!r}"]


def todays_default_state(cap: int | None) -> ToyDefaultState:
    """The fixture's default-state test run again by today's code (same model, inputs and
    settings as the README's script)."""
    model = toy_sink_model()
    task = TaskConfig(d_model=8, seq_len=8, eval_trigger_position=5)
    batch = eval_batch(task, 64, seed=1, target=model.cfg.target)
    error_fn = default_position_mse(batch.targets, batch.default_query_mask())
    # without the head ablations, which version 1 did not run (they leave these numbers alone:
    # their intervals draw from a generator of their own)
    config = DefaultStateConfig(n_bootstrap=50, max_single_heads=cap, head_ablations=False)
    return ToyDefaultState.from_result(
        default_state_test(model, batch.tokens, [(0, 0), (1, 1)], error_fn, config=config)
    )


@pytest.mark.parametrize("name, cap", [("default_state_two_heads.json", None), ("default_state_capped.json", 1)])
def test_today_s_test_gives_the_numbers_version_1_wrote(name, cap):
    """The same rows and the same all-sink-heads row as the fixture, each number within the
    float32 drift between processors stated above."""
    stored = read_result(V1 / name, ToyDefaultState)
    today = todays_default_state(cap)
    assert stored.default_error_before > 0  # the scale the differences are measured against
    differences = differences_from_stored(
        without_added(encode(today)), without_added(encode(stored)), stored.default_error_before
    )
    assert not differences, differences


def test_the_default_state_test_run_twice_on_one_machine_gives_the_same_bits():
    """Exactness where it is a property: one machine, one build, the same run."""
    assert same(todays_default_state(None), todays_default_state(None))


def test_the_tolerances_catch_a_change_in_the_last_digits_that_matter():
    """A stored error off by 1e-5 of itself, or an interval's end moved by 1e-5 of the
    errors, is a difference; drift at the float32 level is not."""
    stored = without_added(encode(read_result(V1 / "default_state_two_heads.json", ToyDefaultState)))
    scale = stored["default_error_before"]
    assert not differences_from_stored(stored, stored, scale)
    drifted = json.loads(json.dumps(stored))
    drifted["default_error_before"] *= 1 + 2e-7
    drifted["all_sink_heads"]["control_increase"]["ci_high"] += 2e-7 * scale
    assert not differences_from_stored(drifted, stored, scale)
    moved = json.loads(json.dumps(stored))
    moved["default_error_before"] *= 1 + 1e-5
    moved["all_sink_heads"]["control_increase"]["ci_high"] += 1e-5 * scale
    moved["note"] = "changed"
    assert [line.split(":")[0] for line in differences_from_stored(moved, stored, scale)] == [
        ".default_error_before",
        ".note",
        ".all_sink_heads.control_increase.ci_high",
    ]
