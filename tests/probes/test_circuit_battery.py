"""The sink-circuit battery against ground truth.

1. A GPT-2 whose sink is built by construction from three parts: a position-0 embedding
   flag in one dimension, one key weight that reads it, and a query bias. Replacing the
   first position's embedding, zeroing the key dimension and nulling the query bias must
   remove the sink; every control must leave at least 95% of it.
2. Every edit against the same edit made directly in transformers (weights edited, or a
   module's output zeroed by a forward hook), read from its eager attention weights: the
   per-input anchor masses and losses agree to 1e-5. On GPT-2 (learned positions, query
   bias) and Qwen2 (rotary, grouped-query attention, query bias).
"""

from __future__ import annotations

import copy

import pytest
import torch

from circuit_models import SINK, build_position_sink_gpt2, hf_anchor_readout, hf_edit
from sinkscope.infra.errors import InputError
from sinkscope.interp.hooked_model import HookedModel
from sinkscope.pretrained_analysis.ablation import next_token_loss
from sinkscope.probes.circuit_battery import anchor_mass_readout, run_circuit_battery
from sinkscope.probes.circuit_edits import CircuitEdit, applicability
from sinkscope.probes.circuit_result import CircuitConfig
from tiny_models import build_tiny_gqa, load_bridge, load_hf_model

PROMPTS = [
    "Attention sinks park mass on the first token of every prompt.",
    "The quick brown fox jumps over the lazy dog again and again.",
    "A trigger switches the model out of its default state for a while.",
    "Another sentence that is long enough to have many later queries.",
    "Short one here, but still more than a few tokens long indeed.",
    "Sinks form because softmax rows must sum to one, or so goes the story.",
]


@pytest.fixture(scope="module")
def position_sink_dir(tmp_path_factory):
    return build_position_sink_gpt2(tmp_path_factory.mktemp("models") / "position-sink")


@pytest.fixture(scope="module")
def position_sink(position_sink_dir):
    return HookedModel(load_bridge(position_sink_dir)), load_hf_model(position_sink_dir)


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory):
    directory = build_tiny_gqa(tmp_path_factory.mktemp("models") / "qwen2", family="qwen2", bos_sink_head=(1, 0))
    return HookedModel(load_bridge(directory)), load_hf_model(directory)


def test_the_constructed_circuit_is_found_and_every_control_leaves_the_sink(position_sink) -> None:
    hooked, _ = position_sink
    battery = run_circuit_battery(hooked, PROMPTS, [SINK], CircuitConfig(n_bootstrap=200), error_fn=next_token_loss)
    assert battery.baseline_anchor_mass > 0.99
    shares = {row.intervention.edit: row.intervention.share_left for row in battery.rows}
    removers = ("null_query_bias", "replace_first_position", "remove_positions", "swap_effective_positions")
    for removes in (*removers, "zero_key_dims"):
        assert shares[removes].mean < 0.3, removes
    key_row = next(row for row in battery.rows if row.intervention.edit == "zero_key_dims")
    assert key_row.control is not None
    for row in battery.rows:
        if row.control is not None:
            assert row.control.share_left.mean >= 0.95, row.control.edit
    # the sink is built from position, not from the token: its token's embedding does not matter
    assert shares["replace_anchor_token"].mean >= 0.95
    assert shares["zero_anchor_write"].mean >= 0.95
    frame = battery.to_dataframe()
    assert len(frame) == sum(1 + (row.control is not None) for row in battery.rows)
    assert set(battery.heads_dataframe()["layer"]) == {SINK[0]}


EDITS = [
    CircuitEdit("null_query_bias", heads=((1, 0), (1, 1))),
    CircuitEdit("random_query_bias", heads=((1, 0),), seed=3),
    CircuitEdit("replace_first_position", position=4),
    CircuitEdit("remove_positions"),
    CircuitEdit("swap_later_positions", position=3),
    CircuitEdit("swap_effective_positions", position=4),
    CircuitEdit("swap_later_effective_positions", position=2),
    CircuitEdit("zero_anchor_write", layer=0),
    CircuitEdit("zero_anchor_write", layer=0, part="attn"),
    CircuitEdit("zero_random_write", layer=0, seed=2),
    CircuitEdit("zero_random_write", layer=1, part="attn", seed=2),
    CircuitEdit("zero_key_dims", key_dims=((1, (5, 7, 30)),)),
    CircuitEdit("zero_random_key_dims", key_dims=((0, (1,)), (1, (2, 3)))),
    CircuitEdit("replace_anchor_token"),
    CircuitEdit("offset_positions", offset=100),
]


