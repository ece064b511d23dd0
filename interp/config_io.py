"""Configs are dataclasses; this is how they cross the JSON boundary."""

from __future__ import annotations

from dataclasses import asdict, fields
from typing import Any, TypeVar

ConfigT = TypeVar("ConfigT")


class JsonConfig:
    """Mixin for config dataclasses: ``to_dict()`` and a ``from_dict()`` that refuses
    unknown keys by name (a typo in a config file is an error, not a silent default).
    Subclasses set ``config_name`` for the message."""

    config_name = "config"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls: type[ConfigT], data: dict[str, Any]) -> ConfigT:
        known = {f.name for f in fields(cls)}  # type: ignore[arg-type]
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(
                f"unknown {cls.config_name} config keys {unknown}; known keys: {sorted(known)}"  # type: ignore[attr-defined]
            )
        return cls(**data)
