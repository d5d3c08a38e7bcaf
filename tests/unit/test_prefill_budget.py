"""The prefill time budget's arithmetic (engine/core.py), without a model."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from ortserve.engine.core import MIN_CHUNK, RECENT, EngineCore


def budget(running: int = 8, ratio: float = 2.0, step: float | None = 0.025,
           per_token: float | None = 0.001, chunk: int = 512) -> int:
    core = SimpleNamespace(running=[object()] * running, prefill_ratio=ratio, step_seconds=step,
                           prefill_token_seconds=per_token, chunk_tokens=chunk)
    return EngineCore.prefill_tokens_now(core)  # type: ignore[arg-type]


def test_the_chunk_takes_ratio_times_the_decode_step() -> None:
    assert budget() == 50                     # 2 x 25 ms at 1 ms per prompt token
    assert budget(ratio=3.0) == 75
    assert budget(per_token=0.0005) == 100    # a faster prefill: more tokens in the same time


@pytest.mark.parametrize("kw, expected", [
    ({"running": 0}, 512),                    # nothing decodes: nobody to protect, whole chunks
    ({"ratio": 0.0}, 512),                    # budget off: token chunks only
    ({"step": None}, 512),                    # nothing measured yet
    ({"per_token": None}, 512),
    ({"per_token": 1e-6}, 512),               # never past prefill_chunk
    ({"per_token": 1.0}, MIN_CHUNK),          # never under the floor
])
def test_bounds(kw: dict, expected: int) -> None:
    assert budget(**kw) == expected


def test_the_measurements_are_recent_medians() -> None:
    import collections

    core = SimpleNamespace(_step_times=collections.deque(maxlen=RECENT),
                           _token_times=collections.deque(maxlen=RECENT))
    step = EngineCore.step_seconds.fget
    assert step(core) is None                 # nothing measured: the budget stays off
    core._step_times.extend([0.025] * 10 + [2.0] * 3)  # three steps stretched by a busy machine
    assert step(core) == 0.025                # ... do not move the budget (a mean would be 0.48 s)
    core._step_times.extend([0.040] * RECENT)  # the batch grew: the newest steps take over
    assert step(core) == 0.040


def test_heap_tuning_applies_on_glibc_and_leaves_user_settings() -> None:
    import platform
    import subprocess
    import sys

    code = "from ortserve.engine.core import tune_heap; print(tune_heap())"
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    expected = "True" if sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc" else "False"
    assert out.stdout.strip() == expected
    env.update(MALLOC_ARENA_MAX="4", MALLOC_MMAP_THRESHOLD_="131072")  # the user's own: nothing to do
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "False"


def test_a_stream_that_starts_mid_step_holds_the_rest_of_the_step_to_the_budget() -> None:
    """A short prompt finishes its prefill and starts decoding inside a step that was planned with
    nobody decoding (whole chunks); a long prompt admitted later in the same step is cut to the time
    budget, as in every later step (the race behind the flaky test_time_budgeted_prefill test)."""
    class Seq:
        def __init__(self, name: str, n: int) -> None:
            self.id, self.row, self.cached, self.output_ids, self._ids = name, 0, 0, [], list(range(n))

        def prefix(self) -> list[int]:
            return self._ids

    short, long = Seq("short", 15), Seq("long", 600)
    queue = [short, long]
    calls: list[tuple[str, int, int]] = []  # (sequence, tokens, sequences decoding)
    core = SimpleNamespace(prefilling=None, running=[], prefill_seconds=0.0, prefill_tokens=0)
    core._admit_next = lambda: queue.pop(0) if queue else None
    core.check_fault = lambda *a: None
    core._postprocess = lambda seq, logits: None
    core.runner = SimpleNamespace(prefill=lambda row, ids, **kw: calls.append(
        (current[0].id, len(ids), len(core.running))))
    current: list[Seq] = []
    admit = core._admit_next

    def admit_and_track():
        seq = admit()
        current[:] = [seq] if seq else []
        return seq
    core._admit_next = admit_and_track
    # the step was planned with nothing decoding: 256 tokens; once something decodes, 16
    core.scheduler = SimpleNamespace(record_chunk=lambda *a: None,
                                     prefill_tokens_now=lambda: 16 if core.running else 256)
    EngineCore._prefill(core, 256)  # type: ignore[arg-type]
    assert calls == [("short", 15, 0), ("long", 16, 1)]
    assert long.cached == 16 and core.prefilling is long
