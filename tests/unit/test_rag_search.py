"""The search path of RagStore without a model: a bag-of-words embedder stands in for MiniLM.

What is checked is the index logic (the in-memory chunk -> file map, filters as masks, the
binary candidate pass, BM25 without the join, one-query result fetch), not ranking quality.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ortserve.errors import NotFound
from ortserve.rag import search as search_mod
from ortserve.rag.index import RagStore

DIM = 64


@dataclass
class _Enc:
    ids: list[int]
    offsets: list[tuple[int, int]]


class _WordTokenizer:
    def encode(self, text: str, add_special_tokens: bool = False) -> _Enc:
        spans = [(m.start(), m.end()) for m in re.finditer(r"\S+", text)]
        return _Enc(list(range(len(spans))), spans)


@dataclass
class _Vectors:
    vectors: np.ndarray


class BagOfWords:
    """Unit vectors summing one random direction per word: shared words mean high cosine."""

    dimensions = DIM
    max_tokens = 256
    tokenizer = _WordTokenizer()

    def embed_texts(self, texts: list[str], truncate: bool = False) -> _Vectors:
        out = np.zeros((len(texts), DIM), np.float32)
        for i, t in enumerate(texts):
            for w in re.findall(r"\w+", t.lower()):
                seed = int.from_bytes(hashlib.sha256(w.encode()).digest()[:4], "little")
                out[i] += np.random.default_rng(seed).standard_normal(DIM).astype(np.float32)
            out[i] /= max(float(np.linalg.norm(out[i])), 1e-6)
        return _Vectors(out)


TOPICS = ["apples oranges pears fruit", "trains rails stations travel", "violins cellos strings music",
          "granite basalt rocks geology"]


@pytest.fixture()
def store(tmp_path: Path) -> tuple[RagStore, str]:
    rag = RagStore(tmp_path, BagOfWords)
    vid = rag.create_store("t", None, "bow")["id"]
    for n in range(12):
        topic = TOPICS[n % 4]
        text = "\n\n".join(f"Note {n}.{j} about {topic} number{n}x{j}." for j in range(6))
        fid = rag.add_file(f"doc{n}.txt", text.encode())["id"]
        rag.add_to_store(vid, fid, attributes={"topic": topic.split()[0], "n": n}, max_tokens=8, overlap=0)
    yield rag, vid
    rag.close()


def _brute(rag: RagStore, vid: str, query: str, keep: Any = lambda a: True) -> list[int]:
    con = rag._store(vid)
    q = BagOfWords().embed_texts([query]).vectors[0]
    attrs = {r[0]: __import__("json").loads(r[1]) for r in con.execute("SELECT file_id, attributes FROM vs_files")}
    rows = [(r[0], float(np.frombuffer(r[2], np.float32) @ q)) for r in
            con.execute("SELECT id, file_id, vector FROM chunks") if keep(attrs[r[1]])]
    return [c for c, _ in sorted(rows, key=lambda x: -x[1])]


@pytest.mark.parametrize("numpy_max", [100000, 8])   # the float32 path, then the binary candidate pass
def test_dense_and_filtered_search_equal_brute_force(store: tuple[RagStore, str], numpy_max: int,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    rag, vid = store
    monkeypatch.setattr(search_mod, "NUMPY_MAX_ROWS", numpy_max)
    q = "a note about violins and rocks"     # every chunk shares words with it: no negative cosine
    got = rag.search(vid, q, k=5, mode="dense")
    assert [_id_of(rag, vid, h) for h in got] == _brute(rag, vid, q)[:5]
    flt = {"type": "eq", "key": "topic", "value": "granite"}
    got = rag.search(vid, q, k=5, mode="dense", filters=flt)
    assert got and all(h["attributes"]["topic"] == "granite" for h in got)
    assert [_id_of(rag, vid, h) for h in got] == _brute(rag, vid, q, lambda a: a["topic"] == "granite")[:5]


def test_binary_pass_keeps_the_rows_nearest_in_sign_bits_then_ranks_them_exactly() -> None:
    """The coarse pass keeps exactly the rows whose sign-bit Hamming distance is at most the
    cand-th smallest (ties included), within a filter's rows; a search returns the float32 order
    of those candidates. (That the exact top k is among them on real embeddings is
    tests/integration/test_rag_binary_pass.py and the recall part of benchmarks/embeddings.py.)"""
    rng = np.random.default_rng(7)
    v = rng.standard_normal((3000, 100)).astype(np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    idx = search_mod.DenseIndex(0, np.arange(10, 3010, dtype=np.int64), v)
    assert idx.bits is not None and idx.bits.shape == (3000, 2)       # 100 bits in two 64-bit words
    signs = np.hstack([v > 0, np.zeros((3000, 28), bool)])
    kept = np.flatnonzero(np.arange(3000) % 3 == 1)
    for qi in (5, 1234):
        q = v[qi] + 0.03 * rng.standard_normal(100).astype(np.float32)
        q /= np.linalg.norm(q)
        ham = (signs != np.hstack([q > 0, np.zeros(28, bool)])).sum(axis=1)
        for rows in (None, kept):
            sub = ham if rows is None else ham[rows]
            want = np.flatnonzero(sub <= np.sort(sub)[299])
            cand = idx.coarse(q, 300, rows)
            assert np.array_equal(np.sort(cand), want if rows is None else rows[want])
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(search_mod, "NUMPY_MAX_ROWS", 100)
                mp.setattr(search_mod, "COARSE_MIN", 300)
                mp.setattr(search_mod, "COARSE_PER_RESULT", 0)
                mp.setattr(search_mod, "COARSE_SHARE", 0.0)
                hits = idx.search(q, 10, rows)
            assert [c - 10 for c, _ in hits] == cand[np.argsort(-(v[cand] @ q))[:10]].tolist()
            assert int(hits[0][0]) - 10 == qi or rows is not None      # the query's own row wins
            assert rows is None or all(c - 10 in set(kept.tolist()) for c, _ in hits)
        assert [c - 10 for c, _ in idx.search(q, 10)] == np.argsort(-(v @ q))[:10].tolist()   # exact path


def _id_of(rag: RagStore, vid: str, hit: dict[str, Any]) -> int:
    return int(rag._store(vid).execute("SELECT id FROM chunks WHERE file_id=? AND idx=?",
                                       (hit["file_id"], hit["chunk_index"])).fetchone()[0])


def test_bm25_filter_reads_past_the_first_page(store: tuple[RagStore, str]) -> None:
    """Most matches of 'note' are filtered out; the k that pass still come back, best first."""
    rag, vid = store
    flt = {"type": "and", "filters": [{"type": "eq", "key": "topic", "value": "trains"},
                                      {"type": "gte", "key": "n", "value": 5}]}
    got = rag.search(vid, "note about", k=7, mode="bm25", filters=flt)
    assert len(got) == 7
    assert {h["attributes"]["n"] for h in got} <= {5, 9} and {h["filename"] for h in got} <= {"doc5.txt", "doc9.txt"}
    none = rag.search(vid, "note", k=3, mode="hybrid", filters={"type": "eq", "key": "topic", "value": "absent"})
    assert none == []


def test_index_follows_removals_and_new_files(store: tuple[RagStore, str]) -> None:
    rag, vid = store
    first = rag.search(vid, "number3x2 granite", k=3, mode="hybrid")
    assert first[0]["filename"] == "doc3.txt" and "number3x2" in first[0]["content"][0]["text"]
    rag.remove_file(vid, first[0]["file_id"])
    after = rag.search(vid, "number3x2 granite", k=20, mode="hybrid")
    assert all(h["filename"] != "doc3.txt" for h in after)
    idx = rag._dense_index(vid)
    assert first[0]["file_id"] not in idx.attrs and len(idx.ids) == len(idx.file_codes) == len(idx.vectors)
    fid = rag.add_file("late.txt", b"A late note on number3x2 and granite.")["id"]
    rag.add_to_store(vid, fid, attributes={"topic": "late"})
    top = rag.search(vid, "number3x2 granite", k=1, mode="hybrid", filters={"type": "eq", "key": "topic",
                                                                           "value": "late"})
    assert [h["filename"] for h in top] == ["late.txt"]


def test_last_active_at_is_written_at_most_once_a_minute(store: tuple[RagStore, str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    rag, vid = store
    clock = [1_000_000.0]
    monkeypatch.setattr("ortserve.rag.index.time.time", lambda: clock[0])
    rag.search(vid, "fruit", k=1)
    assert rag.vector_store(vid)["last_active_at"] == 1_000_000
    clock[0] += 30
    rag.search(vid, "fruit", k=1)
    assert rag.vector_store(vid)["last_active_at"] == 1_000_000
    clock[0] += 31
    rag.search(vid, "fruit", k=1)
    assert rag.vector_store(vid)["last_active_at"] == 1_000_061


def test_index_is_refreshed_not_reloaded_and_chunk_ids_are_never_reused(store: tuple[RagStore, str],
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """After the first load, a change costs a refresh (drop removed rows, append new ids); a file
    replacing the newest one gets new ids, so the refreshed index cannot confuse the two."""
    import ortserve.rag.retrieval as index_mod

    rag, vid = store
    rag.search(vid, "fruit", k=1)
    monkeypatch.setattr(index_mod, "_load_index", lambda *a: pytest.fail("full reload"))
    con = rag._store(vid)
    newest = con.execute("SELECT file_id, max(id) FROM chunks").fetchone()
    rag.remove_file(vid, newest[0])
    fid = rag.add_file("swap.txt", b"Swapped text about quartz and number99x9.")["id"]
    rag.add_to_store(vid, fid, attributes={"topic": "swap"})
    ids = [r[0] for r in con.execute("SELECT id FROM chunks WHERE file_id=?", (fid,))]
    assert min(ids) > newest[1]
    hit = rag.search(vid, "quartz number99x9", k=1, mode="dense")[0]
    assert hit["filename"] == "swap.txt" and hit["attributes"] == {"topic": "swap"}
    before = rag._dense_index(vid)
    n = len(before.ids)
    more = rag.add_file("more.txt", b"More text about obsidian.")["id"]   # appended in place: no copy
    rag.add_to_store(vid, more, attributes={"topic": "more"})
    idx = rag._dense_index(vid)
    assert idx.vectors.base is before.vectors.base and len(before.ids) == n     # the old view is unchanged
    assert rag.search(vid, "more.txt: more text about obsidian", k=1, mode="dense")[0]["filename"] == "more.txt"
    truth = con.execute("SELECT id, vector FROM chunks ORDER BY id").fetchall()
    assert idx.ids.tolist() == [r[0] for r in truth]
    assert np.array_equal(idx.vectors, np.stack([np.frombuffer(r[1], np.float32) for r in truth]))
    assert idx.bits is not None and np.array_equal(idx.bits, search_mod.binarize(idx.vectors))
    assert idx.file_of(ids) == [fid] * len(ids) and newest[0] not in idx.attrs


def test_a_deleted_store_leaves_nothing_behind_in_memory(store: tuple[RagStore, str]) -> None:
    """Stores created, searched and deleted for as long as a server runs (the soak's churn) must not
    grow anything: no connection, dense index or last-active entry stays for a deleted id."""
    rag, vid = store
    rag.search(vid, "fruit", k=1)
    assert vid in rag._stores and vid in rag._dense and vid in rag._touched
    rag.delete_store(vid)
    assert vid not in rag._stores and vid not in rag._dense and vid not in rag._touched
    assert not list((rag.root / "stores").glob(f"{vid}.sqlite*"))


def test_a_store_deleted_during_a_search_is_a_404(store: tuple[RagStore, str], monkeypatch) -> None:
    """The delete lands between the search's first look and its reads (its connection closed under
    it): the search answers 'no such vector store' (404), not a closed-database error (500), and
    nothing re-creates the deleted store's file."""
    rag, vid = store
    bm25 = rag._bm25

    def delete_then_read(*args, **kwargs):
        rag.delete_store(vid)
        return bm25(*args, **kwargs)

    monkeypatch.setattr(rag, "_bm25", delete_then_read)
    with pytest.raises(NotFound) as err:
        rag.search(vid, "fruit", k=1)
    assert err.value.param == "vector_store_id"
    with pytest.raises(NotFound):
        rag._store(vid)   # a late caller that looked before the delete: 404, no new empty store
    assert not list((rag.root / "stores").glob(f"{vid}.sqlite*"))
