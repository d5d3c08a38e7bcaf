"""The router: decide who answers (rules, privacy, readiness, cooldowns), then ask them in
order until one answers. A failure that is the provider's (timeout, refused connection,
5xx, 429) hands the request on; one that is the request's (4xx) is returned. Once a stream
has produced its first event there is no switching."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from ortserve.config import Settings
from ortserve.errors import (
    InvalidRequest,
    NotFound,
    OrtServeError,
    ProviderError,
    RequestTimeout,
    Unavailable,
)
from ortserve.providers import PROVIDER_TYPES
from ortserve.providers.base import ChatRequest, Completion, Delta, Provider, merge_tool_calls
from ortserve.providers.local import EngineLike, LocalProvider
from ortserve.router.config import RouterConfig, load_config
from ortserve.router.costs import Ledger, LedgerEntry, PriceTable
from ortserve.router.decision import ChatResult, Decision, RouteStart, Target
from ortserve.router.rules import Facts, describe, facts_for, first_match

log = logging.getLogger("ortserve.router")
AUTO = ("auto", "router", "")
__all__ = ["AUTO", "ChatResult", "Decision", "RouteStart", "Router", "Target"]


class Router:
    def __init__(self, config: RouterConfig, providers: Mapping[str, Provider], *,
                 ledger: Ledger | None = None, prices: PriceTable | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.providers = dict(providers)
        self.ledger = ledger
        self.prices = prices or PriceTable({n: s.prices for n, s in config.providers.items()})
        self._clock = clock
        self._cool_until: dict[str, float] = {}

    # -- construction ---------------------------------------------------------------------
    @classmethod
    def from_settings(cls, settings: Settings, local: LocalProvider | EngineLike | None = None, *,
                      env: Mapping[str, str] | None = None) -> Router:
        """The router the server and CLI use. No ORTSERVE_ROUTER_CONFIG: local only, no network."""
        config = load_config(settings.router_config) if settings.router_config else RouterConfig.local_only()
        if local is None:
            from ortserve.models.catalog import DEFAULT_MODEL

            local = LocalProvider(loader=_settings_loader(settings), planned_model=settings.model or DEFAULT_MODEL)
        return cls.from_config(config, local=local, env=env, ledger=Ledger(settings.ledger_path))

    @classmethod
    def from_config(cls, config: RouterConfig, local: LocalProvider | EngineLike | None = None, *,
                    env: Mapping[str, str] | None = None, ledger: Ledger | None = None) -> Router:
        if local is not None and not isinstance(local, LocalProvider):
            local = LocalProvider(local)
        providers: dict[str, Provider] = {}
        for name, spec in config.providers.items():
            if spec.type == "local":
                engine = local.engine if local else None
                loader = local.loader if local else None
                providers[name] = LocalProvider(engine, name=name, options=spec.options,  # type: ignore[arg-type]
                                                loader=loader, planned_model=local.planned_model if local else None,
                                                engines=local.engines if local else None)
            else:
                providers[name] = PROVIDER_TYPES[spec.type](name, spec.options, env)
        return cls(config, providers, ledger=ledger)

    async def aclose(self) -> None:
        for p in self.providers.values():
            await p.aclose()
        if self.ledger is not None:
            self.ledger.close()

    # -- lookups --------------------------------------------------------------------------
    def provider(self, name: str) -> Provider:
        if name in self.providers:
            return self.providers[name]
        if name == "local":
            for p in self.providers.values():
                if p.capabilities.local:
                    return p
        raise NotFound(f"unknown provider {name!r}; configured: {', '.join(self.providers)}",
                       param="provider", hint="cloud providers are set up in the routing config: "
                                              "ORTSERVE_ROUTER_CONFIG, docs/router.md")

    def name_of(self, name: str) -> str:
        return self.provider(name).name

    def handles(self, model: str | None) -> bool:
        """True when `model` is for the router ("auto", a provider, "provider:model")."""
        return self._pin(model) is not None or (model or "").lower() in AUTO

    def baseline(self) -> Target | None:
        """The default cloud model: what `costs` compares against."""
        names = [self.config.default_provider, *self.config.fallback_chain, *self.providers]
        for n in names:
            p = self.providers.get(n)
            if p is not None and not p.capabilities.local:
                return Target(p.name, p.default_model())
        return None

    def _pin(self, model: str | None) -> Target | None:
        if not model:
            return None
        name, _, m = model.partition(":")
        if name in self.providers or (name == "local" and not m):
            p = self.provider(name)
            return Target(p.name, p.resolve_model(m or None))
        return None

    def _cooling(self, name: str) -> float:
        return max(0.0, self._cool_until.get(name, 0.0) - self._clock())

    # -- deciding -------------------------------------------------------------------------
    def decide(self, request: ChatRequest) -> Decision:
        facts = facts_for(request.hints, request.prompt_text(), self._count(request))
        private = request.hints.private
        pinned = self._pin(request.model)
        if request.provider and request.provider.lower() not in AUTO:
            p = self.provider(request.provider)
            model = pinned.model if pinned and pinned.provider == p.name else p.resolve_model(
                None if (request.model or "").lower() in AUTO else request.model)
            pinned = Target(p.name, model)
        if pinned is not None:
            return self._decide_pinned(pinned, private, facts, request)
        hit = first_match(self.config.rules, facts)
        if hit is not None:
            i, rule = hit
            p = self.provider(rule.action.provider)
            primary, reason = Target(p.name, p.resolve_model(rule.action.model)), describe(rule, i)
        else:
            p = self.provider(self.config.default_provider)
            primary, reason = Target(p.name, p.default_model()), "no rule matched: default provider"
        chain = [primary]
        for n in self.config.fallback_chain:
            p = self.provider(n)
            if all(t.provider != p.name for t in chain):
                chain.append(Target(p.name, p.default_model()))
        return self._finish_decision(chain, reason, private, facts, request)

    def _decide_pinned(self, target: Target, private: bool, facts: Facts, request: ChatRequest) -> Decision:
        p = self.providers[target.provider]
        if private and not p.capabilities.local:
            raise InvalidRequest(f"this request is private (privacy high or localOnly) and "
                                 f"{target.provider!r} is a cloud provider; use a local provider",
                                 param="provider")
        if not p.ready:
            raise Unavailable(f"provider {target.provider!r} is not available: {p.not_ready_reason}")
        refused = _refusal(p, request)
        if refused is not None:
            raise refused
        return Decision(target.provider, target.model, "provider chosen by the request", [target],
                        private, facts)

    def _finish_decision(self, chain: list[Target], reason: str, private: bool, facts: Facts,
                         request: ChatRequest) -> Decision:
        notes: list[str] = []
        wanted = chain[0]
        if private:
            # the guarantee: a private request's chain holds local providers only
            kept = [t for t in chain if self.providers[t.provider].capabilities.local]
            notes += [f"{t.provider}: skipped, cloud provider and the request is private"
                      for t in chain if t not in kept]
            if not kept:
                local = self.provider("local")
                kept = [Target(local.name, local.default_model())]
            chain = kept
        # a provider whose protocol cannot carry a field the request set (tools, seed...) is skipped;
        # when none can, the request gets the first one's 400 naming the field
        refusals = {t: _refusal(self.providers[t.provider], request) for t in chain}
        able = [t for t in chain if refusals[t] is None]
        notes += [f"{t.provider}: skipped, {refusals[t].message}" for t in chain if t not in able]  # type: ignore[union-attr]
        if not able:
            raise refusals[chain[0]]  # type: ignore[misc]
        chain = able
        ready = [t for t in chain if self.providers[t.provider].ready]
        notes += [f"{t.provider}: skipped, {self.providers[t.provider].not_ready_reason}"
                  for t in chain if t not in ready]
        if not ready:
            raise Unavailable("no provider can answer: " + "; ".join(notes))
        # providers cooling down after a failure go to the back, still a last resort
        cool = [t for t in ready if self._cooling(t.provider) > 0]
        notes += [f"{t.provider}: cooling down for {self._cooling(t.provider):.0f}s after a failure"
                  for t in cool]
        chain = [t for t in ready if t not in cool] + cool
        first = chain[0]
        if first != wanted:
            why = "the request is private" if private and not self.providers[wanted.provider].capabilities.local \
                else f"it cannot take {refusals[wanted].param!r}" if refusals.get(wanted) is not None \
                else "it is unavailable"
            reason = f"{reason}; {wanted.provider} skipped because {why}"
        return Decision(first.provider, first.model, reason, chain, private, facts, notes)

    def _count(self, request: ChatRequest) -> int:
        text = request.prompt_text()
        local = self.providers.get("local") or next(
            (p for p in self.providers.values() if p.capabilities.local), None)
        counted = local.count_tokens(text) if isinstance(local, LocalProvider) else None
        return counted if counted is not None else (len(text) + 3) // 4

    # -- answering ------------------------------------------------------------------------
    async def chat(self, request: ChatRequest) -> ChatResult:
        decision = self.decide(request)
        limit = request.params.timeout
        if not limit:
            return await self._chat(request, decision)
        try:
            async with asyncio.timeout(limit):  # the request's deadline covers every attempt
                return await self._chat(request, decision)
        except TimeoutError:
            raise _late(limit) from None

    async def _chat(self, request: ChatRequest, decision: Decision) -> ChatResult:
        failed: list[ProviderError] = []
        for target in decision.chain:
            try:
                completion = await self.providers[target.provider].chat(request, target.model)
            except ProviderError as exc:
                self._failed(target, exc, failed)
                continue
            self._cool_until.pop(target.provider, None)
            return await self._result(decision, target, completion, failed, request)
        raise _exhausted(failed)

    async def stream(self, request: ChatRequest) -> AsyncIterator[RouteStart | Delta | ChatResult]:
        """RouteStart, then Deltas, then the ChatResult (cost, usage). Errors after the
        RouteStart are raised to the caller: the answer has begun and is not switched."""
        decision = self.decide(request)
        failed: list[ProviderError] = []
        limit = request.params.timeout
        deadline = asyncio.get_running_loop().time() + limit if limit else None

        async def step(events: Any) -> Any:
            """The next event, within the request's deadline (checked in this task, no wait_for)."""
            if deadline is None:
                return await events.__anext__()
            try:
                async with asyncio.timeout_at(deadline):
                    return await events.__anext__()
            except TimeoutError:
                raise _late(limit) from None  # type: ignore[arg-type]

        for target in decision.chain:
            events = self.providers[target.provider].stream(request, target.model)
            try:
                try:
                    ev = await step(events)
                except ProviderError as exc:
                    self._failed(target, exc, failed)
                    continue
                except StopAsyncIteration:
                    self._failed(target, ProviderError(f"{target.provider}: empty stream", retryable=True),
                                 failed)
                    continue
                self._cool_until.pop(target.provider, None)
                yield RouteStart(target.provider, target.model, self._reason(decision, target, failed))
                parts: list[str] = []
                calls: list[dict[str, Any]] = []
                while isinstance(ev, Delta):
                    parts.append(ev.text)
                    merge_tool_calls(calls, ev.tool_calls or [])
                    yield ev
                    try:
                        ev = await step(events)
                    except StopAsyncIteration:
                        raise ProviderError(f"{target.provider}: stream ended without a result",
                                            retryable=False) from None
                completion = Completion("".join(parts), ev.usage, ev.finish_reason, ev.model, calls or None)
                yield await self._result(decision, target, completion, failed, request)
                return
            finally:
                await events.aclose()  # type: ignore[attr-defined]
        raise _exhausted(failed)

    def _failed(self, target: Target, exc: ProviderError, failed: list[ProviderError]) -> None:
        if not exc.retryable:
            raise exc
        if self.config.cooldown_seconds > 0:
            self._cool_until[target.provider] = self._clock() + self.config.cooldown_seconds
        failed.append(exc)
        log.warning("%s failed: %s", target.provider, exc.message)

    def _reason(self, decision: Decision, target: Target, failed: list[ProviderError]) -> str:
        if target == decision.chain[0]:
            return decision.reason
        return f"{decision.reason}; fell back to {target.provider} after {len(failed)} failure(s)"

    async def _result(self, decision: Decision, target: Target, c: Completion, failed: list[ProviderError],
                      request: ChatRequest) -> ChatResult:
        local = self.providers[target.provider].capabilities.local
        cost = self.prices.cost(target.provider, c.model, local, c.usage)
        if cost is None:
            log.warning("no price for %s:%s; add it under providers.%s.prices", target.provider, c.model,
                        target.provider)
        reason = self._reason(decision, target, failed)
        base = self.baseline()
        base_cost = self.prices.cost(base.provider, base.model, False, c.usage) if base else None
        log.info("routed to %s:%s (%s)", target.provider, c.model, reason)
        if self.ledger is not None:
            entry = LedgerEntry(target.provider, c.model, local, c.usage, cost, base_cost,
                                f"{base.provider}:{base.model}" if base else None, reason, request.request_id)
            try:
                await asyncio.to_thread(self.ledger.record, entry)
            except (sqlite3.Error, OSError) as exc:
                log.warning("cost ledger %s not written: %s", self.ledger.path, exc)
        return ChatResult(c.text, c.usage, c.finish_reason, target.provider, c.model, reason, cost, local,
                          [e.message for e in failed], c.tool_calls, c.logprobs)


def _late(limit: float) -> RequestTimeout:
    return RequestTimeout(f"the request did not finish within its timeout of {limit:g}s (every provider tried "
                          "included)")


def _refusal(p: Provider, request: ChatRequest) -> InvalidRequest | None:
    check = getattr(p, "refusal", None)  # a provider written before refusal() existed takes everything
    return check(request) if check is not None else None


def _exhausted(failed: list[ProviderError]) -> OrtServeError:
    """One provider tried: its own error (a full local queue stays a 429). Several: a 503."""
    if len(failed) == 1:
        return failed[0]
    return Unavailable("no provider could answer: " + "; ".join(e.message for e in failed),
                       hint="see the routing config's fallbackChain")


def _settings_loader(settings: Settings) -> Callable[[], Any]:
    """Load and start the engine for settings.model on first local request."""
    async def load() -> EngineLike:
        from ortserve.engine import AsyncEngine
        from ortserve.models.locate import resolve_model_dir

        model_dir, model_id = await asyncio.to_thread(resolve_model_dir, settings.model, settings)
        engine = await asyncio.to_thread(AsyncEngine.load, model_dir, settings, model_id)
        await engine.start()
        return engine

    return load
