"""The finish rule (docs/tools.md, issue 46): ``length`` means the content was cut. JSON the grammar
closed within ``max_tokens`` parses and finishes ``stop``, so the openai SDK's ``parse()`` returns the
object (it raises ``LengthFinishReasonError`` on ``length``); a budget below the schema's shortest
answer is still ``length`` and still raises. The real default model and the real openai client."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from openai import OpenAI
from pydantic import BaseModel
from servers import ServerThread

pytestmark = pytest.mark.default_model
DESCRIBE = [{"role": "user", "content": "Describe Paris as a JSON object."}]


class City(BaseModel):
    name: str
    facts: list[str]


@pytest.fixture(scope="module")
def client(default_model: Path) -> Iterator[OpenAI]:
    with ServerThread(default_model) as srv:
        yield OpenAI(base_url=f"{srv.url}/v1", api_key="none", max_retries=0, timeout=300)


@pytest.mark.parametrize("max_tokens", [16, 32, 128])
def test_parse_returns_the_object_within_the_budget(client: OpenAI, max_tokens: int) -> None:
    for seed in range(3):
        r = client.chat.completions.parse(model="default", messages=DESCRIBE, response_format=City,
                                          max_tokens=max_tokens, temperature=1, seed=seed)
        ch = r.choices[0]
        assert ch.finish_reason == "stop" and isinstance(ch.message.parsed, City), ch
        assert r.usage is not None and r.usage.completion_tokens <= max_tokens


def test_beta_parse_too(client: OpenAI) -> None:
    r = client.beta.chat.completions.parse(model="default", messages=DESCRIBE, response_format=City,
                                           max_tokens=128, temperature=0)
    assert isinstance(r.choices[0].message.parsed, City)


def test_a_budget_below_the_shortest_answer_is_cut_and_says_length(client: OpenAI) -> None:
    with pytest.raises(openai.LengthFinishReasonError):
        client.chat.completions.parse(model="default", messages=DESCRIBE, response_format=City,
                                      max_tokens=3, temperature=1, seed=0)
