"""RAG pieces without a model: parsers, chunk offsets and overlap, filters, fusion, the question set."""

from __future__ import annotations

import io
import itertools
import json
import re
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from ortserve.errors import InvalidRequest
from ortserve.rag.ingest import chunk_text, html_text, parse, safe_filename
from ortserve.rag.search import check_filter, fts_query, matches, rrf

DATA = Path(__file__).resolve().parent.parent / "data"


def word_tokenizer(text: str) -> Tokenizer:
    vocab = {w: i for i, w in enumerate(sorted(set(re.findall(r"\w+|[^\w\s]", text))) + ["[UNK]"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return tok


def test_chunks_have_offsets_overlap_and_sentence_ends() -> None:
    text = " ".join(f"Sentence number {i} is here." for i in range(200))
    chunks = chunk_text(text, word_tokenizer(text), max_tokens=50, overlap=10)
    assert len(chunks) > 10 and all(c.tokens <= 50 for c in chunks)
    for a, b in itertools.pairwise(chunks):
        assert text[a.start:a.end].strip() == a.text and b.start < a.end      # offsets exact; overlapping
    assert all(c.text.endswith(".") for c in chunks[:-1])                      # cut at sentence ends
    assert chunks[-1].end == len(text)


def test_parsers_and_refusals() -> None:
    assert "Hello" in parse("a.md", b"# Hello\n\nworld")
    html = html_text("<html><script>evil()</script><style>x{}</style><p>Kept &amp; decoded</p></html>")
    assert html == "Kept & decoded"
    for name, data in [("a.exe", b"x"), ("a.txt", b""), ("a.txt", b"\x00\x01binary"), ("a.pdf", b"nope"),
                       ("a.txt", "é".encode("latin-1") * 10)]:
        with pytest.raises(InvalidRequest):
            parse(name, data)
    for bad in ["../x.txt", "a/b.txt", "..", "a\\b.txt", "x\x00.txt", ""]:
        with pytest.raises(InvalidRequest):
            safe_filename(bad)
    assert safe_filename("notes v2.md") == "notes v2.md"


def test_pdf_text_through_pypdf() -> None:
    from pypdf import PdfWriter

    w = PdfWriter()
    w.add_blank_page(200, 200)
    buf = io.BytesIO()
    w.write(buf)
    with pytest.raises(InvalidRequest, match="no text"):
        parse("blank.pdf", buf.getvalue())


def test_filters_fusion_and_fts_query() -> None:
    f = check_filter({"type": "and", "filters": [{"type": "eq", "key": "lang", "value": "en"},
                                                 {"type": "gte", "key": "year", "value": 2020}]})
    assert matches(f, {"lang": "en", "year": 2021}) and not matches(f, {"lang": "en", "year": 2019})
    assert not matches({"type": "gt", "key": "year", "value": 1}, {"year": "x"})
    for bad in [{"type": "like"}, {"type": "and", "filters": []}, {"type": "eq", "key": "k"}, "x",
                {"type": "eq", "key": "k", "value": 1, "extra": 2}]:
        with pytest.raises(InvalidRequest):
            check_filter(bad)
    fused = rrf([1, 2, 3], [3, 1])
    assert [c for c, _ in fused] == [1, 3, 2] and fused[0][1] <= 1.0
    assert fts_query('what is "OR" NEAR(x)?') == '"near" OR "x"'            # stopwords left out
    assert fts_query("what is it?") == '"what" OR "is" OR "it"'               # unless nothing is left
    weighted = rrf([1, 2], [2, 1], weights=(1.0, 2.0))
    assert [c for c, _ in weighted] == [2, 1]                                 # the heavier list wins a tie
    assert rrf([1], [1], weights=(1.0, 2.0))[0][1] == pytest.approx(1.0)


def test_question_set_answers_exist_in_the_shipped_docs() -> None:
    qs = json.loads((DATA / "rag_questions.json").read_text(encoding="utf-8"))
    assert len(qs) >= 50
    qs += json.loads((DATA / "rag_questions_fresh.json").read_text(encoding="utf-8"))

    def norm(s: str) -> str:
        return re.sub(r"\s+", " ", s).strip().lower()

    for q in qs:
        assert norm(q["answer"]) in norm((DATA / "rag_docs" / q["file"]).read_text(encoding="utf-8")), q
