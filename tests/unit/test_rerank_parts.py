"""Rerank's model-free parts: ordering, the judge's P(yes), reading a cross-encoder's config, and
the wire model's document rules (the served paths: tests/integration/test_rerank.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from ortserve.errors import InvalidRequest, ModelError
from ortserve.models.rerank_import import is_cross_encoder_dir, rerank_config
from ortserve.rerank import order
from ortserve.rerank.judge import p_yes
from ortserve.server.api.rerank import RerankRequest


def test_order_is_best_first_ties_in_request_order_and_cut_to_top_n() -> None:
    ranked = order([0.2, 0.9, 0.2, 0.5], top_n=3)
    assert [(r.index, r.score) for r in ranked] == [(1, 0.9), (3, 0.5), (0, 0.2)]
    assert len(order([0.1, 0.2])) == 2


def test_p_yes_sums_spellings_and_bounds_a_missing_answer() -> None:
    yes, no = {1, 2}, {3}
    lp = math.log
    # picked "yes" (id 1); "Yes" (2) and "no" (3) among the alternatives
    assert p_yes((1, lp(0.5), [(1, lp(0.5)), (2, lp(0.1)), (3, lp(0.2))]), yes, no) == pytest.approx(0.6 / 0.8)
    # "no" outside the reported top: counted at the last alternative's probability (an upper bound)
    assert p_yes((1, lp(0.7), [(1, lp(0.7)), (9, lp(0.05))]), yes, no) == pytest.approx(0.7 / 0.75)


def _dir(tmp_path: Path, config: dict, tok: dict | None = None) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(config), encoding="utf-8")
    if tok is not None:
        (tmp_path / "tokenizer_config.json").write_text(json.dumps(tok), encoding="utf-8")
    return tmp_path


def test_cross_encoder_config_as_sentence_transformers_reads_it(tmp_path: Path) -> None:
    base = {"architectures": ["BertForSequenceClassification"], "max_position_embeddings": 512}
    d = _dir(tmp_path, {**base, "sbert_ce_default_activation_function": "torch.nn.modules.linear.Identity"},
             {"model_max_length": 256})
    assert is_cross_encoder_dir(d) and rerank_config(d) == {"max_length": 256, "activation": "identity"}
    d = _dir(tmp_path, {**base, "model_type": "xlm-roberta", "max_position_embeddings": 514},
             {"model_max_length": 1e30})   # "no limit": the position embeddings are
    assert rerank_config(d) == {"max_length": 512, "activation": "sigmoid"}
    with pytest.raises(ModelError, match="2 labels"):
        rerank_config(_dir(tmp_path, {**base, "id2label": {"0": "a", "1": "b"}}))
    with pytest.raises(ModelError, match="not supported"):
        rerank_config(_dir(tmp_path, {**base, "sentence_transformers": {"activation_fn": "my.Tanh"}}))
    assert not is_cross_encoder_dir(_dir(tmp_path, {"architectures": ["BertModel"]}))


def test_documents_become_texts_or_a_400_naming_the_field() -> None:
    req = RerankRequest(query="q", documents=["a", {"text": "b", "id": 7}])
    assert req.texts() == ["a", "b"]
    assert RerankRequest(query="q", documents=[{"title": "T", "body": "B"}],
                         rank_fields=["title", "body"]).texts() == ["title: T\nbody: B"]
    for body, param in [({"documents": ["a", {"title": "x"}]}, "documents.1.text"),
                        ({"documents": ["a"], "rank_fields": ["title"]}, "rank_fields"),
                        ({"documents": ["a"], "priority": 1}, "priority")]:
        with pytest.raises(InvalidRequest) as e:
            RerankRequest(query="q", **body).texts()
        assert e.value.param == param
