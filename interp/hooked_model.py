"""The hooked-model contract: one small adapter that tells probes what a model offers.

Probes and interventions run on two kinds of models:
- toy models: ``transformer_lens.HookedRootModule`` subclasses whose blocks are
  ``blocks[l].attn`` with ``W_O [head, d_head, d_model]``, ``n_heads`` and ``d_head``
  attributes (``sinkscope.toy.attention.HookedAttention``); they take float tokens
  ``[batch, pos, d_model]`` and have no padding;
- ``TransformerBridge`` models (GPT-2, GPT-NeoX/Pythia, BERT, ...): they take strings or
  token ids ``[batch, pos]`` plus an ``attention_mask``.

``HookedModel(model)`` wraps either and answers: the sizes (with ``n_kv_heads`` for
grouped- and multi-query attention, where ``hook_k``/``hook_v`` carry fewer heads than
``hook_q``/``hook_pattern``/``hook_z``), which hook names exist,
whether attention is causal, the attention kind (only ``softmax`` rows sum to one),
``W_O``/``b_O`` per layer, and whether an edit returned at ``hook_pattern`` reaches the
output (false for BERT-family bridges, where the wrapped Hugging Face module has
already consumed the pattern). It also turns user inputs into a ``PreparedBatch``: what
to pass to ``forward`` plus a boolean ``attention_mask [batch, pos]`` and the per-row
anchor (the first real token, so left padding works).
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias, cast, overload

import torch
from jaxtyping import Bool, Float, Int, Shaped
from transformer_lens import HookedRootModule

from sinkscope.infra.errors import InputError
from sinkscope.interp.anchors import anchor_how
from sinkscope.interp.attention_kinds import validate_attention_kind
from sinkscope.interp.hook_names import attn_hook, block_hook, no_pattern_layers
from sinkscope.interp.model_spec import ModelSpec
from sinkscope.interp.visibility import bridge_reach, key_visibility, layer_reach

HookFn = Callable[..., Any]
FwdHooks = list[tuple[str, HookFn]]
# what forward takes: float tokens for toy models, token ids for bridges
ModelInput: TypeAlias = Float[torch.Tensor, "batch pos d_model"] | Int[torch.Tensor, "batch pos"]
# what forward returns: toy outputs or a bridge's logits
ModelOutput: TypeAlias = Float[torch.Tensor, "batch pos d_model"] | Float[torch.Tensor, "batch pos vocab"]


@dataclass
class PreparedBatch:
    """One batch ready for a forward pass.

    model_input: what ``forward`` takes (float tokens for toy models, token ids for
    bridges); attention_mask: True at real tokens; anchor: each row's first real token.
    """

    model_input: ModelInput
    attention_mask: Bool[torch.Tensor, "batch pos"]
    anchor: Int[torch.Tensor, " batch"]

    @property
    def batch_size(self) -> int:
        return int(self.attention_mask.shape[0])

    @property
    def n_pos(self) -> int:
        return int(self.attention_mask.shape[1])

    def select(self, rows: Int[torch.Tensor, " n"]) -> PreparedBatch:
        """The sub-batch of ``rows`` (a long index)."""
        return PreparedBatch(self.model_input[rows], self.attention_mask[rows], self.anchor[rows])


def anchor_positions(attention_mask: Bool[torch.Tensor, "batch pos"]) -> Int[torch.Tensor, " batch"]:
    """First True position of each row of ``attention_mask``."""
    if not bool(attention_mask.any(dim=1).all()):
        raise InputError("a row of attention_mask has no real token; drop empty inputs before probing")
    return attention_mask.to(torch.long).argmax(dim=1)


class _StopForward(Exception):
    """Ends a forward pass early; raised only by ``_stop_forward`` and caught only in
    ``HookedModel.run_with_hooks``."""


def _stop_forward(tensor: torch.Tensor, hook: Any) -> None:
    raise _StopForward


def _is_bridge(model: torch.nn.Module) -> bool:
    # A bridge can only exist once its package is imported, and importing it just to
    # check costs about 2.4 s (toy evaluations would pay it in every worker process).
    bridge_package = sys.modules.get("transformer_lens.model_bridge")
    return bridge_package is not None and isinstance(model, bridge_package.TransformerBridge)


class HookedModel:
    """Adapter over a toy ``HookedRootModule`` or a ``TransformerBridge``.

    ``HookedModel(model)`` inspects the model once; for bridges whose writability of
    ``hook_pattern`` is unknown, one two-token forward pass with an edited pattern
    decides it (an edit that does not change the output means read-only).
    """

    def __init__(self, model: torch.nn.Module, prepend_bos: bool | None = None) -> None:
        if isinstance(model, HookedModel):
            raise InputError("model is already a HookedModel; pass it directly instead of wrapping it again")
        if not isinstance(model, HookedRootModule) and not _is_bridge(model):
            raise InputError(
                f"{type(model).__name__} is not a hooked model; pass a toy HookedRootModule "
                "or a TransformerBridge (TransformerBridge.boot_transformers(...))"
            )
        # duck-typed: a toy HookedRootModule or a TransformerBridge, whose attributes (blocks,
        # cfg, tokenizer) nn.Module's typing cannot see
        self.model: Any = cast(Any, model)
        self.is_bridge = _is_bridge(model)
        self._prepend_for_strings: bool | None = None  # decided on the first strings (a tokenizer reload)
        hook_names = frozenset(self.model.hook_dict.keys())
        if self.is_bridge:
            cfg = self.model.cfg
            skipped = no_pattern_layers(model, hook_names, int(cfg.n_layers))
            first = min(set(range(int(cfg.n_layers))) - {row.layer for row in skipped})
            self.spec = ModelSpec(
                family="bridge",
                n_layers=int(cfg.n_layers),
                n_heads=int(cfg.n_heads),
                d_head=int(cfg.d_head),
                d_model=int(cfg.d_model),
                causal=getattr(cfg, "attention_dir", "causal") != "bidirectional",
                attention="softmax",
                pattern_writable=self._bridge_pattern_writable(first),
                prepend_bos=bool(getattr(cfg, "default_prepend_bos", True)) if prepend_bos is None else prepend_bos,
                n_kv_heads=int(getattr(cfg, "n_key_value_heads", None) or cfg.n_heads),
                **bridge_reach(model, int(cfg.n_layers)),
                no_pattern_layers=skipped,
                hook_names=hook_names,
            )
        else:
            blocks = getattr(model, "blocks", None)
            if blocks is None or len(blocks) == 0 or not hasattr(blocks[0], "attn"):
                raise InputError(
                    f"{type(model).__name__} has no blocks[l].attn; toy models must stack "
                    "sinkscope.toy.attention.HookedAttention layers under .blocks"
                )
            attn = blocks[0].attn
            self.spec = ModelSpec(
                family="toy",
                n_layers=len(blocks),
                n_heads=int(attn.n_heads),
                d_head=int(attn.d_head),
                d_model=int(attn.d_model),
                causal=True,
                attention=validate_attention_kind(getattr(attn, "attention", "softmax")),
                pattern_writable=True,
                prepend_bos=None,
                hook_names=hook_names,
            )

    # weights -------------------------------------------------------------------------
    def W_O(self, layer: int) -> Float[torch.Tensor, "head d_head d_model"]:
        """Output projection of ``layer``."""
        return self.model.blocks[layer].attn.W_O.detach()

    def attention_output_hook(self, layer: int) -> str | None:
        """The hook carrying ``layer``'s attention output sum_h z_h W_O[h] + b_O
        ``[batch, pos, d_model]``, or None when the model has none.

        Bridges: the output projection's own hook (``attn.o.hook_out``), not
        ``hook_attn_out``, which Gemma 2's post-attention norm and BERT's LayerNorm
        follow. Toy models: ``hook_attn_out``, the attention's output itself."""
        name = f"blocks.{layer}.attn.o.hook_out" if self.is_bridge else block_hook(layer, "attn_out")
        return name if name in self.spec.hook_names else None

    def b_O(self, layer: int) -> Float[torch.Tensor, " d_model"] | None:
        """Output bias of ``layer``, or None when the model has none."""
        bias = getattr(self.model.blocks[layer].attn, "b_O", None)
        return None if bias is None else bias.detach()

    # inputs --------------------------------------------------------------------------
    def prepare(
        self,
        inputs: ModelInput | str | Sequence[str],
        attention_mask: Shaped[torch.Tensor, "batch pos"] | None = None,
        padding_side: str | None = None,
    ) -> PreparedBatch:
        """Turn user inputs into a ``PreparedBatch``.

        Toy models: ``inputs [batch, pos, d_model]`` float, no padding. Bridges: a string,
        a list of strings (tokenized with the model's BOS convention and padded on
        ``padding_side``), or token ids ``[batch, pos]`` with an optional
        ``attention_mask [batch, pos]`` (1/True at real tokens).
        """
        device = self._device()
        if not self.is_bridge:
            if not torch.is_tensor(inputs) or inputs.ndim != 3 or inputs.shape[-1] != self.spec.d_model:
                raise InputError(
                    f"toy models take float tokens [batch, pos, {self.spec.d_model}]; "
                    f"got {type(inputs).__name__} {tuple(getattr(inputs, 'shape', ()))}"
                )
            if attention_mask is not None and not bool(attention_mask.bool().all()):
                raise InputError("toy models have no padding; pass attention_mask=None or all ones")
            mask = torch.ones(inputs.shape[:2], dtype=torch.bool, device=device)
            return PreparedBatch(inputs.to(device), mask, torch.zeros(inputs.shape[0], dtype=torch.long, device=device))
        if isinstance(inputs, str) or (isinstance(inputs, Sequence) and not torch.is_tensor(inputs)):
            strings = [inputs] if isinstance(inputs, str) else list(inputs)
            if not strings or not all(isinstance(s, str) and s for s in strings):
                raise InputError("inputs must be a non-empty list of non-empty strings (or token ids [batch, pos])")
            if attention_mask is not None:
                raise InputError("attention_mask is computed from strings; pass it only with token ids")
            from transformer_lens.utilities.tokenize_utils import get_attention_mask

            side = padding_side or self.model.tokenizer.padding_side
            prepend = self._strings_prepend_bos()
            tokens = self.model.to_tokens(strings, prepend_bos=prepend, padding_side=side)
            mask = get_attention_mask(self.model.tokenizer, tokens, prepend, padding_side=side)
        elif torch.is_tensor(inputs) and inputs.ndim == 2 and not inputs.is_floating_point():
            tokens = inputs
            mask = torch.ones_like(tokens) if attention_mask is None else attention_mask
            if mask.shape != tokens.shape:
                raise InputError(f"attention_mask {tuple(mask.shape)} must match token ids {tuple(tokens.shape)}")
        else:
            raise InputError("bridge models take a string, a list of strings or token ids [batch, pos] (long)")
        if tokens.shape[1] > int(getattr(self.model.cfg, "n_ctx", tokens.shape[1])):
            raise InputError(
                f"sequence of {tokens.shape[1]} tokens exceeds the model's context of "
                f"{self.model.cfg.n_ctx}; shorten the prompts"
            )
        mask = mask.to(device).bool()
        return PreparedBatch(tokens.to(device), mask, anchor_positions(mask))

    def _strings_prepend_bos(self) -> bool:
        """Whether strings get a BOS in front: the BOS convention, except for a causal
        model whose tokenizer has no BOS token (Qwen), where TransformerLens' copy would
        stand its EOS in as one; nothing is prepended there, as the tokenizer's own call
        gives it (``sinkscope.interp.anchors``)."""
        if self._prepend_for_strings is None:
            self._prepend_for_strings = bool(self.spec.prepend_bos) and (
                anchor_how(self.model.tokenizer, self.spec.causal, True) != "absent"
            )
        return self._prepend_for_strings

    # running -------------------------------------------------------------------------
    def forward_kwargs(self, batch: PreparedBatch) -> dict[str, Any]:
        """Keyword arguments that go with ``batch.model_input`` (the bridge's attention mask)."""
        if not self.is_bridge:
            return {}
        return {"attention_mask": batch.attention_mask.to(torch.long)}

    @overload
    def run_with_hooks(self, batch: PreparedBatch, fwd_hooks: FwdHooks) -> ModelOutput: ...

    @overload
    def run_with_hooks(
        self, batch: PreparedBatch, fwd_hooks: FwdHooks, stop_after: str | None
    ) -> ModelOutput | None: ...

    def run_with_hooks(
        self, batch: PreparedBatch, fwd_hooks: FwdHooks, stop_after: str | None = None
    ) -> ModelOutput | None:
        """Forward ``batch`` with temporary hooks; returns the model output (toy outputs or logits).

        ``stop_after``: a hook name at which the pass ends, right after that hook point's
        hooks from ``fwd_hooks`` ran; nothing downstream runs and None is returned. For
        callers that only read activations: stopping after the last block skips a
        bridge's final layer norm and unembedding, whose ``[batch, pos, vocab]`` logits
        are the largest tensor of the pass. The temporary hooks are removed either way
        (TransformerLens removes them in a ``finally``).
        """
        hooks = list(fwd_hooks) + self._release_pattern_hooks()
        if stop_after is not None:
            if stop_after not in self.spec.hook_names:
                raise InputError(
                    f"stop_after={stop_after!r} is not a hook of this {self.spec.family} model; "
                    f"pass a hook name such as {block_hook(self.spec.n_layers - 1, 'resid_post')!r}"
                )
            # appended last, so it runs after every other hook on the same hook point
            hooks.append((stop_after, _stop_forward))
        try:
            return self.model.run_with_hooks(batch.model_input, fwd_hooks=hooks, **self.forward_kwargs(batch))
        except _StopForward:
            return None

    def forward(self, batch: PreparedBatch) -> ModelOutput:
        return self.run_with_hooks(batch, [])

    def _release_pattern_hooks(self) -> FwdHooks:
        """TransformerLens 4.3's attention bridges keep each layer's pattern in
        ``attn._pattern`` (never read again), so a forward pass holds every layer's pattern
        alive. Clearing it as each attention layer finishes keeps at most one layer's
        pattern in memory, which is what probes promise."""
        if not self.is_bridge:
            return []
        hooks: FwdHooks = []
        for layer in self.spec.pattern_layers:
            name, block = f"blocks.{layer}.attn.hook_out", self.model.blocks[layer]
            if hasattr(block.attn, "_pattern") and name in self.spec.hook_names:  # hook_dict is rebuilt per access
                hooks.append((name, lambda tensor, hook, attn=block.attn: setattr(attn, "_pattern", None)))
        return hooks

    def visible_keys(self, batch: PreparedBatch, layer: int) -> Bool[torch.Tensor, "batch query key"]:
        """Keys each query of ``layer`` sees (``sinkscope.interp.visibility.key_visibility``)."""
        return key_visibility(batch.attention_mask, self.spec.causal, *layer_reach(self.spec, layer))

    def _device(self) -> torch.device:
        parameter = next(self.model.parameters(), None)
        return parameter.device if parameter is not None else torch.device("cpu")

    def _bridge_pattern_writable(self, layer: int) -> bool:
        """Whether an edit at ``blocks.{layer}.attn.hook_pattern`` (the first layer with a
        pattern) changes the bridge's output.

        Decided once per bridge (two tiny forwards that still read every weight) and
        remembered on the bridge, since adapters are built per call."""
        cached = getattr(self.model, "_sinkscope_pattern_writable", None)
        if cached is None:
            cached = self._probe_pattern_writable(layer)
            self.model._sinkscope_pattern_writable = cached
        return cached

    def _probe_pattern_writable(self, layer: int) -> bool:
        tokenizer = self.model.tokenizer
        token = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.cls_token_id
        tokens = torch.full((1, 2), int(token if token is not None else 0), device=self._device())
        tokens[0, 1] = 1 if tokens[0, 0] != 1 else 2

        def to_last_key(pattern: torch.Tensor, hook: Any) -> torch.Tensor:
            edited = torch.zeros_like(pattern)
            edited[..., -1] = 1.0
            return edited

        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            plain = self.model(tokens)
            edited = self.model.run_with_hooks(tokens, fwd_hooks=[(attn_hook(layer, "pattern"), to_last_key)])
        return not torch.equal(plain, edited)
