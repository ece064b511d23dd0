"""``OutputFiles``: a writer's declaration of the entries it puts into its output directory."""

from __future__ import annotations

import pytest

from sinkscope.infra.errors import InputError
from sinkscope.infra.output_files import OutputFiles


def test_fixed_and_numbered_names_are_declared_and_nothing_else():
    files = OutputFiles(("audit.json", "report_figures"), numbered=("attention_example_{index}.png",))
    assert files.declares("audit.json") and files.declares("report_figures")
    assert files.declares("attention_example_0.png") and files.declares("attention_example_12.png")
    for name in ("attention_example_.png", "attention_example_x.png", "attention_example_1.png.bak", "notes.txt"):
        assert not files.declares(name), name


def test_undeclared_lists_the_other_entries_sorted(tmp_path):
    files = OutputFiles(("a.json",), numbered=("fig_{index}.png",))
    assert files.undeclared(tmp_path / "missing") == []
    for name in ("a.json", "fig_3.png", "z.txt", "b.csv"):
        (tmp_path / name).write_text("")
    (tmp_path / "folder").mkdir()
    assert files.undeclared(tmp_path) == ["b.csv", "folder", "z.txt"]


def test_two_writers_into_one_directory_declare_both():
    both = OutputFiles(("audit.json",)) | OutputFiles(("report.html",), numbered=("x_{index}.png",))
    assert both == OutputFiles(("audit.json", "report.html"), numbered=("x_{index}.png",))


@pytest.mark.parametrize(
    ("names", "numbered", "field"),
    [
        (("figures/a.png",), (), "names"),
        (("",), (), "names"),
        ((".",), (), "names"),
        ((1,), (), "names"),
        (["a.json"], (), "names"),
        ((), ("example.png",), "numbered"),
        ((), ("example_{index}_{index}.png",), "numbered"),
    ],
)
def test_a_malformed_declaration_is_one_input_error_naming_the_field(names, numbered, field):
    with pytest.raises(InputError) as raised:
        OutputFiles(names, numbered)
    assert raised.value.field == field and "\n" not in str(raised.value)
