"""The serving process's periodic heap trim (engine/heap.py): glibc keeps freed small allocations
in its arenas, so a never-idle server hands them back every ``every_s`` seconds. The decision is
tested on an injected clock; the trim itself is glibc's, called for real once."""

from __future__ import annotations

import sys

from tests.clocks import ManualClock, wait_until

from ortserve.engine.heap import HEAP_TRIM_EVERY_S, HeapTrimmer, start_heap_trimmer


def test_trims_once_per_interval_on_the_clock_and_counts_what_it_gave_back() -> None:
    clock = ManualClock(start=0.0)
    rss = [1000]
    calls: list[float] = []

    def trim() -> None:
        calls.append(clock())
        rss[0] -= 300            # the trim hands 300 bytes back

    t = HeapTrimmer(30.0, clock=clock, trim=trim, rss=lambda: rss[0])
    assert not t.tick()          # just started: not due
    clock.advance(29.9)
    assert not t.due() and not t.tick()
    clock.advance(0.1)
    assert t.tick() and calls == [30.0]
    assert not t.tick()          # the interval starts again from the trim
    rss[0] += 500                # the load frees more
    clock.advance(45.0)
    assert t.tick() and calls == [30.0, 75.0]
    assert (t.trims, t.released_bytes) == (2, 600)
    clock.advance(30.0)
    rss_grows = HeapTrimmer(0.0, clock=clock, trim=lambda: rss.__setitem__(0, rss[0] + 50), rss=lambda: rss[0])
    assert rss_grows.tick() and rss_grows.released_bytes == 0   # RSS that grew meanwhile gives back nothing


def test_the_thread_trims_for_real_and_stops() -> None:
    t = HeapTrimmer(0.01).start()  # real clock, real malloc_trim: the wait is for the event itself
    try:
        if sys.platform.startswith("linux"):
            assert wait_until(lambda: t.trims >= 2)
    finally:
        t.stop()
    assert t._thread is None     # joined: the thread has ended


def test_the_setting_picks_the_interval_or_turns_it_off() -> None:
    assert start_heap_trimmer({"ORTSERVE_HEAP_TRIM_S": "0"}) is None
    for env, every in (({}, HEAP_TRIM_EVERY_S), ({"ORTSERVE_HEAP_TRIM_S": "5"}, 5.0),
                       ({"ORTSERVE_HEAP_TRIM_S": "soon"}, HEAP_TRIM_EVERY_S)):
        t = start_heap_trimmer(env)
        if not sys.platform.startswith("linux"):
            assert t is None
            continue
        assert t is not None and t.every_s == every
        t.stop()
