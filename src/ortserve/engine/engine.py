"""AsyncEngine: the asyncio face of the engine loop (which runs in its own thread)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from ortserve.engine.adapter_host import AdapterHost
from ortserve.engine.core import EngineCore
from ortserve.engine.detokenize import IncrementalDetokenizer
from ortserve.engine.formats import Tool
from ortserve.engine.guidance import Guidance, Guide, constraint_of
from ortserve.engine.lora import Adapter
from ortserve.engine.reasoning import ThinkBudget, left_open
from ortserve.engine.runner import ModelSpec, Runner
from ortserve.engine.runtime import DeviceChoice, candidates, session_options
from ortserve.engine.sequence import Sequence
from ortserve.engine.speculation.draft import DraftModel
from ortserve.engine.tokenizer import TextCodec
from ortserve.engine.watchdog import Watchdog
from ortserve.errors import (
    ContextLengthExceeded,
    InvalidRequest,
    ModelError,
    Overloaded,
    Unavailable,
    require_genai,
)
from ortserve.types import EngineStats, GenerationOutput, SamplingParams, TokenEvent

log = logging.getLogger("ortserve.engine")


class LoadedModel:
    """A model directory loaded for serving: spec, tokenizer, runner and the device it runs on."""

    def __init__(self, model_dir: Path, settings: Any = None, model_id: str | None = None,
                 adapters: list[Adapter] | None = None, draft: tuple[Path, str] | None = None) -> None:
        """``draft``: (directory, id) of a draft model of the same vocabulary (engine/speculation/draft.py)."""
        require_genai()  # the builder's models and their genai_config come from onnxruntime-genai
        model_dir = Path(model_dir)
        if not model_dir.is_dir():
            raise ModelError(f"model directory {model_dir} does not exist",
                             hint="set --model / GENAI_MODEL_DIR to an ONNX GenAI model directory")
        self.dir = model_dir
        self.id = model_id or model_dir.name
        self.spec = ModelSpec.read(model_dir)
        self.adapters = list(adapters or [])  # LoRA adapters served over this model (engine/lora.py)
        self.codec = TextCodec(model_dir)
        max_length = getattr(settings, "max_length", None)
        self.context_length = min(self.spec.context_length, max_length or self.spec.context_length)
        slots = int(getattr(settings, "max_batch", 16))
        self.runner, self.choice = self._load(settings, slots)
        self.draft_source = draft
        self.draft = self.load_draft(settings)
        self.guidance = Guidance(model_dir / "tokenizer.json", self.spec.vocab_size, self.spec.eos_token_ids)

    def _load(self, settings: Any, slots: int) -> tuple[Runner, DeviceChoice]:
        so = session_options(settings, self.spec.session_options)
        errors: list[str] = []
        options = candidates(getattr(settings, "device", "auto"))
        for i, choice in enumerate(options):
            try:
                runner = Runner(self.spec, slots=slots, providers=[choice.provider], session_options=so,
                                kv_placement=str(getattr(settings, "kv_placement", "auto")),
                                last_logits_only=bool(getattr(settings, "last_logits_only", True)),
                                huge_pages=bool(getattr(settings, "huge_pages", True)),
                                lora=bool(self.adapters), lora_mode=str(getattr(settings, "lora_mode", "mask")))
                if self.adapters:
                    runner.set_adapters(self.adapters)
            except ModelError as exc:
                if i == len(options) - 1 and not errors:
                    raise  # nothing to fall back to: the error as it is
                errors.append(f"{choice.device}: {exc.message}")
                log.warning("device %s failed to load %s: %s; trying the next", choice.device, self.id,
                            exc.message)
                continue
            if errors:
                choice.reason += f" (fell back: {'; '.join(errors)})"
            log.info("model %s runs on %s (%s)", self.id, choice.device, choice.reason)
            return runner, choice
        raise ModelError(f"could not load {self.dir} on any device: {'; '.join(errors)}")

    def load_draft(self, settings: Any) -> DraftModel | None:
        """The draft model on the target's device, after its vocabulary is checked against the target's."""
        if self.draft_source is None:
            return None
        draft_dir, draft_id = self.draft_source
        if not Path(draft_dir).is_dir():
            raise ModelError(f"draft model directory {draft_dir} does not exist")
        # its threads must not spin on the cores while the target's step runs right after it
        quiet = settings.model_copy(update={"thread_spinning": False}) if hasattr(settings, "model_copy") \
            else SimpleNamespace(**{**vars(settings or SimpleNamespace()), "thread_spinning": False})
        so = session_options(quiet, ModelSpec.read(Path(draft_dir)).session_options)
        draft = DraftModel.load(Path(draft_dir), draft_id, self.dir, self.id, providers=[self.choice.provider],
                                session_options=so, settings=settings)
        draft.runner.byte_limit = draft.max_bytes(self.context_length + 1)  # no further than the budget counts
        return draft

    @property
    def draft_kv_bytes(self) -> int:
        """The most KV the draft's one row takes: it comes out of the KV budget (``kv_budget_bytes``)."""
        return self.draft.max_bytes(self.context_length + 1) if self.draft is not None else 0


