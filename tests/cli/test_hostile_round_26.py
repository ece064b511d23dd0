"""Findings of the hostile pass over the sink experiments and the compiled step (round 26)
that belong to the command line as a whole."""

from __future__ import annotations

from sinkscope.cli import main


def test_an_inductor_cache_directory_that_cannot_be_made_is_one_line_naming_it(tmp_path, monkeypatch, capsys):
    """torch makes TORCHINDUCTOR_CACHE_DIR when Adam's first step loads its compiler, compiled
    or not; under a file it failed there with a 59-line traceback."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(blocker / "cache"))
    out = tmp_path / "run"
    assert main(["toy", "train", "--out", str(out), "--max-steps", "5", "--no-progress"]) == 2
    error = capsys.readouterr().err.strip()
    assert "TORCHINDUCTOR_CACHE_DIR=" in error and "not a writable directory" in error and "\n" not in error
    assert not out.exists()
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "not-yet" / "cache"))  # creatable: fine
    assert main(["toy", "train", "--out", str(out), "--max-steps", "5", "--no-progress"]) == 0
