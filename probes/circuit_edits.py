"""The sink-circuit edits: changes to the parts that could build an anchor sink, each as
forward hooks on any hooked model that has the part (docs/metrics.md, "Sink circuit").

A sink head's query finds the anchor when ``q · k_anchor`` is large. The edits take away
one candidate source of that product at a time:

- ``null_query_bias``: the heads' query bias b_Q subtracted at ``hook_q`` (q = x W_Q + b_Q);
  ``random_query_bias``, its control, adds a random vector of the same norm per head.
- ``replace_first_position``: the anchor's learned position embedding replaced by that of
  a later position ``position``; ``remove_positions`` zeroes every position embedding;
  ``swap_later_positions``, their control, swaps ``position`` and ``position + 1``.
- ``swap_effective_positions``: the anchor's effective position embedding EPE_0 and that of
  ``position`` exchanged in layer 0's output, EPE_i = p_i + MLP0(LN2_0(p_i)) (the position
  embedding and what the first MLP writes from it alone): resid_post0[0] += EPE_p - EPE_0
  and the reverse at ``position``; ``swap_later_effective_positions``, its control, does the
  same to ``position`` and ``position + 1``.
- ``zero_anchor_write``: layer ``layer``'s MLP (or attention) output zeroed at the anchor
  only; ``zero_random_write``, its control, zeroes it at one random later real position
  per input.
- ``zero_key_dims``: input dimensions of W_K zeroed, per layer (``key_dims``: the battery
  picks, in each sink layer, those where the anchor's key input is largest), applied at
  ``hook_k`` as k - x[dims] W_K[dims]; ``zero_random_key_dims`` is the same edit on
  other dimensions.
- ``replace_anchor_token``: the anchor's token embedding replaced by that of the input's last
  real token, whose copy no later query can see (the next token's would make positions 0 and
  1 identical twins that split the sink between them)
  (a control: a sink built from position alone should survive it).
- ``offset_positions``: rotary models' position ids started at ``offset`` instead of 0, so
  the anchor no longer sits at position 0 (the rotary tables at ``hook_cos``/``hook_sin``
  rotated by offset * inv_freq); rotary scores depend only on i - j, so theory predicts
  no change.

``applicability(model, edit)`` says why a model cannot take an edit (no query bias, no
learned position embeddings), so that a battery lists it as not applicable. Edits read
the anchor from the batch; inputs must be right-padded, so the anchor is position 0.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, get_args

import torch
from einops import einsum
from jaxtyping import Float

from sinkscope.infra.errors import InputError
from sinkscope.interp.hook_names import attn_hook, block_hook
from sinkscope.interp.hooked_model import FwdHooks, HookedModel, PreparedBatch

EditKind = Literal[
    "null_query_bias",
    "random_query_bias",
    "replace_first_position",
    "remove_positions",
    "swap_later_positions",
    "swap_effective_positions",
    "swap_later_effective_positions",
    "zero_anchor_write",
    "zero_random_write",
    "zero_key_dims",
    "zero_random_key_dims",
    "replace_anchor_token",
    "offset_positions",
]
EDIT_KINDS: tuple[str, ...] = get_args(EditKind)
# what each control does, in the words of the reports (the edits carry their row's label)
CONTROL_LABELS: dict[str, str] = {
    "random_query_bias": "a random query shift of the bias's norm",
    "swap_later_positions": "two later positions' embeddings swapped",
    "swap_later_effective_positions": "two later positions' EPEs swapped",
    "zero_random_write": "the same write zeroed at a random later position",
    "zero_random_key_dims": "as many random key dimensions zeroed",
}


def control_label(kind: str) -> str:
    """A control's description for reports (its kind where none is written)."""
    return CONTROL_LABELS.get(kind, kind)


WritePart = Literal["mlp", "attn"]
HeadRef = tuple[int, int]


@dataclass(frozen=True)
class CircuitEdit:
    """One edit. ``heads``: the query-bias edits' heads; ``layer``: the write edits' layer;
    ``part``: whose write (``mlp`` or ``attn``); ``key_dims``: (layer, dimensions) pairs of
    the key edits; ``position``: the later position of the position edits; ``seed``: the
    random controls' draw."""

    kind: EditKind
    heads: tuple[HeadRef, ...] = ()
    layer: int = 0
    part: WritePart = "mlp"
    key_dims: tuple[tuple[int, tuple[int, ...]], ...] = ()
    position: int = 1
    offset: int = 256
    seed: int = 0

    def __post_init__(self) -> None:
        if self.kind not in EDIT_KINDS:
            raise InputError(f"unknown circuit edit {self.kind!r}; choose one of {', '.join(EDIT_KINDS)}")
        if self.part not in get_args(WritePart):
            raise InputError(f"part must be 'mlp' or 'attn', got {self.part!r}")
        if self.position < 1:
            raise InputError(f"position must be a later position (>= 1), got {self.position}")
        if self.offset < 1:
            raise InputError(f"offset must be >= 1, got {self.offset}")


