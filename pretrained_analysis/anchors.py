"""The anchor token's id and its name in words, for prompts and reports. Which token
is the anchor, and how it got there, is decided per tokenizer in
``sinkscope.interp.anchors``."""

from __future__ import annotations

from typing import Any

from sinkscope.pretrained_analysis.prompt_files import PromptError


def anchor_token_id(tokenizer: Any, causal: bool, name: str) -> int:
    """The id of the token put first: BOS, or [CLS] for an encoder."""
    token = tokenizer.bos_token_id
    if not causal and tokenizer.cls_token_id is not None:
        token = tokenizer.cls_token_id
    if token is None:
        raise PromptError(
            f"the tokenizer of {name} has no BOS or [CLS] token; turn prepend_bos off", field="prepend_bos"
        )
    return int(token)


def anchor_words(how: str, token: str) -> str:
    """The anchor in words, for the report and the findings."""
    if how == "cls":
        return f"{token}, the first token" if token else "[CLS], the first token"
    if how == "tokenizer":
        return f"the BOS token {token}, added by the tokenizer itself"
    if how == "absent":
        return f"each prompt's first token (the tokenizer has no BOS token; the first prompt's is {token})"
    if how == "off":
        return "the first real token of each prompt (no BOS prepended)"
    return f"the prepended BOS token {token}" if token else "the prepended BOS token"
