"""Every numeric flag of every command is bounded where it is parsed (issue 34, item 4).

The flags are found by walking ``build_parser()``, so a new flag cannot skip this: each
flag with a ``type`` is either numeric, and its type carries the declared range it checks
(``bound``, from ``sinkscope.infra.bounds`` or a config's ``BOUNDS``), or one of the
named non-numeric types. Every value outside that range (2**63, 10**20, a negative, an
infinity or NaN) is refused while parsing: exit 2, one line on stderr naming the flag, no
traceback, nothing written, before any model loads.
"""

from __future__ import annotations

import argparse
import math
import os

import pytest

from sinkscope.cli import args as cli_args
from sinkscope.cli.audit_experiment_flags import input_type_list
from sinkscope.cli.entry import main
from sinkscope.cli.parser import build_parser
from sinkscope.infra.bounds import MAX_INT

NOT_NUMERIC = {
    cli_args.out_path,
    cli_args.device_name,
    cli_args.prompt_text,
    cli_args.str_list,
    cli_args.switch_list,
    input_type_list,
}
HUGE = (str(2**63), str(10**20))
NEGATIVE = ("-1",)
NOT_FINITE = ("1e999", "-1e999", "nan")


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(command words, its parser) for every command that runs (toy train, audit, ...)."""
    subcommands = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
    if not subcommands:
        yield path, parser
    for action in subcommands:
        for name, sub in action.choices.items():
            yield from _commands(sub, (*path, name))


def _base_argv(parser: argparse.ArgumentParser, out: str) -> list[str]:
    """The least a command parses: each positional and each required flag given a value."""
    argv: list[str] = []
    for action in parser._actions:
        if not action.option_strings:
            argv.append("x")
        elif action.required:
            argv += [action.option_strings[0], out if action.dest.startswith(("out", "run_dir")) else "x"]
    return argv


def _numeric_flags():
    for words, parser in _commands(build_parser()):
        for action in parser._actions:
            if action.option_strings and action.type is not None and action.type not in NOT_NUMERIC:
                yield words, action


def _refused_values(kind) -> list[str]:
    """The values outside the flag's declared range: huge, negative, not finite."""
    refused = []
    for text in (*HUGE, *NEGATIVE, *NOT_FINITE):
        value = int(text) if text.lstrip("-").isdigit() else float(text)  # integers compared exactly
        if isinstance(value, float) and not math.isfinite(value) or not kind.bound.admits(value):
            refused.append(text)
    return refused


CASES = [
    pytest.param(words, action.option_strings[0], text, id=f"{' '.join(words)} {action.option_strings[0]} {text}")
    for words, action in _numeric_flags()
    for text in _refused_values(action.type)
]


def test_every_typed_flag_is_numeric_with_a_declared_range_or_named_as_not_numeric():
    flags = list(_numeric_flags())
    undeclared = [f"{' '.join(w)} {a.option_strings[0]}" for w, a in flags if not hasattr(a.type, "bound")]
    assert undeclared == []
    # a range that lets a huge value through is no range: every numeric flag refuses 2**63 or 10**20
    open_ended = [
        f"{' '.join(w)} {a.option_strings[0]}" for w, a in flags if not set(HUGE) & set(_refused_values(a.type))
    ]
    # a rate (--lr) may be any finite positive number: a huge one diverges, which the run reports
    assert open_ended == ["toy train --lr"]
    assert len(flags) >= 50  # the walk found the commands' flags


@pytest.mark.parametrize(("words", "flag", "text"), CASES)
def test_a_value_outside_the_flags_range_is_refused_while_parsing(words, flag, text, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a default --out (sinkscope-out/...) would land here
    parser = dict(_commands(build_parser()))[words]
    action = next(a for a in parser._actions if flag in a.option_strings)
    value = getattr(action.type, "value_format", "{}").format(text)
    argv = [*words, *_base_argv(parser, str(tmp_path / "out")), f"{flag}={value}"]
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert f"argument {'/'.join(action.option_strings)}" in err, err
    assert os.listdir(tmp_path) == []


def test_the_largest_value_a_range_admits_parses():
    """The ranges are the readers' own: 2**63 - 1, what a result file holds, still parses."""
    parser = dict(_commands(build_parser()))[("toy", "train")]
    args = parser.parse_args(["--out", "x", "--max-steps", str(MAX_INT), "--seed", str(MAX_INT)])
    assert args.max_steps == MAX_INT and args.seed == MAX_INT