# what a model has ----------------------------------------------------------------------
def query_bias(model: HookedModel, layer: int) -> Float[torch.Tensor, "head d_head"] | None:
    """``layer``'s query bias, or None when the model has none (or it is all zero, as a
    bridge reports for a family without one)."""
    bias = getattr(model.model.blocks[layer].attn, "b_Q", None)
    if not isinstance(bias, torch.Tensor) or not bool(bias.detach().abs().sum() > 0):
        return None
    return bias.detach()


def has_learned_positions(model: HookedModel) -> bool:
    """Whether the model adds learned absolute position embeddings (GPT-2's ``wpe``, a
    toy model built with ``pos_embed``): rotary and position-free models have none."""
    if model.is_bridge:
        return getattr(model.model, "pos_embed", None) is not None
    return getattr(model.model, "W_pos", None) is not None


def effective_positions(model: HookedModel, positions: list[int]) -> Float[torch.Tensor, "pos d_model"]:
    """EPE_i = p_i + MLP0(LN2_0(p_i)) at ``positions``: the learned position embedding and
    what layer 0's MLP (after its norm, where it has one) writes from it alone."""
    W_pos = model.model.pos_embed.original_component.weight if model.is_bridge else model.model.W_pos
    block = model.model.blocks[0]
    norm = getattr(block, "ln2", None)
    with torch.no_grad():
        p = W_pos.detach()[positions].unsqueeze(0)  # [1, pos, d_model]
        return (p + block.mlp(p if norm is None else norm(p)))[0]


def key_input_hook(model: HookedModel, layer: int) -> tuple[str, torch.Tensor | None]:
    """The hook carrying what ``layer``'s W_K multiplies, and a gain to apply to it first:
    the first norm's output (bridges), a toy model's normalised residual times its layer
    norm's gain (the toy's hook reads before the gain), or the residual."""
    if model.is_bridge:
        return f"blocks.{layer}.ln1.hook_out", None
    norm = getattr(model.model.blocks[layer], "ln1", None)
    if norm is None:
        return block_hook(layer, "resid_pre"), None
    return f"blocks.{layer}.ln1.hook_normalized", norm.w.detach()


def rotary_hooks(model: HookedModel) -> list[tuple[str, torch.Tensor, float]]:
    """``(hook name, inv_freq, attention scaling)`` for every rotary table hook
    (``*.hook_cos``, ``*.hook_sin``) of a bridge whose rotary module keeps its frequencies
    (``inv_freq``); empty otherwise."""
    if not model.is_bridge:
        return []
    found = []
    for name in sorted(model.spec.hook_names):
        if not name.endswith((".hook_cos", ".hook_sin")):
            continue
        module = getattr(model.model.get_submodule(name.rsplit(".", 1)[0]), "original_component", None)
        inv_freq = getattr(module, "inv_freq", None)
        if isinstance(inv_freq, torch.Tensor):
            found.append((name, inv_freq.detach(), float(getattr(module, "attention_scaling", 1.0))))
    return found


def _rotary_offset_hook(inv_freq: torch.Tensor, scaling: float, offset: int, is_cos: bool) -> Callable[..., Any]:
    """The rotary table recomputed for positions offset + 0, 1, ..., in the standard
    cat(freqs, freqs) layout; the unedited table must equal it at offset 0 (else the
    family's layout differs and the edit is refused rather than guessed)."""
    trig = torch.cos if is_cos else torch.sin

    def table_at(n_pos: int, start: int, device: torch.device) -> torch.Tensor:
        positions = torch.arange(start, start + n_pos, dtype=torch.float64, device=device)
        freqs = torch.outer(positions, inv_freq.double().to(device))
        return trig(torch.cat([freqs, freqs], dim=-1)) * scaling

    def hook(table: Float[torch.Tensor, "batch pos rot"], hook: Any) -> torch.Tensor:
        n_pos = table.shape[-2]
        if table.shape[-1] != 2 * inv_freq.shape[0] or not torch.allclose(
            table.double(), table_at(n_pos, 0, table.device).expand_as(table), atol=1e-4
        ):
            raise InputError(
                f"{hook.name} is not the standard rotary table of positions 0..{n_pos - 1}; offset_positions does not apply"
            )
        return table_at(n_pos, offset, table.device).to(table.dtype).expand_as(table).clone()

    return hook


def write_hook(model: HookedModel, layer: int, part: WritePart) -> str | None:
    """The hook carrying ``layer``'s MLP or attention output, or None without one."""
    if part == "attn":
        return model.attention_output_hook(layer)
    if not model.is_bridge and getattr(model.model.blocks[layer], "mlp", None) is None:
        return None  # a toy block without an MLP has the hook point, which never fires
    name = block_hook(layer, "mlp_out")
    return name if name in model.spec.hook_names else None


