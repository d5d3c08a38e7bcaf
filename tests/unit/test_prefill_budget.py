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
