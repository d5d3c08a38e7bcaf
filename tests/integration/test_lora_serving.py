"""LoRA adapters while serving (issue 35): idle adapters leave the stacks after keep_alive and
come back on demand, never under a request; a request's lora_scale gives the merged model at
that scale (PEFT's merge with scaling * s, exported separately). Material: lora_material.py."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from ortserve.engine import AsyncEngine
from ortserve.engine.lora import AdapterView, adapter_key
from ortserve.engine.runner import ModelSpec, Runner
from ortserve.types import SamplingParams

PROMPT = "Once upon a time"


async def tokens(handle: object) -> list[int]:
    out: list[int] = []
    async for ev in handle:  # type: ignore[attr-defined]
        out += ev.token_ids
    return out


def alone(model: Path, adapter: str, params: SamplingParams, adapters: list | None = None) -> list[int]:
    engine = AsyncEngine.load(model, adapters=adapters)

    async def go() -> list[int]:
        await engine.start()
        try:
            return await tokens(engine.submit(prompt=PROMPT, params=params, adapter=adapter))
        finally:
            await engine.stop()

    return asyncio.run(go())


def test_a_dropped_adapter_leaves_running_rows_alone_and_comes_back(lora: SimpleNamespace, tiny_model: Path) -> None:
    """remove_adapter refuses while a request of the adapter is in flight; once it is done the adapter
    leaves the stacks while another adapter's row runs (its row index moves: it must keep its
    adapter), and a later request loads it again through the view's reload."""
    short = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    long = SamplingParams(temperature=0.0, max_tokens=160, ignore_eos=True)
    want_mine, want_other = alone(tiny_model, "my-adapter", short, lora.adapters), \
        alone(tiny_model, "other", long, lora.adapters)
    want_base = alone(tiny_model, "", short, lora.adapters)
    engine = AsyncEngine.load(tiny_model, adapters=lora.adapters)

    async def go() -> tuple[list[int], ...]:
        await engine.start()
        try:
            mine = engine.submit(prompt=PROMPT, params=short, adapter="my-adapter")  # queued or running
            assert engine.remove_adapter("my-adapter") is False and engine.adapter_names == ["my-adapter", "other"]
            other = engine.submit(prompt=PROMPT, params=long, adapter="other")
            got_mine = await tokens(mine)
            assert engine.adapters_in_use() == {"other"}  # still running: 160 tokens
            assert engine.remove_adapter("my-adapter") is True
            assert engine.adapter_names == ["other"]
            got_base = await tokens(engine.submit(prompt=PROMPT, params=short))  # its admission rebinds
            assert engine.core.runner.adapters == {"": 0, "other": 1}
            got_other = await tokens(other)
            view = AdapterView(engine, "my-adapter", "my-adapter", reload=lambda: lora.adapters[0])
            again = await tokens(view.submit(prompt=PROMPT, params=short))
            return got_mine, got_other, got_base, again
        finally:
            await engine.stop()

    got_mine, got_other, got_base, again = asyncio.run(go())
    assert got_mine == want_mine and again == want_mine
    assert got_other == want_other and got_base == want_base
    assert engine.adapter_names == ["other", "my-adapter"]