@pytest.mark.parametrize("family", ["gpt2", "qwen2"])
@pytest.mark.parametrize("edit", EDITS, ids=lambda edit: f"{edit.kind}-{edit.part}")
def test_each_edit_equals_the_same_edit_made_in_transformers(family, edit, position_sink, qwen2) -> None:
    hooked, hf = position_sink if family == "gpt2" else qwen2
    heads = [(layer, head) for layer in range(2) for head in range(hooked.spec.n_heads)]
    why_not = applicability(hooked, edit)
    if family == "qwen2" and "position" in edit.kind and edit.kind != "offset_positions":
        assert why_not == "no learned position embeddings"
        return
    if family == "gpt2" and edit.kind == "offset_positions":
        assert why_not == "no rotary position embeddings"
        return
    assert why_not is None
    batch = hooked.prepare(PROMPTS[:4], padding_side="right")
    readout = anchor_mass_readout(hooked, [batch], heads, edit, next_token_loss)
    edited, embeds = hf_edit(hf, batch, edit, hooked)
    position_ids = None
    if edit.kind == "offset_positions":
        position_ids = torch.arange(batch.n_pos).unsqueeze(0) + edit.offset
    expected_mass, expected_loss = hf_anchor_readout(edited, batch, embeds, heads, position_ids)
    torch.testing.assert_close(readout.anchor_mass, expected_mass, atol=1e-5, rtol=0)
    assert readout.error is not None
    torch.testing.assert_close(readout.error, expected_loss.double(), atol=1e-5, rtol=0)
    # and the edit changed something: a test of an edit that does nothing could not fail
    baseline = anchor_mass_readout(hooked, [batch], heads, None, next_token_loss)
    assert baseline.error is not None
    unchanged = torch.allclose(readout.anchor_mass, baseline.anchor_mass, atol=1e-9, rtol=0)
    assert not (unchanged and torch.allclose(readout.error, baseline.error, atol=1e-9, rtol=0))


def test_a_model_without_the_part_lists_the_edit_as_not_applicable(qwen2) -> None:
    hooked, _ = qwen2
    battery = run_circuit_battery(hooked, PROMPTS, [(1, 0)], CircuitConfig(n_bootstrap=50), error_fn=next_token_loss)
    positions = [row for row in battery.rows if "position" in row.label and "rotary" not in row.label]
    assert positions and all(not row.intervention.applicable for row in positions)
    (rotary,) = [row for row in battery.rows if "rotary" in row.label]  # Qwen2 takes the offset instead
    assert rotary.intervention.applicable
    assert all(row.intervention.why_not == "no learned position embeddings" for row in positions)
    assert "not applicable: no learned position embeddings" in str(battery.table().rows)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"k_dims": 0}, "k_dims must be an integer"),
        ({"write_layer": -1}, "write_layer must be an integer"),
        ({"position": 0}, "position must be a later position"),
        ({"n_bootstrap": 0}, "n_bootstrap must be an integer"),
    ],
)
def test_a_bad_setting_is_one_line_naming_it(config, message) -> None:
    with pytest.raises(InputError, match=message):
        CircuitConfig(**config)


def test_a_layer_head_or_position_outside_the_model_is_refused(position_sink) -> None:
    hooked, _ = position_sink
    with pytest.raises(InputError, match="outside the model"):
        run_circuit_battery(hooked, PROMPTS, [(5, 0)], CircuitConfig(n_bootstrap=10))
    with pytest.raises(InputError, match="write layer 9 is outside"):
        run_circuit_battery(hooked, PROMPTS, [SINK], CircuitConfig(n_bootstrap=10, write_layer=9))
    with pytest.raises(InputError, match="position 40 needs inputs of at least 42 tokens"):
        run_circuit_battery(hooked, PROMPTS, [SINK], CircuitConfig(n_bootstrap=10, position=40))
    with pytest.raises(InputError, match="k must be at most half the model width"):
        run_circuit_battery(hooked, PROMPTS, [SINK], CircuitConfig(n_bootstrap=10, k_dims=17))  # its control: 15
    with pytest.raises(InputError, match="at least one sink head"):
        run_circuit_battery(hooked, PROMPTS, [], CircuitConfig(n_bootstrap=10))


