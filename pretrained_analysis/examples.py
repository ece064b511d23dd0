"""The attention examples an audit draws: the patterns of a few prompts in the heads that
matter, the strongest sink heads by anchor mass and, for contrast, the head that sinks
least, with every token labelled as readable text."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from sinkscope.interp.hook_names import attn_hook
from sinkscope.interp.hooked_model import HookedModel
from sinkscope.pretrained_analysis.loading import LoadedModel
from sinkscope.pretrained_analysis.prompts import TokenizedPrompts

if TYPE_CHECKING:
    from sinkscope.probes.probe import ProbeResult

EXAMPLE_SINK_HEADS = 3  # the strongest sink heads drawn, strongest first; then one head for contrast
EXAMPLE_TEXT_CHARS = 400  # of each example prompt kept for its caption (a report shows less)
TOKEN_LABEL_CHARS = 14  # a longer ordinary token is cut with "…"; special tokens are shown whole
# what a token's invisible characters are drawn as, so a label is never blank or misleading
VISIBLE = {"\n": "⏎", "\r": "␍", "\t": "⇥"}


@dataclass(frozen=True)
class AttentionExample:
    """One prompt's attention in a few heads: ``patterns[k]`` ``[query, key]`` is head
    ``heads[k]`` = (layer, head), over the prompt's real tokens; ``tokens``: the tokenizer's
    own strings, ``labels``: the same tokens as readable text (``readable_tokens``);
    ``roles[k]``: why head k is shown (e.g. "sink head, anchor mass 0.99")."""

    prompt_index: int
    tokens: tuple[str, ...]
    labels: tuple[str, ...]
    heads: tuple[tuple[int, int], ...]
    roles: tuple[str, ...]
    patterns: np.ndarray


def plot_text(text: str) -> str:
    """``text`` safe for a matplotlib label: control characters shown as ``?``, ``$`` escaped
    (no mathtext)."""
    return "".join(ch if ch.isprintable() else "?" for ch in text).replace("$", r"\$")


def token_label(text: str, special: bool = False) -> str:
    """A token's text as a plot label: line breaks and tabs as visible signs, a leading or
    trailing space dropped (a space-only token as ␣), an ordinary token cut at
    ``TOKEN_LABEL_CHARS``; a special token whole."""
    if not special:
        text = "".join(VISIBLE.get(ch, ch) for ch in text)
        text = text.strip(" ") or ("␣" if text else "")
        if len(text) > TOKEN_LABEL_CHARS:
            text = text[: TOKEN_LABEL_CHARS - 1] + "…"
    return plot_text(text) or "''"


def readable_tokens(tokenizer: Any, ids: list[int]) -> tuple[str, ...]:
    """Each token as a reader would write it: special tokens as themselves
    (``<|im_start|>``), others decoded one by one (no BPE markers: ``Ġwas`` is ``was``,
    ``Ċ`` a line break ⏎, WordPiece's ``##lls`` is ``lls``)."""
    specials = set(getattr(tokenizer, "all_special_ids", ()) or ())
    wordpiece = _joins_wordpieces(tokenizer)
    labels = []
    for token_id, token in zip(ids, tokenizer.convert_ids_to_tokens(ids)):
        if token_id in specials:
            labels.append(token_label(str(token), special=True))
        elif wordpiece and str(token).startswith(WORDPIECE_PREFIX) and len(str(token)) > len(WORDPIECE_PREFIX):
            labels.append(token_label(str(token)[len(WORDPIECE_PREFIX) :]))  # "##lls" continues a word: "lls"
        elif hasattr(tokenizer, "convert_tokens_to_string"):
            labels.append(token_label(tokenizer.convert_tokens_to_string([token])))
        else:
            labels.append(token_label(tokenizer.decode([token_id])))
    return tuple(labels)


def with_token_texts(probe: ProbeResult, tokenizer: Any) -> ProbeResult:
    """``probe`` with its secondary-sink and massive-activation tokens as readable text."""
    if probe.secondary_sinks is None or tokenizer is None:
        return probe
    texts = probe.secondary_sinks.with_token_text(lambda token_id: readable_tokens(tokenizer, [token_id])[0])
    return replace(probe, secondary_sinks=texts)


WORDPIECE_PREFIX = "##"


def _joins_wordpieces(tokenizer: Any) -> bool:
    """Whether the tokenizer marks a word's continuation pieces with ``##`` (BERT's
    WordPiece): then ``"##lls"`` reads as ``lls``. A byte-level BPE vocabulary may hold
    ``##`` as text (a Markdown heading), which must stay as it is."""
    try:
        return tokenizer.convert_tokens_to_string(["a", WORDPIECE_PREFIX + "b"]) == "ab"
    except Exception:  # a tokenizer without that call, or one that rejects unknown tokens
        return False


def example_heads(probe: ProbeResult, n_sinks: int = EXAMPLE_SINK_HEADS) -> tuple[tuple[tuple[int, int], str], ...]:
    """The heads an example shows, each with why: the ``n_sinks`` sink heads with the largest
    anchor mass (the heads with the largest anchor mass when none is a sink head), then the
    measured head with the smallest anchor mass, for contrast."""
    measured = [head for head in probe.heads if not math.isnan(head.anchor_mass)]
    ranked = sorted(measured, key=lambda head: (-head.anchor_mass, head.layer, head.head))
    sinks = [head for head in ranked if head.is_sink_head]
    shown = [
        ((head.layer, head.head), f"sink head, anchor mass {head.anchor_mass:.2f}") for head in sinks[:n_sinks]
    ] or [((head.layer, head.head), f"no sink head; anchor mass {head.anchor_mass:.2f}") for head in ranked[:n_sinks]]
    others = [head for head in ranked if not head.is_sink_head and (head.layer, head.head) not in dict(shown)]
    if others:
        low = others[-1]
        shown.append(((low.layer, low.head), f"contrast: not a sink head, anchor mass {low.anchor_mass:.2f}"))
    return tuple(shown)


def _patterns(hooked: HookedModel, batch: Any, heads: tuple[tuple[int, int], ...]) -> np.ndarray:
    """``[len(heads), query, key]``: the attention of ``heads`` on one prepared prompt.

    Each hook keeps only the shown heads' rows of its layer, never a whole
    ``[head, query, key]`` pattern: on a long prompt one layer's pattern is hundreds of MiB."""
    layers = sorted({layer for layer, _ in heads})
    captured: dict[tuple[int, int], np.ndarray] = {}

    def capture(layer: int):
        shown = [head for head_layer, head in heads if head_layer == layer]

        def hook(pattern: torch.Tensor, hook: Any) -> None:
            for head in shown:
                # a copy: a view (or numpy over it) would keep the whole layer's storage alive
                captured[layer, head] = pattern[0, head].float().cpu().clone().numpy()

        return hook

    with torch.inference_mode():  # read-only hooks; nothing after the last pattern shown is needed
        hooked.run_with_hooks(
            batch,
            [(attn_hook(layer, "pattern"), capture(layer)) for layer in layers],
            stop_after=attn_hook(layers[-1], "pattern"),
        )
    return np.stack([captured[head] for head in heads])


def attention_examples(
    hooked: HookedModel, model: LoadedModel, prompts: TokenizedPrompts, n_examples: int, probe: ProbeResult
) -> tuple[AttentionExample, ...]:
    chosen = example_heads(probe)
    if not chosen:
        return ()
    heads = tuple(head for head, _ in chosen)
    tokenizer = model.bridge.tokenizer
    examples = []
    for index in range(min(n_examples, len(prompts))):
        batch = hooked.prepare(*prompts.batch(index, index + 1))
        ids = batch.model_input[0].tolist()
        examples.append(
            AttentionExample(
                prompt_index=index,
                tokens=tuple(str(token) for token in tokenizer.convert_ids_to_tokens(ids)),
                labels=readable_tokens(tokenizer, ids),
                heads=heads,
                roles=tuple(role for _, role in chosen),
                patterns=_patterns(hooked, batch, heads),
            )
        )
    return tuple(examples)
