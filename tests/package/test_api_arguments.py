"""The public Python API validates its arguments (issue 22): a wrong type at an entry
point is an ``InputError`` naming the argument (``field``), one line, raised before any
work, never a bare ``TypeError``, ``IndexError`` or ``AttributeError`` from deep inside;
prompts must be strings."""

from __future__ import annotations

from pathlib import Path

import pytest

import sinkscope
from sinkscope.infra.errors import InputError
from tiny_models import TINY_GPT2_PROMPTS, build_tiny_gpt2


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    directory = build_tiny_gpt2(tmp_path_factory.mktemp("api") / "tiny-gpt2")
    return sinkscope.load_model(sinkscope.LoadSpec(str(directory)), progress=False)


def named(error: pytest.ExceptionInfo, argument: str) -> None:
    assert error.value.field == argument, error.value
    assert "\n" not in str(error.value) and argument in str(error.value)


@pytest.mark.parametrize(
    "prompts, index, kind",
    [([b"abc"], 0, "bytes"), ([None, 3.5], 0, "NoneType"), (["fine", 3.5], 1, "float")],
)
def test_audit_prompts_must_be_strings(tiny, prompts, index, kind):
    with pytest.raises(InputError, match=rf"prompts\[{index}\] must be a prompt string, got a {kind}") as error:
        sinkscope.audit(tiny, prompts, progress=False)
    named(error, "prompts")


@pytest.mark.parametrize("prompts", [123, "one string", b"bytes", None])
def test_audit_prompts_must_be_a_list(tiny, prompts):
    with pytest.raises(InputError, match="prompts must be a list of prompt strings") as error:
        sinkscope.audit(tiny, prompts, progress=False)
    named(error, "prompts")


def test_prompt_set_refuses_non_strings():
    with pytest.raises(InputError, match=r"prompts\[1\] must be a prompt string, got a bytes") as error:
        sinkscope.prompt_set(["fine", b"raw"])
    named(error, "prompts")


@pytest.mark.parametrize(
    "arguments, argument",
    [({"config": {"batch_size": 4}}, "config"), ({"progress": "no"}, "progress")],
)
def test_audit_config_and_progress_types(tiny, arguments, argument):
    arguments.setdefault("progress", False)
    with pytest.raises(InputError) as error:
        sinkscope.audit(tiny, TINY_GPT2_PROMPTS, **arguments)
    named(error, argument)


@pytest.mark.parametrize(
    "make, argument",
    [
        (lambda: sinkscope.AuditConfig(batch_size="16"), "batch_size"),
        (lambda: sinkscope.AuditConfig(sink_eps="0.1"), "sink_eps"),
        (lambda: sinkscope.AuditConfig(ablate_prompts=2.5), "ablate_prompts"),
        (lambda: sinkscope.PromptSpec(max_len="64"), "max_len"),
        (lambda: sinkscope.PromptSpec(source=None), "source"),
        (lambda: sinkscope.PromptSpec(prepend_bos="yes"), "prepend_bos"),
        (lambda: sinkscope.LoadSpec(None), "name"),
        (lambda: sinkscope.load_model("gpt2"), "spec"),
    ],
)
def test_settings_of_the_wrong_type(make, argument):
    with pytest.raises(InputError) as error:
        make()
    named(error, argument)


def test_a_prompt_spec_takes_a_path(tmp_path):
    path = tmp_path / "p.txt"
    path.write_text("one prompt\n", encoding="utf-8")
    assert sinkscope.PromptSpec(source=path).source == str(path)


@pytest.mark.parametrize(
    "call, argument",
    [
        (lambda: sinkscope.report(None), "result_dir"),
        (lambda: sinkscope.report(123), "result_dir"),
        (lambda: sinkscope.report(".", out=5), "out"),
        (lambda: sinkscope.report(".", overwrite="yes"), "overwrite"),
        (lambda: sinkscope.read_audit(None), "directory"),
        (lambda: sinkscope.write_audit({"model": "x"}, "out"), "result"),
        (lambda: sinkscope.read_comparison(None), "directory"),
        (lambda: sinkscope.write_comparison(None, "out"), "comparison"),
        (lambda: sinkscope.compare_audits([None]), "results"),
        (lambda: sinkscope.compare_audits(None), "results"),
        (lambda: sinkscope.compare_directories("one-directory", "out"), "directories"),
        (lambda: sinkscope.compare_directories([None], "out"), "directories"),
        (lambda: sinkscope.audit_suite([sinkscope.LoadSpec("gpt2")], "out"), "suite"),
        (lambda: sinkscope.probe_model(None, [b"x"]), "inputs"),
        (lambda: sinkscope.probe_model(None, ["x"], config={}), "config"),
    ],
)
def test_entry_points_name_the_bad_argument(call, argument, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError) as error:
        call()
    named(error, argument)
    assert not Path("out").exists()