@pytest.mark.parametrize(
    ("call", "message"),
    [
        ({"sink_heads": [(1.7, 0.2)]}, "pairs of integers"),
        ({"sink_heads": ["L1H0"]}, "pairs of integers"),
        ({"sink_heads": [(True, 0)]}, "pairs of integers"),
        ({"sink_heads": [SINK, SINK]}, "sink heads repeat"),
        ({"config": {"k_dims": 3}}, "config"),
        ({"sink_eps": float("nan")}, "sink_eps must lie in"),
        ({"sink_eps": -1.0}, "sink_eps must lie in"),
        ({"inputs": []}, "non-empty list of strings"),
        ({"inputs": PROMPTS[0]}, "non-empty list of strings"),
    ],
    ids=lambda value: repr(value)[:30],
)
def test_a_bad_api_argument_is_an_input_error_not_a_crash(position_sink, call, message) -> None:
    hooked, _ = position_sink
    arguments = {"inputs": PROMPTS, "sink_heads": [SINK], "config": CircuitConfig(n_bootstrap=10), **call}
    sink_eps = arguments.pop("sink_eps", 0.1)
    with pytest.raises(InputError, match=message):
        run_circuit_battery(
            hooked, arguments["inputs"], arguments["sink_heads"], arguments["config"], sink_eps=sink_eps
        )


def test_a_mask_with_a_hole_is_refused_like_left_padding(position_sink) -> None:
    hooked, _ = position_sink
    batch = hooked.prepare(PROMPTS[:3], padding_side="right")
    mask = batch.attention_mask.clone()
    mask[1, 5] = False
    with pytest.raises(InputError, match="right-padded"):
        run_circuit_battery(hooked, batch.model_input, [SINK], CircuitConfig(n_bootstrap=10), attention_mask=mask)


def _toy(**config):
    from sinkscope.toy.model import ToyModelConfig, ToyTransformer

    torch.manual_seed(0)
    return ToyTransformer(ToyModelConfig(n_layers=2, n_heads=2, d_model=8, seq_len=8, init_std=0.5, **config)).double()


@pytest.mark.parametrize(
    "edit",
    [
        CircuitEdit("zero_key_dims", key_dims=((0, (1, 4)), (1, (0,)))),
        CircuitEdit("replace_first_position", position=3),
        CircuitEdit("swap_later_positions", position=2),
    ],
    ids=lambda edit: edit.kind,
)
def test_a_toy_edit_equals_the_same_edit_made_to_its_weights(edit) -> None:
    from sinkscope.toy.task import TaskConfig, eval_batch

    model = _toy(layer_norm=True, mlp=True, positional_embedding=True)
    tokens = eval_batch(TaskConfig(d_model=8, seq_len=8, eval_trigger_position=5), 16, 0, "residual").tokens.double()
    heads = [(layer, head) for layer in range(2) for head in range(2)]
    hooked = HookedModel(model)
    readout = anchor_mass_readout(hooked, [hooked.prepare(tokens)], heads, edit, None)
    edited = copy.deepcopy(model)
    with torch.no_grad():
        if edit.kind == "zero_key_dims":
            for layer, dims in edit.key_dims:
                edited.blocks[layer].attn.W_K[:, list(dims), :] = 0.0
        elif edit.kind == "replace_first_position":
            edited.W_pos[0] = edited.W_pos[edit.position].clone()
        else:
            p = edit.position
            edited.W_pos[[p, p + 1]] = edited.W_pos[[p + 1, p]].clone()
    by_weights = HookedModel(edited)
    expected = anchor_mass_readout(by_weights, [by_weights.prepare(tokens)], heads, None, None)
    torch.testing.assert_close(readout.anchor_mass, expected.anchor_mass, atol=1e-10, rtol=0)
    assert not torch.allclose(
        readout.anchor_mass, anchor_mass_readout(hooked, [hooked.prepare(tokens)], heads, None, None).anchor_mass
    )