def kv_budget_bytes(model: LoadedModel, settings: Any = None) -> int:
    """The target's KV cache budget: the whole budget less the draft model's one row, if any, so
    the two together stay within it."""
    whole = kv_whole_budget(model, settings)
    if model.draft is not None and model.draft_kv_bytes >= whole:
        raise ModelError(f"the draft model {model.draft.id} would take {model.draft_kv_bytes / 2**20:.1f} MB, "
                         f"all of the {whole / 2**20:.1f} MB KV budget (one row of {model.context_length} tokens)",
                         hint="raise kv_cache_mb, or lower max_length")
    return whole - model.draft_kv_bytes


def kv_whole_budget(model: LoadedModel, settings: Any = None) -> int:
    """The KV cache budget: ``kv_cache_mb`` when set, else half the memory still free after the
    model is loaded, minus the model's size again for activations (at least 256 MB), and never more
    than every slot filled to the context. The memory is the GPU's when the cache lives there."""
    mb = int(getattr(settings, "kv_cache_mb", 0) or 0)
    if mb:
        return mb << 20
    import psutil

    from ortserve.engine.runtime import gpu_facts

    model_bytes = sum(f.stat().st_size for f in model.dir.glob("*.onnx*") if f.is_file())
    free = psutil.virtual_memory().available
    gpus = gpu_facts() if model.choice.device == "cuda" and model.runner.kv.device == "cuda" else []
    if gpus:  # the session's device is the first GPU unless CUDA_VISIBLE_DEVICES says otherwise
        free = gpus[0]["memory_free_mb"] << 20
    runner = model.runner
    full = runner.slots * model.context_length * runner.bytes_per_token + model.draft_kv_bytes
    return int(min(full, max(256 << 20, (free - model_bytes) // 2)))


class AsyncEngine(AdapterHost):
    def __init__(self, model: LoadedModel, settings: Any = None) -> None:
        self.model = model
        self.codec = model.codec
        self.settings = settings
        self.kv_budget = kv_budget_bytes(model, settings)
        self.core = self._new_core(model.runner)
        self.max_queue = int(getattr(settings, "max_queue", 1 << 30))
        self.timeout = float(getattr(settings, "timeout", 0) or 0)  # seconds; 0: no deadline
        self.problem: str | None = None  # why the engine cannot serve (set while it restarts)
        self.watchdog = Watchdog(self, stall_timeout=float(getattr(settings, "stall_timeout", 120.0)))
        self._lora_seqs: list[Sequence] = []  # submitted adapter requests, until they finish
        self._adapter_lock = threading.Lock()  # engine/adapter_host.py: one adapter-set change at a time

    def _new_core(self, runner: Runner) -> EngineCore:
        core = EngineCore(runner, chunk_tokens=int(getattr(self.settings, "prefill_chunk", 512)),
                          prefill_ratio=float(getattr(self.settings, "prefill_ratio", 0.0)),
                          kv_budget_bytes=self.kv_budget, guidance=self.model.guidance,
                          prefix_cache=bool(getattr(self.settings, "prefix_cache", True)),
                          speculative=bool(getattr(self.settings, "speculative", True)),
                          speculative_k=int(getattr(self.settings, "speculative_k", 8)))
        core.draft_model = self.model.draft  # guesses where prompt lookup has none (engine/speculation/draft.py)
        core.lookup = bool(getattr(self.settings, "speculative_lookup", True))
        return core

    def reload(self) -> None:
        """A fresh model session and engine loop (the watchdog's restart; blocking)."""
        runner, choice = self.model._load(self.settings, self.model.runner.slots)
        self.model.runner, self.model.choice = runner, choice
        self.model.draft = self.model.load_draft(self.settings)  # the old loop may still be inside it
        core = self._new_core(runner)
        core.start()
        self.core = core

    @classmethod
    def load(cls, model_dir: Path, settings: Any = None, model_id: str | None = None,
             adapters: list[Adapter] | None = None, draft: tuple[Path, str] | None = None) -> AsyncEngine:
        return cls(LoadedModel(model_dir, settings, model_id, adapters, draft), settings)

    # ---- facts ------------------------------------------------------------
    @property
    def model_id(self) -> str:
        return self.model.id

    @property
    def context_length(self) -> int:
        return self.model.context_length

    @property
    def device(self) -> str:
        return self.model.choice.device

    @property
    def guidance(self) -> Guidance:
        return self.model.guidance

    def guide_for(self, params: SamplingParams) -> Guide | None:
        """The grammar matcher for a constrained request (a 400 if its constraint cannot be enforced)."""
        constraint = constraint_of(params)
        return None if constraint is None else self.model.guidance.guide(constraint)

    def think_budget(self, ids: list[int], params: SamplingParams) -> ThinkBudget | None:
        """The reasoning count (and bound) of a thinking model's request that asks for one; its block
        is open from the start where the prompt opened it (DeepSeek-R1's template)."""
        markers = self.codec.reasoning_markers
        if params.reasoning_budget is None or markers is None:
            return None
        inside = left_open(self.codec.decode(ids[-32:]), markers)
        return ThinkBudget(params.reasoning_budget, self.codec.encode(markers[1], add_special_tokens=False),
                           self.codec.piece, markers, inside)

    def count_tokens(self, text: str) -> int:
        return len(self.codec.encode(text))

    def stats(self) -> EngineStats:
        core = self.core
        return replace(core.stats(), speculative_draft_proposed=core.spec_draft_proposed,
                       speculative_draft_accepted=core.spec_draft_accepted)

    # ---- lifecycle --------------------------------------------------------
    async def start(self) -> None:
        self.core.start()
        self.watchdog.start()

    async def stop(self) -> None:
        await self.watchdog.stop()
        await asyncio.to_thread(self.core.stop)

    def health(self) -> str | None:
        """None when the engine serves; else why not (a dead thread, a stalled step, a restart)."""
        return self.problem or self.watchdog.diagnose()

    # ---- requests ---------------------------------------------------------
    def prepare(self, *, prompt: str | None = None, messages: list[dict[str, Any]] | None = None,
                params: SamplingParams | None = None, tools: list[Tool] | None = None,
                thinking: bool | None = None, prompt_ids: list[int] | None = None) -> tuple[list[int], SamplingParams]:
        """Tokenize and check a request against the context window before it is queued."""
        params = params or SamplingParams()
        if prompt_ids is not None:  # built by the caller (a FIM prompt, engine/fim.py)
            ids = list(prompt_ids)
        elif messages is not None:
            ids = self.codec.chat_ids(messages, tools=tools, thinking=thinking)
        elif isinstance(prompt, str):
            ids = self.codec.encode(prompt)
        else:
            raise InvalidRequest("give 'prompt' (a string) or 'messages'", param="prompt")
        if not ids:
            raise InvalidRequest("the prompt is empty", param="prompt" if messages is None else "messages")
        if params.logit_bias and params.logit_bias[-1][0] >= (vocab := self.core.runner.spec.vocab_size):
            raise InvalidRequest(f"'logit_bias' names token {params.logit_bias[-1][0]}; this model's token ids "
                                 f"are 0..{vocab - 1}", param="logit_bias")
        limit = self.context_length
        if params.fit_context and len(ids) < limit < len(ids) + params.max_tokens:
            # a default max_tokens: shorten it to the room left (finish_reason "length" says so)
            params = replace(params, max_tokens=limit - len(ids), min_tokens=min(params.min_tokens,
                                                                                  limit - len(ids)))
        if len(ids) + params.max_tokens > limit:
            param = "max_tokens" if len(ids) < limit else ("messages" if messages is not None else "prompt")
            raise ContextLengthExceeded(
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{len(ids) + params.max_tokens} tokens ({len(ids)} in the prompt, {params.max_tokens} "
                f"in the completion). Please reduce the prompt or max_tokens.", param=param)
        if not self.core.fits(1, len(ids) + params.max_tokens):
            budget_mb = round(self.core.kv_budget / 2**20, 1)
            most = self.core.kv_budget // self.core.runner.bytes_per_token
            raise InvalidRequest(
                f"this request needs {len(ids) + params.max_tokens} tokens of KV cache ({len(ids)} in the "
                f"prompt, {params.max_tokens} in the completion), more than this server's KV budget of "
                f"{budget_mb} MB holds ({most} tokens); reduce the prompt or max_tokens, or raise kv_cache_mb",
                param="max_tokens" if len(ids) < most else ("messages" if messages is not None else "prompt"),
                code="kv_budget_exceeded")
        return ids, params

    def submit(self, *, prompt: str | None = None, messages: list[dict[str, Any]] | None = None,
               params: SamplingParams | None = None, request_id: str | None = None,
               tools: list[Tool] | None = None, adapter: str = "", thinking: bool | None = None,
               prompt_ids: list[int] | None = None) -> RequestHandle:
        if adapter and adapter not in self.adapter_names:
            raise InvalidRequest(f"adapter {adapter!r} is not loaded on {self.model_id}", param="model",
                                 code="model_not_found")
        problem = self.health()
        if problem is not None:
            raise Unavailable(f"the engine cannot take requests now: {problem}",
                              retry_after=int(self.watchdog.backoff()) + 1, code="engine_unavailable")
        ids, params = self.prepare(prompt=prompt, messages=messages, params=params, tools=tools, thinking=thinking,
                                   prompt_ids=prompt_ids)
        if len(self.core.waiting) >= self.max_queue:
            raise Overloaded(f"the queue is full ({self.max_queue} requests waiting); retry shortly")
        guide = self.guide_for(params)
        timeout = params.timeout if params.timeout is not None else self.timeout
        handle = RequestHandle(self, request_id or f"req-{uuid.uuid4().hex[:24]}", len(ids), timeout or None)
        loop = asyncio.get_running_loop()
        queue = handle.queue
        seq = Sequence(id=handle.id, prompt_ids=ids, params=params, model=adapter or self.model_id,
                       adapter=self._adapter_key(adapter, params),
                       sink=lambda ev: loop.call_soon_threadsafe(queue.put_nowait, ev),
                       detok=IncrementalDetokenizer(self.codec.decode), guide=guide,
                       think=self.think_budget(ids, params))
        if adapter:
            self._lora_seqs.append(seq)
        self.core.add(seq)
        return handle

    async def abort(self, request_id: str) -> None:
        self.core.abort(request_id)

    async def generate(self, **kw: Any) -> GenerationOutput:
        """Submit and collect the whole answer."""
        handle = self.submit(**kw)
        parts: list[str] = []
        async for ev in handle:
            parts.append(ev.text)
            if ev.finished:
                return GenerationOutput(handle.id, kw.get("prompt") or "", "".join(parts), [],
                                        ev.finish_reason or "stop", ev.metrics)  # type: ignore[arg-type]
        raise RuntimeError("stream ended without a final event")  # pragma: no cover


class RequestHandle:
    """Async iterator of a request's TokenEvents; leaving early aborts the request."""

    def __init__(self, engine: AsyncEngine, request_id: str, input_tokens: int,
                 timeout: float | None = None) -> None:
        self.engine = engine
        self.id = request_id
        self.input_tokens = input_tokens
        self.queue: asyncio.Queue[TokenEvent] = asyncio.Queue()
        self.done = False
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout if timeout else None  # from submission: queue time counts

    async def _next(self) -> TokenEvent:
        """The next event, or a timeout error once the deadline passes (also when the engine is stuck)."""
        if self.deadline is None:
            return await self.queue.get()
        # asyncio.timeout, not wait_for: on Python 3.11 wait_for swallows a cancel that lands in
        # the loop iteration where queue.get() completes (CPython gh-86296), and a stream whose
        # client left then went on generating to max_tokens; with tokens arriving every few ms
        # that race was hit on about half the Stops from the web page.
        try:
            async with asyncio.timeout(max(0.0, self.deadline - time.monotonic())):
                return await self.queue.get()
        except TimeoutError:
            return TokenEvent(request_id=self.id, text="", finished=True, finish_reason="error",
                              error=f"the request did not finish within its timeout of {self.timeout:g}s "
                                    "(queue time included)", error_code="timeout")

    def __aiter__(self) -> AsyncIterator[TokenEvent]:
        return self._events()

    async def _events(self) -> AsyncIterator[TokenEvent]:
        try:
            while True:
                ev = coalesce(await self._next(), self.queue)
                if ev.finished and ev.error_code != "timeout":
                    self.done = True  # a timeout leaves done False: the finally aborts it in the engine
                yield ev
                if ev.finished:
                    return
        finally:
            if not self.done:  # the consumer left (client gone, cancelled): free the slot
                self.engine.core.abort(self.id)


def coalesce(ev: TokenEvent, queue: asyncio.Queue[TokenEvent]) -> TokenEvent:
    """Merge events already waiting behind ``ev`` into one.

    A consumer that keeps up sees one event per token; one that falls behind (a slow client,
    many streams on few cores) gets the backlog as one larger piece instead of paying the
    per-event cost again for every token.
    """
    while not ev.finished and not queue.empty():
        nxt = queue.get_nowait()
        ev = TokenEvent(request_id=ev.request_id, text=ev.text + nxt.text, token_ids=ev.token_ids + nxt.token_ids,
                        finished=nxt.finished, finish_reason=nxt.finish_reason, metrics=nxt.metrics,
                        error=nxt.error, error_code=nxt.error_code, stop_sequence=nxt.stop_sequence,
                        logprobs=None if ev.logprobs is None else ev.logprobs + (nxt.logprobs or []))
    return ev
