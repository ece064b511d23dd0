"""The command line: exit codes, refusal to overwrite, and the toy subcommands end to end."""

from __future__ import annotations

import json

import pytest

from sinkscope.cli import main


def test_toy_train_writes_a_run_and_refuses_to_overwrite(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["toy", "train", "--out", str(out), "--max-steps", "20", "--no-progress", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["steps"] == 20 and result["status"] == "max_steps"
    assert (out / "model.safetensors").is_file() and (out / "config.json").is_file()
    # same --out again without --resume: a usage error, and the run is untouched
    before = (out / "model.safetensors").read_bytes()
    assert main(["toy", "train", "--out", str(out), "--max-steps", "20", "--no-progress"]) == 2
    assert "--resume" in capsys.readouterr().err
    assert (out / "model.safetensors").read_bytes() == before


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["toy", "train", "--d-model", "3"], "d_model >= 4"),
        (["toy", "train", "--seq-len", "2"], "seq_len >= 3"),
        (["toy", "train", "--attention", "cosine"], "choose one of"),
    ],
)
def test_bad_configs_exit_2_with_a_one_line_message(tmp_path, capsys, argv, fragment):
    code = main([*argv, "--out", str(tmp_path / "x"), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2
    assert fragment in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists()


def test_diverging_run_exits_1(tmp_path, capsys):
    code = main(["toy", "train", "--out", str(tmp_path / "d"), "--lr", "1e12", "--max-steps", "200", "--no-progress"])
    assert code == 1
    assert "--lr" in capsys.readouterr().err


def test_help_shows_examples(capsys):
    for argv in (["toy", "train", "--help"], ["toy", "reproduce", "--help"], ["toy", "tradeoff", "--help"]):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 0
        assert "examples:" in capsys.readouterr().out


def test_tradeoff_command(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["toy", "train", "--out", str(run), "--max-steps", "30", "--no-progress"]) == 0
    capsys.readouterr()
    out = tmp_path / "tradeoff"
    assert main(["toy", "tradeoff", "--run", str(run), "--out", str(out), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data["series"]) == {"softmax construction (scale)", "ReLU construction", "run (W_Q x factor)"}
    assert (out / "tradeoff.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_tradeoff_refuses_an_existing_out_without_overwrite(tmp_path, capsys):
    out = tmp_path / "tradeoff"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert main(["toy", "tradeoff", "--out", str(out)]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert (out / "keep.txt").read_text() == "mine"


def test_every_command_documents_examples_and_exit_codes(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "exit codes: 0 ok, 1 run failed, 2 bad usage or input" in capsys.readouterr().out
    for argv in (["toy", "--help"], ["toy", "probe", "--help"], ["audit", "--help"], ["report", "--help"]):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 0
        assert "examples:" in capsys.readouterr().out, argv
