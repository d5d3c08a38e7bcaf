"""`ortserve ask` and `ortserve chat`: talking to a model from the terminal."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import click

from ortserve.cli.common import echo_json, guarded, load_model, model_options, pop_model_flags, settings_from
from ortserve.errors import InvalidRequest, OrtServeError
from ortserve.models.sampling import defaults_for
from ortserve.types import SAMPLING_DEFAULT_FIELDS, SamplingDefaults, SamplingParams

RULE = "═" * 70


def sampling_options(fn: Any) -> Any:
    unset = " (default: the model's, else the server defaults; see `ortserve models show`)"
    for o in reversed([
        click.option("--max-tokens", type=int, default=256, show_default=True),
        click.option("--temperature", type=float, default=None, help="0 is greedy" + unset),
        click.option("--top-p", type=float, default=None, help="Nucleus mass" + unset),
        click.option("--top-k", type=int, default=None, help="0 is off" + unset),
        click.option("--min-p", type=float, default=None, help="Drop tokens below min_p x the top one's p" + unset),
        click.option("--typical-p", type=float, default=None, help="Locally typical sampling mass" + unset),
        click.option("--repetition-penalty", type=float, default=None, help="Over the whole context" + unset),
        click.option("--logit-bias", multiple=True, metavar="TOKEN=BIAS",
                     help="Add BIAS (-100..100; -100 bans) to a token id's logit; repeatable"),
        click.option("--seed", type=int, default=None),
        click.option("--system", default=None, help="System prompt"),
    ]):
        fn = o(fn)
    return fn


def params_from(kw: dict[str, Any], defaults: SamplingDefaults | None = None) -> SamplingParams:
    """The flags as SamplingParams; the sampling flags left unset take ``defaults``."""
    given = {name: kw.pop(name) for name in SAMPLING_DEFAULT_FIELDS}
    sampling, _ = (defaults or SamplingDefaults()).fill(given)
    bias: dict[str, float] = {}
    for item in kw.pop("logit_bias"):
        token, sep, value = item.partition("=")
        try:
            bias[token.strip()] = float(value)
        except ValueError:
            sep = ""
        if not sep:
            raise InvalidRequest(f"--logit-bias takes TOKEN=BIAS, got {item!r}", param="logit_bias")
    return SamplingParams(max_tokens=kw.pop("max_tokens"), seed=kw.pop("seed"), logit_bias=bias, **sampling)


def messages_for(question: str, system: str | None) -> list[dict[str, str]]:
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": question}]


@click.command()
@click.argument("questions", nargs=-1, required=True)
@model_options
@sampling_options
@click.option("--json", "as_json", is_flag=True, help="Print results as JSON")
@click.option("--provider", default=None,
              help="Answer through the router: local, auto, or a provider from the routing config")
@click.option("--router-config", default=None, help="Routing config file (JSON/TOML)")
@click.option("--store", default=None, help="Answer from this vector store (`ortserve rag ls`), citing sources")
@click.option("--sources", type=int, default=4, show_default=True, help="With --store: chunks given to the model")
@click.option("--json-schema", "json_schema", type=click.Path(exists=True, dir_okay=False), default=None,
              help="A JSON schema file: every answer is JSON that validates against it (enforced by grammar)")
@guarded
def ask(questions: tuple[str, ...], as_json: bool, provider: str | None, router_config: str | None,
        store: str | None, sources: int, json_schema: str | None, **kw: Any) -> None:
    """Answer one or more questions in one batch, with a progress bar."""
    from ortserve.engine import LLM

    settings = settings_from(**pop_model_flags(kw), router_config=router_config)
    system = kw.pop("system")
    # unset sampling flags: the model's defaults, else the server's; none for a cloud provider
    model = load_model(settings) if provider is None and store is None else None
    defaults = None if provider is not None else defaults_for(settings, model.dir if model else None)
    params = params_from(kw, defaults)
    if json_schema is not None:
        if provider is not None:
            raise click.UsageError("--json-schema is enforced by the local engine; drop --provider")
        params = replace(params, json_schema=Path(json_schema).read_text(encoding="utf-8"))
    if store is not None:
        if provider is not None:
            raise click.UsageError("--store answers locally only (a store's text stays on this machine)")
        _ask_store(questions, store, sources, settings, params, system, as_json)
        return
    if provider is not None:
        _ask_routed(questions, provider, settings, params, system, as_json)
        return
    with LLM(model, settings) as llm:
        outs = llm.generate([messages_for(q, system) for q in questions], params, progress=not as_json)
        model_id = llm.engine.model_id
    if as_json:
        echo_json({"model": model_id, "results": [
            {"question": q, "answer": o.text, "tokens": o.metrics.output_tokens, "finish_reason": o.finish_reason,
             "metrics": o.metrics.to_dict()} for q, o in zip(questions, outs)]})
        return
    click.echo(f"{RULE}\nRESULTS ({model_id})\n{RULE}")
    for i, (q, o) in enumerate(zip(questions, outs), 1):
        click.echo(f"📝 Question {i}: {q}\n💬 Answer: {o.text.strip()}\n📊 Tokens: {o.metrics.output_tokens}"
                   f"  ({o.metrics.output_tokens_per_second:.1f} tok/s, TTFT {1000 * (o.metrics.ttft or 0):.0f} ms)")
        click.echo(RULE)


def _ask_store(questions: tuple[str, ...], store: str, k: int, settings: Any, params: SamplingParams,
               system: str | None, as_json: bool) -> None:
    """Search the store for each question, answer from the best chunks, print the citations."""
    from ortserve.cli.rag import open_rag, store_id
    from ortserve.engine import LLM
    from ortserve.rag.answer import citations, with_context

    rag = open_rag(settings)
    vid = store_id(rag, store)
    hits = [rag.search(vid, q, k=k) for q in questions]
    with LLM(load_model(settings), settings) as llm:
        outs = llm.generate([with_context(messages_for(q, system), h) for q, h in zip(questions, hits)], params,
                            progress=not as_json)
        model_id = llm.engine.model_id
    if as_json:
        echo_json({"model": model_id, "store": store, "results": [
            {"question": q, "answer": o.text, "citations": citations(h), "finish_reason": o.finish_reason}
            for q, o, h in zip(questions, outs, hits)]})
        return
    click.echo(f"{RULE}\nRESULTS ({model_id}, from {store})\n{RULE}")
    for i, (q, o, h) in enumerate(zip(questions, outs, hits), 1):
        click.echo(f"📝 Question {i}: {q}\n💬 Answer: {o.text.strip()}\n📚 Sources:")
        for c in citations(h):
            click.echo(f"  [{c['index']}] {c['filename']} (chunk {c['chunk_index']}, chars {c['start']}-{c['end']})")
        click.echo(RULE)


def _ask_routed(questions: tuple[str, ...], provider: str, settings: Any, params: SamplingParams,
                system: str | None, as_json: bool) -> None:
    import asyncio

    from ortserve.providers.base import ChatRequest
    from ortserve.router.router import Router

    async def answer_all() -> list[Any]:
        router = Router.from_settings(settings)
        try:
            pin = None if provider == "auto" else provider
            return list(await asyncio.gather(*(router.chat(ChatRequest(
                messages=messages_for(q, system), params=params, provider=pin)) for q in questions)))
        finally:
            await router.aclose()

    results = asyncio.run(answer_all())
    if as_json:
        echo_json({"results": [{"question": q, "answer": r.text, "tokens": r.usage.completion_tokens,
                                "finish_reason": r.finish_reason, **r.metadata()}
                               for q, r in zip(questions, results)]})
        return
    click.echo(f"{RULE}\nRESULTS (routed)\n{RULE}")
    for i, (q, r) in enumerate(zip(questions, results), 1):
        cost = "free" if not r.cost_usd else f"${r.cost_usd:.6f}"
        click.echo(f"📝 Question {i}: {q}\n💬 Answer: {r.text.strip()}\n📊 Tokens: {r.usage.completion_tokens}"
                   f"  via {r.provider} ({r.model}), {cost} — {r.reason}")
        click.echo(RULE)


@click.command()
@model_options
@sampling_options
@guarded
def chat(**kw: Any) -> None:
    """An interactive, streaming conversation. /reset clears history, /exit leaves; Ctrl-C stops an answer."""
    from ortserve.engine import LLM

    settings = settings_from(**pop_model_flags(kw))
    system = kw.pop("system")
    model = load_model(settings)
    params = params_from(kw, defaults_for(settings, model.dir))
    with LLM(model, settings) as llm:
        click.echo(f"Chatting with {llm.engine.model_id}. /reset clears the history, /exit leaves.", err=True)
        history: list[dict[str, str]] = [{"role": "system", "content": system}] if system else []
        while True:
            try:
                line = input(">>> ")
            except (EOFError, KeyboardInterrupt):
                click.echo("", err=True)
                return
            if line.strip() in ("/exit", "/quit", "/bye"):
                return
            if line.strip() == "/reset":
                history = history[:1] if system else []
                click.echo("(history cleared)", err=True)
                continue
            if not line.strip():
                continue
            history.append({"role": "user", "content": line})
            history, dropped = fit_history(llm.engine, history, params.max_tokens)
            if dropped:
                click.echo(f"(the conversation outgrew the {llm.engine.context_length}-token context: dropped "
                           f"the {dropped} oldest message{'s' if dropped > 1 else ''})", err=True)
            try:
                answer = _stream_answer(llm, history, params)
            except OrtServeError as exc:  # this message cannot be answered; the session goes on
                click.echo(f"error: {exc.one_line()}", err=True)
                history.pop()
                continue
            history.append({"role": "assistant", "content": answer})


def fit_history(engine: Any, history: list[dict[str, str]], max_tokens: int) -> tuple[list[dict[str, str]], int]:
    """Drop the oldest turns (never the system prompt or the newest message) until the rendered
    conversation plus ``max_tokens`` fits the context; returns the history and how many went."""
    keep_system = 1 if history and history[0]["role"] == "system" else 0
    history = list(history)
    dropped = 0

    def size() -> int:
        return len(engine.codec.encode(engine.codec.render_chat(history), add_special_tokens=False))

    while len(history) - keep_system > 1 and size() + max_tokens > engine.context_length:
        del history[keep_system]
        dropped += 1
        if len(history) - keep_system > 1 and history[keep_system]["role"] == "assistant":
            del history[keep_system]  # a conversation starts with the user: drop the answer too
            dropped += 1
    return history, dropped


def _stream_answer(llm: Any, history: list[dict[str, str]], params: SamplingParams) -> str:
    parts: list[str] = []
    stream = llm.stream(list(history), params)
    try:
        for piece in stream:
            parts.append(piece)
            sys.stdout.write(piece)
            sys.stdout.flush()
    except KeyboardInterrupt:
        stream.close()  # aborts the request; the session goes on
        sys.stdout.write(" [stopped]")
    sys.stdout.write("\n")
    sys.stdout.flush()
    return "".join(parts)
