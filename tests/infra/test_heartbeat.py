"""No silent stretch: a step that says nothing for ``HEARTBEAT_S`` seconds gets a
``still ...`` line on stderr; one that reports often gets none; a model's load says it is
still loading while it lasts."""

from __future__ import annotations

import time

import pytest

from sinkscope.infra import heartbeat as heartbeat_module
from sinkscope.infra.heartbeat import heartbeat
from sinkscope.pretrained_analysis.loading import loading_announced


def still_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if "... still" in line]


def test_a_silent_block_gets_a_line_every_interval(capsys):
    with heartbeat("thinking hard", every_s=0.3):
        time.sleep(1.15)
    lines = still_lines(capsys.readouterr().err)
    assert 2 <= len(lines) <= 4, lines
    assert all(line.startswith("  ... still thinking hard (") and line.endswith(" s)") for line in lines)


def test_a_block_that_reports_often_is_not_interrupted(capsys):
    with heartbeat("counting", every_s=0.3) as said:
        for _ in range(12):
            time.sleep(0.1)
            said()
    assert still_lines(capsys.readouterr().err) == []


def test_no_lines_when_progress_is_off(capsys):
    with heartbeat("quiet", enabled=False, every_s=0.1):
        time.sleep(0.4)
    assert capsys.readouterr().err == ""


def test_the_thread_ends_with_the_block_even_on_an_error(capsys):
    with pytest.raises(RuntimeError), heartbeat("failing", every_s=0.1):
        raise RuntimeError("boom")
    time.sleep(0.3)
    assert still_lines(capsys.readouterr().err) == []


def test_a_slow_load_says_it_is_still_loading(capsys, monkeypatch):
    monkeypatch.setattr(heartbeat_module, "LOG_INTERVAL_S", 0.25)  # captured stderr is a log, not a terminal
    with loading_announced("tiny-model"):
        time.sleep(0.7)
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "loading tiny-model (TransformerLens, the weights) ..."
    assert any(line.startswith("  ... still loading tiny-model (") for line in err[1:-1]), err
    assert err[-1].startswith("loaded tiny-model in ")


@pytest.mark.parametrize("terminal", [True, False])
def test_a_log_gets_a_line_at_most_every_log_interval(capsys, monkeypatch, terminal):
    """On a terminal a silent step speaks every HEARTBEAT_S and a bar redraws every second;
    in a log both wait LOG_INTERVAL_S (30 s), so a 2-second silence there says nothing."""
    monkeypatch.setattr(heartbeat_module, "writes_to_terminal", lambda: terminal)
    monkeypatch.setattr(heartbeat_module, "HEARTBEAT_S", 0.3)
    with heartbeat("waiting"):
        time.sleep(1.0)
    lines = still_lines(capsys.readouterr().err)
    assert (len(lines) >= 2) if terminal else lines == [], lines
    bar = heartbeat_module.progress_bar(10, "counting", enabled=True)
    expected = heartbeat_module.TERMINAL_INTERVAL_S if terminal else heartbeat_module.LOG_INTERVAL_S
    assert bar.mininterval == expected == (1.0 if terminal else 30.0)
    bar.close()