def test_an_edit_whose_hook_never_fires_is_a_bug_not_a_result(monkeypatch) -> None:
    from sinkscope.probes import circuit_edits
    from sinkscope.toy.task import TaskConfig, eval_batch

    model = HookedModel(_toy())  # no MLP: its hook_mlp_out point exists and never fires
    assert applicability(model, CircuitEdit("zero_anchor_write", layer=0)) == "no mlp output"
    monkeypatch.setattr(circuit_edits, "write_hook", lambda model, layer, part: "blocks.0.hook_mlp_out")
    tokens = eval_batch(TaskConfig(d_model=8, seq_len=8, eval_trigger_position=5), 4, 0, "residual").tokens.double()
    with pytest.raises(RuntimeError, match="never fired"):
        anchor_mass_readout(model, [model.prepare(tokens)], [(0, 0)], CircuitEdit("zero_anchor_write", layer=0), None)


def test_the_transplant_equals_the_same_pattern_edit_inside_transformers(qwen2) -> None:
    from hf_reference import edited_eager_attention
    from sinkscope.probes.circuit_transplant import transplant_test

    hooked, hf = qwen2
    batch = hooked.prepare(PROMPTS[:4], padding_side="right")
    position = 3
    result = transplant_test(hooked, [batch], position, 1, 0.1, 200, 0)

    def self_only(weights: torch.Tensor) -> torch.Tensor:
        edited = weights.clone()
        edited[:, :, position] = 0.0
        edited[:, :, position, position] = 1.0
        return edited

    with edited_eager_attention(hf, {0: self_only}), torch.no_grad():
        out = hf(input_ids=batch.model_input, attention_mask=batch.attention_mask.long(), output_attentions=True)
    later = batch.attention_mask.clone()
    later[:, : position + 1] = False
    on_p = (out.attentions[1][:, :, :, position].double() * later.unsqueeze(1)).sum(-1) / later.sum(-1, keepdim=True)
    assert result.transplant.mean == pytest.approx(float(on_p.mean()), abs=1e-6)
    assert result.n_heads_read == hooked.spec.n_heads and result.n_layers == 1
    assert result.transplant.mean != pytest.approx(result.baseline.mean, abs=1e-4)  # the edit moved attention
    assert result.norm_factor > 0


def test_a_toy_effective_position_swap_moves_the_embedding_plus_what_layer_0_s_mlp_writes_from_it() -> None:
    """EPE_i = p_i + relu(LN(p_i) W_in) W_out, written out here from the toy's weights; the
    swap adds EPE_p - EPE_0 at the anchor and the reverse at p in layer 0's output."""
    from sinkscope.toy.task import TaskConfig, eval_batch

    model = _toy(layer_norm=True, mlp=True, positional_embedding=True)
    tokens = eval_batch(TaskConfig(d_model=8, seq_len=8, eval_trigger_position=5), 16, 0, "residual").tokens.double()
    heads = [(layer, head) for layer in range(2) for head in range(2)]
    hooked = HookedModel(model)
    edit = CircuitEdit("swap_effective_positions", position=3)
    assert applicability(HookedModel(_toy(positional_embedding=True)), edit) == "no MLP in layer 0"
    readout = anchor_mass_readout(hooked, [hooked.prepare(tokens)], heads, edit, None)
    block = model.blocks[0]
    with torch.no_grad():
        p = model.W_pos[[0, 3]]
        centred = p - p.mean(dim=-1, keepdim=True)
        normed = centred / (centred.pow(2).mean(dim=-1, keepdim=True) + block.ln2.eps).sqrt() * block.ln2.w
        epe = p + torch.relu(normed @ block.mlp.W_in) @ block.mlp.W_out
    shift = epe[1] - epe[0]

    def swap(resid, hook):
        resid = resid.clone()
        resid[:, 0] += shift
        resid[:, 3] -= shift
        return resid

    masses = []
    pattern_hooks = [
        (f"blocks.{layer}.attn.hook_pattern", lambda a, hook: masses.append(a[:, :, 1:, 0].mean(-1)))
        for layer in range(2)
    ]
    with torch.no_grad():
        model.run_with_hooks(tokens, fwd_hooks=[("blocks.0.hook_resid_post", swap), *pattern_hooks])
    expected = torch.cat(masses, dim=1)
    torch.testing.assert_close(readout.anchor_mass, expected, atol=1e-10, rtol=0)
    baseline = anchor_mass_readout(hooked, [hooked.prepare(tokens)], heads, None, None)
    assert not torch.allclose(readout.anchor_mass, baseline.anchor_mass)