def applicability(model: HookedModel, edit: CircuitEdit) -> str | None:
    """None when ``model`` can take ``edit``; else why not, in a few words."""
    kind, spec = edit.kind, model.spec
    if kind in ("null_query_bias", "random_query_bias"):
        for layer, head in edit.heads:
            if not (0 <= layer < spec.n_layers and 0 <= head < spec.n_heads):
                raise InputError(f"head L{layer}H{head} is outside the model ({spec.n_layers} x {spec.n_heads})")
        layers = sorted({layer for layer, _ in edit.heads})
        return None if all(query_bias(model, layer) is not None for layer in layers) else "no query bias"
    if kind in ("replace_first_position", "remove_positions", "swap_later_positions"):
        return None if has_learned_positions(model) else "no learned position embeddings"
    if kind in ("swap_effective_positions", "swap_later_effective_positions"):
        if not has_learned_positions(model):
            return "no learned position embeddings"
        return None if write_hook(model, 0, "mlp") is not None else "no MLP in layer 0"
    if kind == "offset_positions":
        return None if rotary_hooks(model) else "no rotary position embeddings"
    if kind == "replace_anchor_token":
        return None if "hook_embed" in spec.hook_names else "no token embedding hook"
    layers = [edit.layer] if kind in ("zero_anchor_write", "zero_random_write") else [at for at, _ in edit.key_dims]
    for layer in layers:
        if not 0 <= layer < spec.n_layers:
            raise InputError(f"layer {layer} is outside the model's {spec.n_layers} layers")
    if kind in ("zero_anchor_write", "zero_random_write"):
        return None if write_hook(model, edit.layer, edit.part) is not None else f"no {edit.part} output"
    for _, dims in edit.key_dims:
        if not dims or any(not 0 <= dim < spec.d_model for dim in dims):
            raise InputError(f"key dimensions must lie in [0, {spec.d_model}); got {list(dims)}")
    return None


# hooks ---------------------------------------------------------------------------------
def random_query_shift(
    bias: Float[torch.Tensor, "head d_head"], seed: int, layer: int
) -> Float[torch.Tensor, "head d_head"]:
    """Per head, a random direction scaled to the norm of that head's query bias: the
    control that moves q as far as nulling the bias does (drawn from ``seed`` and ``layer``)."""
    generator = torch.Generator().manual_seed(seed * 10_007 + layer)
    direction = torch.randn(bias.shape, generator=generator, dtype=torch.float64)
    norms = bias.double().norm(dim=-1, keepdim=True) / direction.norm(dim=-1, keepdim=True)
    return (direction * norms).to(bias.dtype)


def _query_bias_hook(model: HookedModel, layer: int, heads: list[int], edit: CircuitEdit) -> Callable[..., Any]:
    bias = query_bias(model, layer)
    assert bias is not None  # applicability checked it
    shift = random_query_shift(bias, edit.seed, layer) if edit.kind == "random_query_bias" else -bias

    def hook(q: Float[torch.Tensor, "batch pos head d_head"], hook: Any) -> torch.Tensor:
        edited = q.clone()
        edited[:, :, heads] = q[:, :, heads] + shift[heads].to(q.device, q.dtype)
        return edited

    return hook


def _position_hook(edit: CircuitEdit) -> Callable[..., Any]:
    def hook(embedding: Float[torch.Tensor, "*batch pos d_model"], hook: Any) -> torch.Tensor:
        n_pos = embedding.shape[-2]
        if edit.kind != "remove_positions" and edit.position + 1 >= n_pos:
            raise InputError(f"position {edit.position} needs inputs of at least {edit.position + 2} tokens")
        if edit.kind == "remove_positions":
            return torch.zeros_like(embedding)
        edited = embedding.clone()
        if edit.kind == "replace_first_position":
            edited[..., 0, :] = embedding[..., edit.position, :]
        else:  # swap_later_positions
            edited[..., edit.position, :] = embedding[..., edit.position + 1, :]
            edited[..., edit.position + 1, :] = embedding[..., edit.position, :]
        return edited

    return hook


def _effective_swap_hook(model: HookedModel, edit: CircuitEdit) -> Callable[..., Any]:
    first = 0 if edit.kind == "swap_effective_positions" else edit.position
    second = edit.position if edit.kind == "swap_effective_positions" else edit.position + 1
    epe = effective_positions(model, [first, second])
    shift = epe[1] - epe[0]

    def hook(resid: Float[torch.Tensor, "batch pos d_model"], hook: Any) -> torch.Tensor:
        if second >= resid.shape[1]:
            raise InputError(f"position {edit.position} needs inputs of at least {second + 1} tokens")
        moved = shift.to(resid.device, resid.dtype)
        edited = resid.clone()
        edited[:, first] += moved
        edited[:, second] -= moved
        return edited

    return hook