def test_unused_adapters_unload_after_keep_alive(lora: SimpleNamespace, tiny_model: Path) -> None:
    import threading

    import httpx
    import openai
    from tests.clocks import ManualClock, wait_until
    from tests.servers import ServerThread

    msg = [{"role": "user", "content": "Say hi"}]
    # The manager's clock moves only when the test says: an adapter stays between the checks
    # however slow the machine, and expires when its keep_alive has passed on that clock.
    clock = ManualClock()  # the manager's from the start: a slow start expires nothing
    with ServerThread(tiny_model, home=lora.home, keep_alive=30, manager_clock=clock) as srv:  # the base is pinned
        client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="none")

        def ps() -> dict:
            return httpx.get(f"{srv.url}/v1/admin/ps", timeout=10).json()["models"][0]

        assert sorted(ps()["adapters"]) == ["my-adapter", "other"]  # loaded with the base
        first = client.chat.completions.create(model="tiny:my-adapter", messages=msg, max_tokens=8, temperature=0)
        srv.reap()
        assert sorted(ps()["adapters"]) == ["my-adapter", "other"]  # the clock has not moved
        clock.advance(30)
        assert wait_until(lambda: not ps()["adapters"])  # the reaper's next pass
        row = ps()
        assert row["adapters"] == [] and row["adapters_expire_in"] == {}  # both gone after 30 s unused
        shown = subprocess.run([sys.executable, "-m", "ortserve.cli.main", "ps", "--url", srv.url],
                               capture_output=True, text=True, timeout=120, check=False)
        assert shown.returncode == 0 and "my-adapter" not in shown.stdout, shown.stderr
        assert "my-adapter" not in {m.id for m in client.models.list().data if getattr(m, "loaded", False)}
        again = client.chat.completions.create(model="tiny:my-adapter", messages=msg, max_tokens=8, temperature=0)
        assert again.choices[0].message.content == first.choices[0].message.content  # loaded again, same model
        assert ps()["adapters"] == ["my-adapter"]
        # keep_alive 0 on the request: dropped right after it, never while it streams. The engine
        # holds after the first step that leaves the request running, so a reaper pass reads it
        # mid-stream however fast or slow the machine (the client may read its first chunk late).
        core = srv.state.engine.core
        held, go, step = threading.Event(), threading.Event(), core.step

        def held_step() -> None:
            step()
            if not held.is_set() and core.running:
                held.set()
                go.wait(120)

        core.step = held_step
        try:
            long = {"keep_alive": 0, "min_tokens": 300}
            stream = client.chat.completions.create(model="other", messages=msg, max_tokens=300, temperature=0,
                                                    stream=True, extra_body=long)
            pieces, seen = [], []
            for chunk in stream:
                pieces.append((chunk.choices[0].delta.content or "") if chunk.choices else "")
                if len(pieces) == 1:  # in flight, the engine held: one reaper pass
                    assert held.wait(120)
                    srv.reap()
                    row = ps()
                    seen.append(("other" in row["adapters"], row["running"] > 0))
                    go.set()
        finally:
            go.set()
            del core.step
        assert seen == [(True, True)]
        assert wait_until(lambda: "other" not in ps()["adapters"])
        full = client.chat.completions.create(model="other", messages=msg, max_tokens=300, temperature=0,
                                              extra_body={"min_tokens": 300})
        assert "".join(pieces) == full.choices[0].message.content


