"""Speculation seen from outside (docs/speculative.md): the per-request switch in the seed API and
the OpenAI body, a bad value refused naming the field, per-request stats in the seed's metrics,
the Prometheus counters and the dashboard's acceptance."""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest
from servers import ServerThread

REPEAT = "one two three four one two three four one two three four one two"


@pytest.fixture(scope="module")
def srv(tiny_model: Path):
    with ServerThread(tiny_model, max_tokens_cap=64) as s:
        yield s


def seed(srv: ServerThread, **fields: object) -> httpx.Response:
    bias = {str(t): 12.0 for t in srv.state.engine.codec.encode(" one two three four")}  # the tiny model copies
    return httpx.post(f"{srv.url}/v1/chat", json={"messages": [{"role": "user", "content": REPEAT}],
                                                  "max_tokens": 24, "temperature": 0, "logit_bias": bias,
                                                  **fields}, timeout=60)


def test_the_seed_api_reports_what_was_guessed_and_a_request_can_turn_it_off(srv: ServerThread) -> None:
    on = seed(srv)
    assert on.status_code == 200, on.text
    spec = on.json()["metrics"]["speculative"]
    assert spec["proposed"] >= spec["accepted"] > 0 and 0 < spec["acceptance"] <= 1
    off = seed(srv, speculative=False)
    assert off.status_code == 200 and off.json()["metrics"]["speculative"] is None
    assert off.json()["content"] == on.json()["content"]  # greedy: the same answer either way
    text = httpx.get(f"{srv.url}/metrics").text
    accepted = next(float(line.split()[-1]) for line in text.splitlines()
                    if line.startswith("ortserve_speculative_accepted_tokens_total"))
    assert accepted >= spec["accepted"]
    ui = httpx.get(f"{srv.url}/ui/stats").json()["speculative"]
    assert ui["accepted"] == accepted and ui["acceptance"] > 0


def test_the_openai_body_takes_it_as_an_extra_field(srv: ServerThread) -> None:
    client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="x", max_retries=0)
    msgs = [{"role": "user", "content": REPEAT}]
    a = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=12, temperature=0,
                                       extra_body={"speculative": False})
    b = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=12, temperature=0)
    assert a.choices[0].message.content == b.choices[0].message.content
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="tiny", messages=msgs, max_tokens=4, extra_body={"speculative": "no"})
    assert "speculative" in str(err.value)
    r = httpx.post(f"{srv.url}/v1/completions", json={"prompt": REPEAT, "max_tokens": 4, "speculative": 1})
    assert r.status_code == 400 and "speculative" in r.text
    assert seed(srv, speculative="off").status_code == 400
