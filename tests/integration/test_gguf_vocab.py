"""One vocabulary size from the GGUF to the sampler (issue 46): the tokenizer the importer writes
names exactly the ids the model has rows for, llguidance builds on it, and a file whose declared
tokens disagree with its embedding rows is refused by ``models import`` before any output.

The tokenizers are llama.cpp's real vocab GGUFs (tests/llamacpp.py): ``llama-bpe`` is Llama 3's,
whose transformers conversion appends GPT-2's ``<|endoftext|>`` one id past the 128,256 rows.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from ortserve.engine.guidance import Constraint, Guidance, allocate_masks
from ortserve.errors import ModelError
from ortserve.models.gguf_vocab import tokenizer_size

LLAMA3_ROWS = 128256


@pytest.fixture(scope="module")
def llama3_tokenizer(family_models: dict[str, Path]) -> Path:
    """The importer's output for a Llama-3.2-shaped GGUF with the real ``llama-bpe`` vocabulary
    (tests/integration/family_models.py: imported once, cached)."""
    from tests.llamacpp import source_reader, vocab

    assert len(source_reader(vocab("llama-bpe")).fields["tokenizer.ggml.tokens"].data) == LLAMA3_ROWS
    return family_models["llama3.2-1b"]


def test_written_tokenizer_has_the_model_rows_and_guidance_builds(llama3_tokenizer: Path) -> None:
    assert json.loads((llama3_tokenizer / "genai_config.json").read_text(encoding="utf-8"))["model"][
        "vocab_size"] == LLAMA3_ROWS
    tok = json.loads((llama3_tokenizer / "tokenizer.json").read_text(encoding="utf-8"))
    assert tokenizer_size(llama3_tokenizer / "tokenizer.json") == LLAMA3_ROWS
    assert "<|endoftext|>" not in {a["content"] for a in tok["added_tokens"]}
    g = Guidance(llama3_tokenizer / "tokenizer.json", LLAMA3_ROWS, (128009,))
    guide = g.guide(Constraint.json_schema({"type": "object", "properties": {"a": {"type": "integer"}}}))
    mask = allocate_masks(1, LLAMA3_ROWS)
    guide.compute_mask(mask[0])
    allowed = np.unpackbits(mask[0].view(np.uint8), bitorder="little")[:LLAMA3_ROWS]
    assert 0 < allowed.sum() < LLAMA3_ROWS   # '{' and friends, not everything


def test_an_older_import_with_an_extra_id_loads_with_it_masked(llama3_tokenizer: Path, tmp_path: Path,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    """A tokenizer.json written before the fix (the extra ``<|endoftext|>`` at 128256) loads: the id the
    model has no row for is dropped, with a warning, instead of a 500 at the first constrained request."""
    tok = json.loads((llama3_tokenizer / "tokenizer.json").read_text(encoding="utf-8"))
    tok["added_tokens"].append({"id": LLAMA3_ROWS, "content": "<|endoftext|>", "single_word": False, "lstrip": False,
                                "rstrip": False, "normalized": False, "special": True})
    (tmp_path / "tokenizer.json").write_text(json.dumps(tok), encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="ortserve.engine.guidance"):
        g = Guidance(tmp_path / "tokenizer.json", LLAMA3_ROWS, (128009,))
    assert "1 added token(s) past the model's 128256 rows (<|endoftext|>)" in caplog.text
    assert g.guide(Constraint("regex", "[a-z]+")).vocab_size == LLAMA3_ROWS
    with pytest.raises(ModelError, match="token id 128255 but the model has 1000 vocabulary rows"):
        Guidance(tmp_path / "tokenizer.json", 1000, (2,))   # the model's own vocabulary past the rows: at load


def disagreeing_gguf(path: Path, rows: int) -> Path:
    """A llama file with the llama-spm vocabulary (32,000 tokens) and ``rows`` embedding rows."""
    from tests.llamacpp import source_reader, vocab

    src = source_reader(vocab("llama-spm"))
    w = gguf.GGUFWriter(str(path), "llama")
    for k, v in (("block_count", 1), ("context_length", 64), ("embedding_length", 32), ("feed_forward_length", 64)):
        getattr(w, f"add_{k}")(v)
    w.add_head_count(2)
    w.add_layer_norm_rms_eps(1e-5)
    for key, f in src.fields.items():
        if key.startswith("tokenizer."):
            w.add_key_value(key, f.contents(), f.types[0], sub_type=f.types[-1] if len(f.types) > 1 else None)
    w.add_tensor("token_embd.weight", np.zeros((rows, 32), np.float32))
    w.add_tensor("output_norm.weight", np.ones(32, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_models_import_refuses_tokens_and_rows_that_disagree(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from ortserve.cli.main import cli

    path = disagreeing_gguf(tmp_path / "bad.gguf", 31990)
    env = {"ORTSERVE_HOME": str(tmp_path / "home")}
    res = CliRunner().invoke(cli, ["models", "import", str(path), "--id", "bad"], env=env)
    assert res.exit_code != 0
    assert "declares 32000 tokens (tokenizer.ggml.tokens) but token_embd.weight has 31990 rows" in res.output
    store = tmp_path / "home" / "models"
    assert not store.exists() or not any(p for p in store.rglob("*") if p.is_file() and p.name != ".lock")