def test_adapter_stacks_are_built_off_the_event_loop(lora: SimpleNamespace, tiny_model: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Dropping idle adapters and loading one back for a request rebuild the stacks (tenths of a
    second at 1B) in a worker thread: the event loop that streams every other request never runs them."""
    import httpx
    import openai
    from tests.clocks import ManualClock, wait_until
    from tests.servers import ServerThread

    calls: list[tuple[list[str], bool]] = []
    build = Runner.lora_inputs

    def spy(self: Runner, adapters: list) -> object:
        try:
            asyncio.get_running_loop()
            on_loop = True
        except RuntimeError:
            on_loop = False
        calls.append(([a.name for a in adapters], on_loop))
        return build(self, adapters)

    msg = [{"role": "user", "content": "Say hi"}]
    clock = ManualClock()  # the manager's from the start: the adapters go only when the test says
    with ServerThread(tiny_model, home=lora.home, keep_alive=30, manager_clock=clock) as srv:
        monkeypatch.setattr(Runner, "lora_inputs", spy)

        def ps() -> dict:
            return httpx.get(f"{srv.url}/v1/admin/ps", timeout=10).json()["models"][0]

        assert wait_until(lambda: sorted(ps()["adapters"]) == ["my-adapter", "other"])  # loaded with the base
        srv.reap()  # the reaper has seen them (their idle time starts now), then 30 s pass
        clock.advance(30)
        assert wait_until(lambda: not ps()["adapters"])  # both dropped by the reaper
        client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="none")
        out = client.chat.completions.create(model="tiny:my-adapter", messages=msg, max_tokens=4, temperature=0)
        assert out.choices[0].message.content is not None
        assert ps()["adapters"] == ["my-adapter"]  # loaded back for the request
    assert ([], False) in calls and (["my-adapter"], False) in calls, calls
    assert not [c for c in calls if c[1]], f"stacks built on the event loop: {calls}"


@pytest.mark.parametrize("mixed", [False, True], ids=["one-adapter", "mixed"])
@pytest.mark.parametrize("mode", ["mask", "gather"])
def test_lora_scale_equals_the_merged_model_at_that_scale(lora: SimpleNamespace, lora_half: Path,
                                                          tiny_model: Path, mode: str, mixed: bool) -> None:
    """Rows of one adapter at scales 0.5 and 1 in one batch (alone: the one-adapter binding with
    per-row scales; beside another adapter's row: the mixed one): each row's logits are its merged
    model's (W + s * alpha/r * B @ A), prefill and decode."""
    runner = Runner(ModelSpec.read(tiny_model), slots=4, lora=True, lora_mode=mode)
    runner.set_adapters(lora.adapters)
    half, full = Runner(ModelSpec.read(lora_half), slots=1), Runner(ModelSpec.read(lora.merged), slots=1)
    ids = [1, 504, 3032, 282, 4649, 314]
    keys = [adapter_key("my-adapter", 0.5), "my-adapter"] + (["other"] if mixed else [])
    got = []
    for row, key in enumerate(keys):
        runner.use_adapter(row, key)
        got.append(runner.prefill(row, ids))
    got = got[:2]
    want = [half.prefill(0, ids), full.prefill(0, ids)]
    assert np.abs(want[0] - want[1]).max() > 1e-2 * np.abs(want[1]).max()  # the scale matters
    for step in range(6):
        for g, w in zip(got, want, strict=True):
            assert np.abs(g - w).max() <= 1e-4 * np.abs(w).max(), step
            assert int(g.argmax()) == int(w.argmax())
        toks = [int(w.argmax()) for w in want]
        out = runner.decode(np.array(toks + [7] * (len(keys) - 2)))
        got = [out[0], out[1]]
        want = [half.decode(np.array([toks[0]]))[0], full.decode(np.array([toks[1]]))[0]]


def test_lora_scale_over_http(lora: SimpleNamespace, lora_half: Path, tiny_model: Path) -> None:
    import httpx
    import openai
    from tests.servers import ServerThread

    msg = [{"role": "user", "content": "Say hi"}]
    greedy = SamplingParams(temperature=0.0, max_tokens=8)

    def answer(model: Path) -> str:
        engine = AsyncEngine.load(model)

        async def go() -> str:
            await engine.start()
            try:
                return (await engine.generate(messages=msg, params=greedy)).text
            finally:
                await engine.stop()

        return asyncio.run(go())

    want_half, want_full = answer(lora_half), answer(lora.merged)
    assert want_half != want_full
    with ServerThread(tiny_model, home=lora.home) as srv:
        client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="none")

        def ask(**extra: object) -> str:
            r = client.chat.completions.create(model="tiny:my-adapter", messages=msg, max_tokens=8, temperature=0,
                                               extra_body=extra)
            return r.choices[0].message.content or ""

        # the same prompt at two scales: the prefix cache must not hand one scale's KV to the other
        assert ask(lora_scale=0.5) == want_half and ask() == want_full and ask(lora_scale=1.0) == want_full
        assert ask(lora_scale=0.5) == want_half
        text = client.completions.create(model="my-adapter", prompt="Hello", max_tokens=4, temperature=0,
                                         extra_body={"lora_scale": 0.0}).choices[0].text
        base = client.completions.create(model="tiny", prompt="Hello", max_tokens=4, temperature=0).choices[0].text
        assert text == base  # scale 0: the base model
        import anthropic

        out = client.responses.create(model="tiny:my-adapter", input="Say hi", max_output_tokens=8, temperature=0,
                                      extra_body={"lora_scale": 0.5})
        assert out.output_text == want_half
        claude = anthropic.Anthropic(base_url=srv.url, api_key="none")
        said = claude.messages.create(model="tiny:my-adapter", max_tokens=8, messages=msg,  # type: ignore[arg-type]
                                      extra_body={"lora_scale": 0.5, "temperature": 0})
        assert said.content[0].text == want_half
        r = httpx.post(f"{srv.url}/v1/messages", timeout=60, json={
            "model": "tiny", "max_tokens": 2, "messages": msg, "lora_scale": 0.5})
        assert r.status_code == 400 and "lora_scale" in r.json()["error"]["message"], r.text
        for body, needle in [({"model": "tiny", "lora_scale": 0.5}, "base model"),
                             ({"model": "my-adapter", "lora_scale": "half"}, "lora_scale"),
                             ({"model": "my-adapter", "lora_scale": 11}, "between -10 and 10"),
                             ({"model": "my-adapter", "lora_scale": True}, "lora_scale")]:
            r = httpx.post(f"{srv.url}/v1/chat/completions", timeout=60,
                           json=body | {"messages": msg, "max_tokens": 2})
            assert r.status_code == 400 and r.json()["error"]["param"] == "lora_scale", r.text
            assert needle in r.json()["error"]["message"], r.text
