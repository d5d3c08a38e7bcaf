"""Any chat model as a reranker: the Qwen3-Reranker method.

Each (query, document) pair becomes one fixed chat prompt asking whether the passage contains the
answer to the question, to be answered "yes" or "no". The model's next-token distribution gives
the score: ``P(yes) / (P(yes) + P(no))``, summed over the spellings the tokenizer has as one
token ("yes", "Yes", " yes", ...). Every pair is submitted at once, so the engine batches them
(continuous batching), one token each.

The wording was chosen on the default model, SmolLM2-135M-Instruct: Qwen3-Reranker's own prompt
(system judge instruction, ``<Instruct>/<Query>/<Document>``) ranked the relevant document first
for 3 of 10 queries there, a few-shot variant 3-4, this one 10 of 10 on the suite's set and on a
second set written afterwards (tests/integration/rerank_material.py holds the first).

The engine reports the raw log-probabilities of the token it picked and of the 20 likeliest
(engine/sampler.py ``token_logprobs``). A ``logit_bias`` of +100 on the yes/no spellings makes the
picked token one of them; a spelling outside the top 20 is counted at the 20th's probability, an
upper bound that only matters when the other answer is already far likelier.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ortserve.types import SamplingParams

YES = ("yes", "Yes", " yes", " Yes", "YES")
NO = ("no", "No", " no", " No", "NO")
TOP = 20   # the most alternatives the engine reports per token


@dataclass(frozen=True)
class Judged:
    scores: list[float]
    prompt_tokens: int


def messages_for(query: str, document: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"Question: {query}\nPassage: {document}\n"
                                        "Does the passage contain the answer to the question? Answer yes or no."}]


def answer_tokens(codec: Any) -> tuple[set[int], set[int]]:
    """The single-token spellings of "yes" and of "no" in this tokenizer."""
    def ids(words: Sequence[str]) -> set[int]:
        out = set()
        for w in words:
            enc = codec.encode(w, add_special_tokens=False)
            if len(enc) == 1:
                out.add(int(enc[0]))
        return out

    yes, no = ids(YES), ids(NO)
    if not yes or not no:
        from ortserve.errors import InvalidRequest

        raise InvalidRequest("this model's tokenizer has no single token for 'yes' or 'no'; it cannot judge "
                             "relevance: use a cross-encoder reranker", param="model", code="wrong_model_kind")
    return yes, no


def params_for(yes: set[int], no: set[int]) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=1, logprobs=TOP, speculative=False,
                          logit_bias=tuple((t, 100.0) for t in sorted(yes | no)))


def p_yes(entry: tuple[int, float, list[tuple[int, float]]], yes: set[int], no: set[int]) -> float:
    """P(yes) / (P(yes) + P(no)) from one token's (picked, logprob, top alternatives)."""
    token, lp, alts = entry
    seen = dict(alts)
    seen[token] = lp
    floor = min(seen.values())   # a spelling outside the reported top: at most the last one's
    py = sum(math.exp(seen[t]) for t in yes if t in seen) or math.exp(floor)
    pn = sum(math.exp(seen[t]) for t in no if t in seen) or math.exp(floor)
    return py / (py + pn)


async def judge(engine: Any, query: str, documents: Sequence[str]) -> Judged:
    """Score every document against ``query`` with ``engine`` (an engine.AsyncEngine), batched."""
    yes, no = answer_tokens(engine.codec)
    params = params_for(yes, no)
    handles = [engine.submit(messages=messages_for(query, d), params=params, thinking=False)
               for d in documents]
    entries = await asyncio.gather(*(_first_token(h) for h in handles))
    return Judged([p_yes(e, yes, no) for e in entries], sum(h.input_tokens for h in handles))


async def _first_token(handle: Any) -> tuple[int, float, list[tuple[int, float]]]:
    first = None
    async for ev in handle:
        if ev.error:
            from ortserve.errors import OrtServeError

            raise OrtServeError(f"judging a document failed: {ev.error}")
        if first is None and ev.logprobs:
            first = ev.logprobs[0]
        if ev.finished:
            break
    if first is None:
        from ortserve.errors import OrtServeError

        raise OrtServeError("the model gave no token to judge the document by")
    return first
