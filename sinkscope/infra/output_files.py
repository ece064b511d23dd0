"""What a writer puts into its output directory, declared once, beside the writer.

A check that a directory holds only what a command writes (``sinkscope demo`` refuses to
replace an audit directory that holds files of the user's) reads the writers'
declarations, never a list of its own: a figure added to a writer is then one name in the
writer's declaration, and no second list elsewhere falls behind it. One did: the demo's
own list lacked the audit's key-geometry figure, so a second ``sinkscope demo`` refused
the directory the first had written.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from sinkscope.infra.errors import InputError
from sinkscope.infra.field_types import check_field_types

INDEX_FIELD = "{index}"


@dataclass(frozen=True)
class OutputFiles:
    """The entries one writer puts into its output directory. ``names``: fixed names, of
    files or folders; ``numbered``: names with one ``{index}`` field, for a file written
    once per item (``attention_example_{index}.png`` for 0, 1, ...). Only names are
    declared, not which of them one run writes: a check of an existing directory does not
    know the options of the run that wrote it."""

    names: tuple[str, ...]
    numbered: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        check_field_types(self)  # a wrong type is named here, not a TypeError further on
        for field, entries in (("names", self.names), ("numbered", self.numbered)):
            for name in entries:
                if not isinstance(name, str) or not name or "/" in name or name in (".", ".."):
                    raise InputError(
                        f"{field} must hold plain entry names (no '/'), got {name!r}; name the entry itself",
                        field=field,
                    )
        for name in self.numbered:
            if name.count(INDEX_FIELD) != 1:
                raise InputError(
                    f"numbered name {name!r} must hold {INDEX_FIELD} once, where the item's number goes",
                    field="numbered",
                )

    def __or__(self, other: OutputFiles) -> OutputFiles:
        """Both declarations: what two writers put into one directory (an audit and its report)."""
        return OutputFiles(self.names + other.names, self.numbered + other.numbered)

    def declares(self, name: str) -> bool:
        """Whether the entry ``name`` is one of these (a numbered name with any number)."""
        if name in self.names:
            return True
        for numbered in self.numbered:
            before, after = numbered.split(INDEX_FIELD)
            if re.fullmatch(re.escape(before) + r"\d+" + re.escape(after), name):
                return True
        return False

    def undeclared(self, directory: Path) -> list[str]:
        """The entries of ``directory`` that no name here declares, sorted (none when
        ``directory`` is not a directory)."""
        if not directory.is_dir():
            return []
        return sorted(entry.name for entry in directory.iterdir() if not self.declares(entry.name))
