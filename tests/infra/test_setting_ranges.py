"""Configs and API functions hold their settings to the ranges their result files' reader
accepts (``sinkscope.infra.bounds``; issue 34, item 4): what the codec would refuse on
reading back, or torch refuse while running, is an ``InputError`` naming the field at
construction, and what is accepted is read back."""

from __future__ import annotations

import pytest

from sinkscope.infra.bounds import MAX_INT, POSITIVE, SAMPLES, SEEDS, Bound
from sinkscope.infra.codec import read_result, write_result
from sinkscope.infra.errors import InputError
from sinkscope.pretrained_analysis.audit_config import AuditConfig
from sinkscope.pretrained_analysis.loading import LoadSpec
from sinkscope.pretrained_analysis.prompts import PromptSpec
from sinkscope.pretrained_analysis.window_test import window_test
from sinkscope.probes.window_masks import window_settings
from sinkscope.toy.mitigations import MitigationsConfig
from sinkscope.toy.model import ToyModelConfig
from sinkscope.toy.reproduce import ReproduceConfig
from sinkscope.toy.run_dir import RunConfig, TrainConfig
from sinkscope.toy.sweep import SweepConfig
from sinkscope.toy.task import TaskConfig


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: TrainConfig(max_steps=2**63), "max_steps"),
        (lambda: TrainConfig(checkpoint_every=10**20), "checkpoint_every"),
        (lambda: TrainConfig(stop_linf=float("inf")), "stop_linf"),
        (lambda: ToyModelConfig(n_heads=2**63), "n_heads"),
        (lambda: ToyModelConfig(d_mlp=10**20, mlp=True), "d_mlp"),
        (lambda: TaskConfig(d_model=2**63), "d_model"),
        (lambda: PromptSpec(n_prompts=SAMPLES.high + 1), "n_prompts"),
        (lambda: PromptSpec(max_len=2**63), "max_len"),
        (lambda: AuditConfig(batch_size=2**63), "batch_size"),
        (lambda: AuditConfig(n_examples=2**63), "n_examples"),
        (lambda: AuditConfig(ablate_heads=10**20), "ablate_heads"),
        (lambda: ReproduceConfig(seeds=SEEDS.high + 1), "seeds"),
        (lambda: ReproduceConfig(n_sequences=10**20), "n_sequences"),
        (lambda: SweepConfig(seeds=10**20), "seeds"),
        (lambda: SweepConfig(d_models=(8, 2**63)), "d_models"),
        (lambda: MitigationsConfig(n_sequences=2**63), "n_sequences"),
        (lambda: LoadSpec("gpt2", n_devices=2**63), "n_devices"),
        (lambda: window_settings((2**63,), (1,)), "windows"),
        (lambda: window_test(LoadSpec("no-such-model"), "some text", seed=2**64), "seed"),
        (lambda: window_test(LoadSpec("no-such-model"), "some text", max_chunks=2**63), "max_chunks"),
    ],
)
def test_a_setting_outside_its_range_is_refused_naming_its_field(build, field):
    with pytest.raises(InputError) as refused:
        build()
    assert refused.value.field == field, str(refused.value)
    assert field in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.parametrize("value", [MAX_INT, 2**63, 10**20])
def test_a_config_that_is_accepted_is_read_back(tmp_path, value):
    """What a config accepts, the codec reads (2**63 was accepted, then refused by the reader)."""
    try:
        train = TrainConfig(max_steps=value, checkpoint_every=value, log_every=value)
    except InputError as refused:
        assert value > MAX_INT and refused.field == "max_steps"
        return
    config = RunConfig(ToyModelConfig(d_model=8, seq_len=8), TaskConfig(d_model=8, seq_len=8), train)
    write_result(tmp_path / "config.json", config)
    assert read_result(tmp_path / "config.json", RunConfig) == config


def test_an_integer_at_the_64_bit_cap_is_compared_exactly():
    """As a float, 2**63 - 1 rounds to 2**63: a range check in floats refused the cap or let 2**63 through."""
    assert POSITIVE.admits(MAX_INT) and not POSITIVE.admits(MAX_INT + 1)
    assert not Bound(0, 10, 0.5).admits(11) and Bound(0.0, 1.0, high_open=True).admits(0.5)
