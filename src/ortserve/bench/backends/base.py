"""The contract every backend keeps, and the spec the runner hands it."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from ortserve.bench.measure import Timing, now
from ortserve.bench.workload import Prompt


@dataclass
class Spec:
    """What a worker needs: the ONNX model dir and the same model as GGUF / Hugging Face dir."""

    model_dir: str
    gguf: str | None = None
    hf_dir: str | None = None
    max_batch: int = 1
    max_length: int = 2048
    threads: int = 0  # 0: the runtime's default (all cores)
    extra: dict[str, Any] = field(default_factory=dict)


class Backend:
    """Load in ``__init__``; ``run`` one batch; ``quality`` scores the model on the held-out text."""

    batches = False

    def __init__(self, spec: Spec) -> None:
        self.spec = spec

    def run(self, prompts: list[Prompt], gen_tokens: int) -> list[Timing]:
        raise NotImplementedError

    def quality(self) -> dict[str, Any] | None:
        return None

    def info(self) -> dict[str, Any]:
        return {}

    def pids(self) -> list[int]:
        """Processes whose memory counts as this backend's (the server backend adds its server)."""
        return [os.getpid()]

    def close(self) -> None:
        pass


def log_softmax_pick(logits: Any, targets: Any) -> Any:
    """log p(target) per row of a (T, V) logits array, in float64."""
    import numpy as np

    x = np.asarray(logits, dtype=np.float64)
    m = x.max(-1, keepdims=True)
    lse = m[:, 0] + np.log(np.exp(x - m).sum(-1))
    return x[np.arange(len(targets)), np.asarray(targets)] - lse


def perplexity_from(logprobs: Any, method: str) -> dict[str, Any]:
    import numpy as np

    lp = np.asarray(logprobs, dtype=np.float64)
    return {"perplexity": float(np.exp(-lp.mean())), "tokens": int(lp.size), "method": method}


class FirstTokenClock:
    """A generate() streamer that notes when the first generated tokens arrive (the first put is the prompt)."""

    def __init__(self, t0: float) -> None:
        self.t0, self.calls, self.first = t0, 0, 0.0

    def put(self, value: Any) -> None:
        self.calls += 1
        if self.calls == 2:
            self.first = now() - self.t0

    def end(self) -> None:
        pass
