"""usage.prompt_tokens_details.cached_tokens (and each API's own name for it) reports the prompt
tokens that came from the prefix cache: on chat and completions, streamed and not, on Responses
and on Messages."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anthropic
import pytest
from openai import OpenAI
from servers import ServerThread

pytestmark = pytest.mark.default_model

SYSTEM = "You are a careful assistant for a hardware store. " * 30  # ~300 tokens shared by every turn


@pytest.fixture(scope="module")
def srv(default_model: Path) -> Iterator[ServerThread]:
    with ServerThread(default_model) as s:
        yield s


def test_chat_reports_cached_tokens(srv: ServerThread) -> None:
    c = OpenAI(base_url=f"{srv.url}/v1", api_key="none", max_retries=0, timeout=120)
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Do you sell hammers?"}]
    first = c.chat.completions.create(model="default", messages=msgs, max_tokens=8, temperature=0)
    again = c.chat.completions.create(model="default", messages=msgs, max_tokens=8, temperature=0)
    # (token identity with reuse on and off is tested on the fp32 tiny model in test_prefix_cache.py; on
    # the default model's int8-activation kernels the split of a prompt into steps moves logits, as
    # chunked prefill already did: docs/prefix_cache.md)
    assert again.usage.prompt_tokens == first.usage.prompt_tokens
    assert again.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - 1 > 250
    other = msgs[:1] + [{"role": "user", "content": "And nails?"}]  # same system prompt, new question
    stream = c.chat.completions.create(model="default", messages=other, max_tokens=8, temperature=0, stream=True,
                                       stream_options={"include_usage": True})
    usage = [ch.usage for ch in stream if ch.usage is not None][-1]
    assert 250 < usage.prompt_tokens_details.cached_tokens < usage.prompt_tokens


def test_completions_responses_and_messages_report_cached_tokens(srv: ServerThread) -> None:
    c = OpenAI(base_url=f"{srv.url}/v1", api_key="none", max_retries=0, timeout=120)
    prompt = SYSTEM + "\nQ: Do you sell saws?\nA:"
    c.completions.create(model="default", prompt=prompt, max_tokens=4)
    again = c.completions.create(model="default", prompt=prompt, max_tokens=4)
    assert again.usage.prompt_tokens_details.cached_tokens > 250
    r1 = c.responses.create(model="default", instructions=SYSTEM, input="Hammers?", max_output_tokens=4, store=False)
    r2 = c.responses.create(model="default", instructions=SYSTEM, input="Nails?", max_output_tokens=4, store=False)
    assert r2.usage.input_tokens_details.cached_tokens > 250 >= r1.usage.input_tokens_details.cached_tokens - 300
    a = anthropic.Anthropic(base_url=srv.url, api_key="none", max_retries=0, timeout=120)
    m = a.messages.create(model="default", system=SYSTEM, max_tokens=4, messages=[{"role": "user", "content": "Saws?"}])
    assert m.usage.cache_read_input_tokens > 250 and m.usage.input_tokens < 50
