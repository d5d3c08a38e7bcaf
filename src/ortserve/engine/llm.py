"""LLM: the synchronous facade for scripts, in the shape of nano-vllm's API.

    llm = LLM("path/to/model-dir")      # a model directory or a LoadedModel
    outs = llm.generate(["Hi", [{"role": "user", "content": "Hi"}]], SamplingParams(max_tokens=64))
    for piece in llm.stream("Once upon a time"): print(piece, end="")

A store id ("smollm2-135m") is looked up by the model store, a floor above the engine:
``ortserve.llm.LLM`` takes one and builds this facade on the directory it finds.
"""

from __future__ import annotations

import queue
import sys
import uuid
from collections.abc import Iterator
from collections.abc import Sequence as Seq
from pathlib import Path
from typing import Any, Self

from ortserve.engine.detokenize import IncrementalDetokenizer
from ortserve.engine.engine import AsyncEngine, LoadedModel
from ortserve.engine.sequence import Sequence
from ortserve.errors import OrtServeError
from ortserve.types import GenerationOutput, SamplingParams, TokenEvent

Prompt = str | list[dict[str, Any]]


class GenerationError(OrtServeError):
    status = 500


class LLM:
    def __init__(self, model: str | Path | LoadedModel, settings: Any = None) -> None:
        if not isinstance(model, LoadedModel):
            model_dir = Path(model).expanduser()   # loading it reports what is missing
            model = LoadedModel(model_dir, settings, model_dir.name)
        self.engine = AsyncEngine(model, settings)  # used for validation; the core runs in a thread
        self.core = self.engine.core
        self.core.start()

    def close(self) -> None:
        self.core.stop()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _submit(self, prompt: Prompt, params: SamplingParams | None, sink: Any) -> str:
        kw: dict[str, Any] = {"messages": prompt} if isinstance(prompt, list) else {"prompt": prompt}
        ids, params = self.engine.prepare(params=params, **kw)
        seq = Sequence(id=f"req-{uuid.uuid4().hex[:16]}", prompt_ids=ids, params=params, sink=sink,
                       model=self.engine.model_id, detok=IncrementalDetokenizer(self.engine.codec.decode),
                       guide=self.engine.guide_for(params))
        self.core.add(seq)
        return seq.id

    def generate(self, prompts: Prompt | Seq[Prompt], params: SamplingParams | None = None,
                 progress: bool = True) -> list[GenerationOutput]:
        """One output per prompt, in order; a progress bar shows requests done and prefill/decode tok/s."""
        items: list[Prompt] = [prompts] if isinstance(prompts, str) or _is_messages(prompts) else list(prompts)
        events: queue.Queue[TokenEvent] = queue.Queue()
        ids = [self._submit(p, params, events.put) for p in items]
        index = {rid: i for i, rid in enumerate(ids)}
        texts: list[list[str]] = [[] for _ in ids]
        results: list[GenerationOutput | None] = [None] * len(ids)
        bar = _progress(len(ids), progress)
        p0, pt0, d0, dt0 = (self.core.prefill_tokens, self.core.prefill_seconds,
                            self.core.decode_tokens, self.core.decode_seconds)
        done = 0
        while done < len(ids):
            ev = events.get()
            i = index[ev.request_id]
            texts[i].append(ev.text)
            if not ev.finished:
                continue
            if ev.finish_reason == "error":
                raise GenerationError(ev.error or "generation failed")
            results[i] = GenerationOutput(ev.request_id, str(items[i]), "".join(texts[i]), [],
                                          ev.finish_reason or "stop", ev.metrics)  # type: ignore[arg-type]
            done += 1
            if bar is not None:
                pt, dt = self.core.prefill_seconds - pt0, self.core.decode_seconds - dt0
                bar.set_postfix_str(f"Prefill: {(self.core.prefill_tokens - p0) / pt if pt else 0:.0f}tok/s, "
                                    f"Decode: {(self.core.decode_tokens - d0) / dt if dt else 0:.0f}tok/s")
                bar.update(1)
        if bar is not None:
            bar.close()
        return [r for r in results if r is not None]

    def stream(self, prompt: Prompt, params: SamplingParams | None = None) -> Iterator[str]:
        """Yield text pieces as they are generated; leaving the loop early aborts the request."""
        events: queue.Queue[TokenEvent] = queue.Queue()
        rid = self._submit(prompt, params, events.put)
        finished = False
        try:
            while True:
                ev = events.get()
                if ev.finish_reason == "error":
                    finished = True
                    raise GenerationError(ev.error or "generation failed")
                if ev.text:
                    yield ev.text
                if ev.finished:
                    finished = True
                    return
        finally:
            if not finished:
                self.core.abort(rid)


def _is_messages(x: Any) -> bool:
    return isinstance(x, list) and bool(x) and isinstance(x[0], dict)


def _progress(total: int, enabled: bool) -> Any:
    if not enabled or not sys.stderr.isatty():
        return None
    import shutil

    from tqdm import tqdm

    # a 0x0 pty (some CI runners, `script`) would make a dynamic-width bar print nothing
    size = shutil.get_terminal_size((100, 20))
    return tqdm(total=total, desc="Generating", unit="req", file=sys.stderr, ncols=size.columns or 100,
                nrows=size.lines or 20)
