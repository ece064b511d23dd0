"""GGUF checkpoints of the mixture-of-experts families transformers' GGUF reader lists
(Qwen2-MoE, Qwen3-MoE, MiniMax-M2), each a tiny random 2-layer file written here (``tiny_gguf``) in two
quantisation types: loaded through sinkscope's own path, every probe metric equals
transformers' eager attention on the same dequantised weights to 1e-5. Layer 1's attention
reads layer 0's routed experts, so a wrong expert path would show there. A gpt-oss file as
llama.cpp writes it, whose experts and learned sinks that reader leaves unread (and would
start at random), is one short line."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from test_gguf_families import hf_from_gguf, one_line_refusal, pattern_metrics
from test_gqa import direct_head_metrics

from sinkscope.interp.hooked_model import HookedModel
from sinkscope.pretrained_analysis.loading import LoadSpec, load_model
from sinkscope.pretrained_analysis.prompts import PromptSpec, load_prompt_set, tokenize_prompts
from sinkscope.probes.probe import ProbeConfig
from sinkscope.probes.runner import probe_model
from tiny_gguf import MOE_FAMILIES, build_tiny_gguf
from tiny_models import TINY_GPT2_PROMPTS

pytestmark = pytest.mark.skipif(importlib.util.find_spec("gguf") is None, reason="needs the gguf package")
torch.set_num_threads(1)

PROMPTS = TINY_GPT2_PROMPTS + ["Softmax rows sum to one."]
CLASSES = {"qwen2moe": "Qwen2MoeForCausalLM", "qwen3moe": "Qwen3MoeForCausalLM", "minimax-m2": "MiniMaxM2ForCausalLM"}
CASES = [(family, quantization) for family in MOE_FAMILIES for quantization in ("F16", "Q8_0")]


@pytest.fixture(scope="module")
def prompt_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "prompts.txt"
    path.write_text("\n".join(PROMPTS) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module", params=CASES, ids=[f"{family}-{quant}" for family, quant in CASES])
def loaded_pair(request, tmp_path_factory):
    family, quantization = request.param
    path = build_tiny_gguf(tmp_path_factory.mktemp(f"{family}-{quantization}"), family, quantization)
    return family, quantization, path, load_model(LoadSpec(str(path)), progress=False), hf_from_gguf(path)


def file_experts(path, layer: int) -> torch.Tensor:
    """Layer ``layer``'s gate and up expert matrices as the file stores them, dequantised by
    the ``gguf`` package itself and stacked as transformers fuses them."""
    import gguf

    reader = gguf.GGUFReader(path)
    tensors = {tensor.name: tensor for tensor in reader.tensors}

    def read(name: str) -> torch.Tensor:
        tensor = tensors[f"blk.{layer}.{name}.weight"]
        return torch.from_numpy(gguf.quants.dequantize(tensor.data, tensor.tensor_type).copy()).float()

    return torch.cat([read("ffn_gate_exps"), read("ffn_up_exps")], dim=1)


def test_every_probe_metric_matches_transformers_on_the_same_moe_gguf(loaded_pair, prompt_file):
    family, quantization, path, loaded, hf = loaded_pair
    assert (loaded.info.architecture, loaded.info.quantization) == (CLASSES[family], quantization)
    assert loaded.bridge.original_model.config.architectures == [CLASSES[family]]
    # the experts both sides run are the file's, not a fresh initialisation
    for layer in range(2):
        experts = loaded.bridge.original_model.model.layers[layer].mlp.experts.gate_up_proj
        torch.testing.assert_close(experts.detach().float(), file_experts(path, layer), atol=0, rtol=0)
    prompts = tokenize_prompts(load_prompt_set(PromptSpec(source=str(prompt_file), max_len=24)), loaded)
    tokens, mask = prompts.tokens, prompts.attention_mask
    assert not bool(mask.all())  # padded rows are part of the check
    result = probe_model(HookedModel(loaded.bridge), tokens, attention_mask=mask, config=ProbeConfig(batch_size=2))
    with torch.no_grad():
        attentions = hf(tokens, attention_mask=mask.long(), output_attentions=True).attentions
    expected = pattern_metrics(attentions, mask) | direct_head_metrics(hf, tokens, mask)
    for name, values in expected.items():
        if values.dim() == 2:
            measured = result.matrix(name)
        else:
            measured = torch.tensor([getattr(layer, name) for layer in result.layers], dtype=torch.float64)
        torch.testing.assert_close(measured, values, atol=1e-5, rtol=1e-5, msg=f"{family} {quantization} {name}")
    assert float(expected["row_entropy"].min()) < 0.9  # attention is not uniform: the check has teeth


def test_a_gguf_whose_weights_the_reader_leaves_unread_is_one_line(tmp_path, capsys):
    """transformers loads a llama.cpp gpt-oss file without its experts and learned sinks and
    starts them at random, saying so only in a log: the audit refuses it, naming the family."""
    path = build_tiny_gguf(tmp_path / "gpt-oss", "gpt-oss", "Q8_0")
    err = one_line_refusal(["audit", str(path), "--out", str(tmp_path / "out"), "--no-progress"], capsys)
    assert "transformers' GGUF reader does not read 10 weights of the gpt_oss family from tiny-gpt-oss.Q8_0.gguf" in err
    assert not (tmp_path / "out").exists()


def test_a_gguf_family_with_layers_without_attention_is_one_line(tmp_path, capsys):
    """LFM2 (a convolution layer, then an attention layer): transformers reads the file and
    the bridge boots it, but sink probes need every layer's attention."""
    path = build_tiny_gguf(tmp_path / "lfm2", "lfm2", "Q8_0")
    err = one_line_refusal(["audit", str(path), "--out", str(tmp_path / "out"), "--no-progress"], capsys)
    assert "Lfm2ForCausalLM has no attention hooks in layer 0 (1 of 2 layers): the lfm2 family" in err
    assert not (tmp_path / "out").exists()
