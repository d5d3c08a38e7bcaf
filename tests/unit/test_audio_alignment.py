"""Word timing's pure parts (audio/alignment.py): the warping path, the median filter, words split
from tokens with their punctuation, and the corrections at a pause. No model."""

from __future__ import annotations

import numpy as np

from ortserve.audio import alignment
from ortserve.audio.alignment import Word


def test_dtw_follows_the_cheap_cells_monotonically() -> None:
    # three tokens spoken at frames 0-1, 2-5 and 6-7: the path stays in each token's row there
    cost = np.ones((3, 8))
    for row, frames in enumerate([range(2), range(2, 6), range(6, 8)]):
        cost[row, list(frames)] = 0.0
    rows, cols = alignment.dtw(cost)
    assert rows[0] == 0 and cols[0] == 0 and rows[-1] == 2 and cols[-1] == 7
    assert (np.diff(rows) >= 0).all() and (np.diff(cols) >= 0).all()
    first = np.concatenate([[True], np.diff(rows) > 0])
    assert cols[first].tolist() == [0, 2, 6]            # where each token begins


def test_dtw_on_a_single_row_and_a_tall_matrix() -> None:
    rows, cols = alignment.dtw(np.zeros((1, 5)))
    assert rows.tolist() == [0] * 5 and cols.tolist() == [0, 1, 2, 3, 4]
    rows, cols = alignment.dtw(np.zeros((4, 2)))
    assert sorted(set(rows.tolist())) == [0, 1, 2, 3] and cols[-1] == 1


def test_median_filter_removes_a_spike_and_keeps_the_shape() -> None:
    x = np.zeros((2, 20))
    x[0, 10] = 9.0                         # a one-frame spike
    x[1, 5:15] = 1.0                       # a plateau
    out = alignment.median_filter(x, 7)
    assert out.shape == x.shape and out[0].max() == 0.0
    assert out[1, 6:14].tolist() == [1.0] * 8 and out[1, 0] == 0.0


VOCAB = {1: " The", 2: " weather", 3: ".", 4: " (", 5: "rain", 6: ")", 7: "ing", 8: "\xe2", 9: "\x82\xac"}


def decode(tokens: list[int]) -> str:
    raw = "".join(VOCAB[t] for t in tokens).encode("latin-1")
    return raw.decode("utf-8", errors="replace")


def test_words_split_at_spaces_and_keep_their_punctuation() -> None:
    words = alignment.merge_punctuation(alignment.split_words([1, 2, 7, 3, 4, 5, 6], decode, "en"))
    assert words == [(" The", [1]), (" weathering.", [2, 7, 3]), (" (rain)", [4, 5, 6])]


def test_tokens_that_end_mid_character_join_until_it_is_whole() -> None:
    words = alignment.split_words([1, 8, 9], decode, "en")      # "€" is two byte-level tokens here
    assert words == [(" The€", [1, 8, 9])]
    assert alignment.split_words([8, 9, 1], decode, "zh") == [("€", [8, 9]), (" The", [1])]


def test_words_of_take_their_times_from_the_token_starts() -> None:
    starts = np.array([0.0, 0.3, 0.5, 0.9, 1.2])                  # 4 tokens and the end of text
    words = alignment.words_of([1, 2, 7, 3], starts, decode, "en", offset=30.0)
    assert [(w.word, w.start, w.end) for w in words] == [("The", 30.0, 30.3), ("weathering.", 30.3, 31.2)]
    assert words[1].to_json() == {"word": "weathering.", "start": 30.3, "end": 31.2}


def test_tidy_cuts_a_word_that_lingers_over_a_pause() -> None:
    words = [Word("north.", 2.3, 3.4, []), Word("Please", 3.4, 5.4, []), Word("send", 5.4, 5.7, []),
             Word("two", 5.7, 5.9, [])]
    alignment.tidy(words[:1], 0.0, 2.8)
    assert (words[0].start, words[0].end) == (2.3, 2.8)               # held inside its segment
    second = alignment.tidy(words[1:], 5.1, 7.8)
    assert second[0].start == 5.1 and second[0].end == 5.4             # after the pause, not across it
    assert [(w.start, w.end) for w in second[1:]] == [(5.4, 5.7), (5.7, 5.9)]


def test_the_import_records_the_alignment_heads(tmp_path) -> None:
    import json

    from ortserve.models.whisper.importer import alignment_heads

    assert alignment_heads(tmp_path, {"alignment_heads": [[3, 1], [5, 6]]}) == [[3, 1], [5, 6]]   # CTranslate2's
    assert alignment_heads(tmp_path, {}) == []                                                    # none known
    (tmp_path / "generation_config.json").write_text(json.dumps({"alignment_heads": [[2, 0]]}), encoding="utf-8")
    assert alignment_heads(tmp_path, {}) == [[2, 0]]                                              # Hugging Face's
    assert alignment.default_heads(6, 2) == [(3, 0), (3, 1), (4, 0), (4, 1), (5, 0), (5, 1)]


def test_median_filter_equals_the_median_of_reflect_padded_windows() -> None:
    """The filter (scipy's, mirror edges) against the definition: np.median over each frame's 7-frame
    window of the reflect-padded scores, on random data of the aligner's shape: equal, not close."""
    x = np.random.default_rng(3).standard_normal((4, 9, 300))
    padded = np.pad(x, [(0, 0), (0, 0), (3, 3)], mode="reflect")
    want = np.median(np.lib.stride_tricks.sliding_window_view(padded, 7, axis=-1), axis=-1)
    assert np.array_equal(alignment.median_filter(x, 7), want)
