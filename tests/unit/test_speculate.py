"""Prompt-lookup proposals and adaptive k (engine/speculation/speculate.py), without a model."""

from __future__ import annotations

import numpy as np

from ortserve.engine.speculation.speculate import Drafter, lookup


def test_the_longest_suffix_match_proposes_what_followed_it() -> None:
    ctx = np.array([1, 2, 3, 9, 9, 5, 2, 3, 7, 8, 1, 2, 3])
    # 3-gram [1, 2, 3] occurred at 0: what followed was 9, 9, 5
    assert lookup(ctx, 3) == [9, 9, 5]
    assert lookup(ctx, 1) == [9]


def test_a_shorter_ngram_is_tried_when_the_longer_did_not_occur_and_the_latest_match_wins() -> None:
    ctx = np.array([4, 7, 1, 6, 5, 7, 2, 8, 7])
    # no earlier [5, 8, 7] nor [8, 7]; [7] occurred at 1 and 5: the latest, 5, is followed by 2, 8
    assert lookup(ctx, 2) == [2, 8]


def test_no_match_and_degenerate_contexts_propose_nothing() -> None:
    assert lookup(np.array([1, 2, 3, 4]), 4) == []
    assert lookup(np.array([5]), 4) == []
    assert lookup(np.array([1, 1]), 0) == []
    assert lookup(np.array([1, 1]), 3) == [1]  # what follows runs to the end of the context


def test_k_grows_while_guesses_hold_shrinks_on_a_miss_and_backs_off_when_nothing_pays() -> None:
    d = Drafter(k_max=6, k=3)
    ctx = [1, 2, 3, 4, 5, 6, 7, 8, 1, 2]
    assert d.propose(ctx, 10) == [3, 4, 5]
    d.record(3, 3)
    assert d.k == 4 and d.propose(ctx, 10) == [3, 4, 5, 6]
    assert d.propose(ctx, 2) == [3, 4]  # the engine's limit (max_tokens, context, KV budget) wins
    d.record(4, 1)
    assert d.k == 2
    d.record(2, 0)  # nothing accepted: it rests 4 steps, then 8 after the next miss
    assert d.rest == 4
    d.record(1, 0)
    assert d.rest == 8
    rest = d.rest
    assert all(d.propose(ctx, 10) == [] for _ in range(rest))
    assert d.propose(ctx, 10) == [3]
    assert d.stats() == {"proposed": 10, "accepted": 4, "steps": 4, "acceptance": 0.4}


def test_a_single_repeated_token_is_not_enough_of_a_clue_for_the_drafter() -> None:
    d = Drafter(k_max=4, k=4)
    assert d.propose([5, 6, 7, 1, 8, 9, 1], 10) == []      # only the unigram [1] occurred before
    assert d.propose([5, 6, 7, 1, 8, 9, 7, 1], 10) == [8, 9, 7, 1]


def test_a_match_too_near_the_end_gives_way_to_one_followed_by_k_tokens() -> None:
    #                    0  1  2  3  4  5  6  7  8  9 10 11 12
    ctx = np.array([5, 1, 2, 3, 9, 8, 1, 2, 3, 7, 1, 2, 3])
    assert lookup(ctx, 4) == [7, 1, 2, 3]          # the latest [1 2 3] (6..8) has 4 after it
    assert lookup(ctx, 5) == [9, 8, 1, 2, 3]       # it has only 4: the match at 1 has 5
    assert lookup(np.array([4, 6] * 5), 3) == [4, 6, 4]   # a run: not the latest [6 4 6], 2 short


def test_with_a_draft_model_the_stats_add_both_kinds_and_show_each() -> None:
    d = Drafter(k_max=4, k=4)
    d.record(4, 2)
    d.model = Drafter(k_max=4, k=4)
    assert d.model.take(3) == 3
    d.model.record(3, 3)
    d.model.record(4, 0)  # nothing held: the draft rests too, and proposes nothing meanwhile
    assert d.model.rest == 4 and d.model.take(4) == 0
    s = d.stats()
    assert (s["proposed"], s["accepted"], s["steps"], s["acceptance"]) == (11, 5, 3, round(5 / 11, 4))
    assert s["lookup"] == {"proposed": 4, "accepted": 2, "steps": 1, "acceptance": 0.5}
    assert s["draft"] == {"proposed": 7, "accepted": 3, "steps": 2, "acceptance": round(3 / 7, 4)}
    assert "draft" not in Drafter().stats()  # prompt lookup alone: the stats as before