def random_later_positions(batch: PreparedBatch, seed: int) -> torch.Tensor:
    """``[batch]`` one real position after the anchor per input, drawn uniformly with ``seed``."""
    positions = torch.arange(batch.n_pos, device=batch.anchor.device)
    candidates = batch.attention_mask & (positions.unsqueeze(0) > batch.anchor.unsqueeze(1))
    if not bool(candidates.any(dim=1).all()):
        raise InputError("every input needs a real token after the anchor; drop one-token inputs")
    draws = torch.rand(candidates.shape, generator=torch.Generator().manual_seed(seed)).to(candidates.device)
    return draws.masked_fill(~candidates, -1.0).argmax(dim=1)


def _write_hook(batch: PreparedBatch, edit: CircuitEdit) -> Callable[..., Any]:
    at = batch.anchor if edit.kind == "zero_anchor_write" else random_later_positions(batch, edit.seed)
    rows = torch.arange(batch.anchor.shape[0], device=batch.anchor.device)

    def hook(output: Float[torch.Tensor, "batch pos d_model"], hook: Any) -> torch.Tensor:
        edited = output.clone()
        edited[rows, at.to(output.device)] = 0.0
        return edited

    return hook


def _key_dims_hooks(model: HookedModel, layer: int, dims: list[int]) -> FwdHooks:
    """Capture ``layer``'s key input, then remove what its ``dims`` add to k: x[dims] W_K[dims]."""
    W_K = model.model.blocks[layer].attn.W_K.detach()[:, dims, :]  # [kv_head, dim, d_head]
    name, gain = key_input_hook(model, layer)
    captured: dict[str, torch.Tensor] = {}

    def capture(x: torch.Tensor, hook: Any) -> None:
        captured["x"] = x if gain is None else x * gain.to(x.device, x.dtype)

    def remove(k: Float[torch.Tensor, "batch pos kv_head d_head"], hook: Any) -> torch.Tensor:
        x = captured.pop("x")[..., dims]
        return k - einsum(x, W_K.to(x.device, x.dtype), "batch pos dim, head dim d_head -> batch pos head d_head")

    return [(name, capture), (attn_hook(layer, "k"), remove)]


def _anchor_token_hook(batch: PreparedBatch) -> Callable[..., Any]:
    rows = torch.arange(batch.anchor.shape[0], device=batch.anchor.device)
    last = batch.attention_mask.long().sum(dim=1) - 1  # right-padded: the last real position

    def hook(embedding: Float[torch.Tensor, "batch pos d_model"], hook: Any) -> torch.Tensor:
        edited = embedding.clone()
        edited[rows, batch.anchor] = embedding[rows, last.to(embedding.device)]
        return edited

    return hook


def edit_hooks(model: HookedModel, batch: PreparedBatch, edit: CircuitEdit) -> FwdHooks:
    """Forward hooks applying ``edit`` to ``batch``; an edit the model cannot take is refused
    in one line (the battery asks ``applicability`` first)."""
    why_not = applicability(model, edit)
    if why_not is not None:
        raise InputError(f"{edit.kind} does not apply to this model: it has {why_not}")
    if bool((batch.anchor != 0).any()):
        raise InputError("circuit edits need the anchor at position 0: pad inputs on the right")
    kind = edit.kind
    if kind in ("null_query_bias", "random_query_bias"):
        layers = sorted({layer for layer, _ in edit.heads})
        heads = {layer: [head for at, head in edit.heads if at == layer] for layer in layers}
        return [(attn_hook(layer, "q"), _query_bias_hook(model, layer, heads[layer], edit)) for layer in layers]
    if kind in ("replace_first_position", "remove_positions", "swap_later_positions"):
        return [("hook_pos_embed", _position_hook(edit))]
    if kind in ("swap_effective_positions", "swap_later_effective_positions"):
        return [(block_hook(0, "resid_post"), _effective_swap_hook(model, edit))]
    if kind in ("zero_anchor_write", "zero_random_write"):
        name = write_hook(model, edit.layer, edit.part)
        assert name is not None  # applicability checked it
        return [(name, _write_hook(batch, edit))]
    if kind in ("zero_key_dims", "zero_random_key_dims"):
        return [hook for layer, dims in edit.key_dims for hook in _key_dims_hooks(model, layer, list(dims))]
    if kind == "offset_positions":
        return [
            (name, _rotary_offset_hook(inv_freq, scaling, edit.offset, name.endswith("cos")))
            for name, inv_freq, scaling in rotary_hooks(model)
        ]
    return [("hook_embed", _anchor_token_hook(batch))]
