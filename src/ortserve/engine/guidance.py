"""Constrained decoding with llguidance: a token mask per step from a JSON schema, a regex
or a Lark grammar, applied to the logits before sampling.

``Guidance`` belongs to one loaded model (its tokenizer, built once, lazily) and caches
compiled grammars by content hash; ``Guide`` is one sequence's matcher. The engine loop
asks every guided row's mask in one parallel call (``fill_masks``) while the decode step
runs, so constrained rows do not stall the batch. No torch: the numpy bitmask helpers.

A guide for JSON output or a tool-call list also carries a policy (engine/closing.py) that
adjusts its mask: close the JSON before ``max_tokens``, end a list of calls on a repeat, cap
runs of whitespace.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from ortserve.engine.jsonlark import JSON_STYLE
from ortserve.errors import InvalidRequest, ModelError

log = logging.getLogger(__name__)

KINDS = ("json_schema", "regex", "grammar")


@dataclass(frozen=True)
class Constraint:
    """What the output must match: kind is one of KINDS; text is the schema (JSON text),
    the regex or the Lark grammar. ``param`` names the request field for error messages;
    ``max_tokens`` is the answer's budget, which JSON output closes within (not part of the
    grammar: guides of one compiled grammar share it whatever their budget)."""

    kind: str
    text: str
    param: str = "response_format"
    max_tokens: int | None = None

    @classmethod
    def json_schema(cls, schema: Any, param: str = "response_format") -> Constraint:
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except ValueError as exc:
                raise InvalidRequest(f"the JSON schema is not valid JSON: {exc}", param=param) from exc
        if isinstance(schema, bool):
            schema = {} if schema else {"not": {}}
        if not isinstance(schema, dict):
            raise InvalidRequest("the JSON schema must be an object", param=param)
        return cls("json_schema", json.dumps(schema), param)

    def key(self) -> str:
        return hashlib.sha256(f"{self.kind}\0{self.text}".encode()).hexdigest()

    def lark(self) -> str:
        """The constraint as an llguidance grammar (JSON schemas get the one-line JSON style)."""
        import llguidance

        if self.kind == "json_schema":
            schema = json.loads(self.text)
            schema.setdefault("x-guidance", JSON_STYLE)
            return str(llguidance.LLMatcher.grammar_from_json_schema(schema))
        if self.kind == "regex":
            return str(llguidance.LLMatcher.grammar_from_regex(self.text))
        return str(llguidance.LLMatcher.grammar_from_lark(self.text))


class Guidance:
    """The grammar side of one model: tokenizer, compiled-grammar cache, parallel executor."""

    def __init__(self, tokenizer_json: Path, vocab_size: int, eos_ids: tuple[int, ...],
                 cache_size: int = 256) -> None:
        self._path = tokenizer_json
        self._json = fit_vocabulary(tokenizer_json, vocab_size)   # a clear error at load, never a 500 later
        self.vocab_size = vocab_size
        self.eos_ids = eos_ids
        self._lock = threading.Lock()
        self._tok: Any = None
        self._executor: Any = None
        self._cache: OrderedDict[str, Any] = OrderedDict()
        self._cache_size = cache_size
        self._vocab: Any = None  # engine/closing.py's view of the tokens, built on first use
        self._shortest: dict[str, int | None] = {}  # constraint key -> tokens of its shortest answer
        self.compiles = 0
        self.hits = 0

    @property
    def tokenizer(self) -> Any:
        with self._lock:
            if self._tok is None:
                import llguidance

                try:
                    self._tok = llguidance.LLTokenizer(self._json, n_vocab=self.vocab_size,
                                                       eos_token=list(self.eos_ids))
                except ValueError as exc:   # not a request's fault: the model's files disagree
                    raise ModelError(f"{self._path}: llguidance cannot use this tokenizer: {exc}",
                                     hint="re-import the model (ortserve models import)") from exc
                self._executor = llguidance.LLExecutor()
            return self._tok

    @property
    def vocab(self) -> Any:
        """The tokens as the closing policies see them (engine/closing.py), built once."""
        from ortserve.engine.closing import Vocab

        tok = self.tokenizer
        with self._lock:
            if self._vocab is None:
                self._vocab = Vocab(tok, self.vocab_size, self.eos_ids)
            return self._vocab

    def guide(self, constraint: Constraint) -> Guide:
        """A fresh matcher for one sequence; compiling once per distinct grammar."""
        import llguidance

        key = constraint.key()
        tok = self.tokenizer
        with self._lock:
            proto = self._cache.get(key)
            if proto is not None:
                self._cache.move_to_end(key)
                self.hits += 1
        if proto is None:
            try:
                grammar = constraint.lark()
            except (ValueError, TypeError) as exc:
                raise InvalidRequest(f"cannot use this {_what(constraint)}: {exc}", param=constraint.param) from exc
            bad, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, tok)
            if bad:
                raise InvalidRequest(f"cannot enforce this {_what(constraint)}: {'; '.join(messages)}",
                                     param=constraint.param)
            proto = llguidance.LLMatcher(tok, grammar)
            if proto.is_error():
                raise InvalidRequest(f"cannot enforce this {_what(constraint)}: {proto.get_error()}",
                                     param=constraint.param)
            with self._lock:
                self.compiles += 1
                self._cache[key] = proto
                while len(self._cache) > self._cache_size:
                    self._cache.popitem(last=False)
        from ortserve.engine.closing import policy_for

        policy = policy_for(constraint.kind, constraint.text, self.vocab, constraint.max_tokens)
        return Guide(proto.deep_copy(), self.vocab_size, policy)

    def shortest(self, constraint: Constraint) -> int | None:
        """Tokens of the shortest answer the closing policies can end this constraint with
        (engine/closing.py; None past 4096): a budget below it cannot hold a parseable answer.
        Found once per grammar (a few dozen mask computations), then cached with it."""
        from ortserve.engine.closing import shortest_answer

        key = constraint.key()
        if key not in self._shortest:
            need = shortest_answer(self.guide(replace(constraint, max_tokens=None)).matcher, self.vocab, 4096)
            with self._lock:
                if len(self._shortest) >= self._cache_size:
                    self._shortest.pop(next(iter(self._shortest)))
                self._shortest[key] = need
        return self._shortest[key]

    def fill_masks(self, guides: list[tuple[Guide, int]], out: np.ndarray) -> None:
        """Write each guide's next-token mask into row ``i`` of ``out`` (in parallel threads)."""
        from llguidance.numpy import fill_next_token_bitmask_par

        fill_next_token_bitmask_par(self._executor, [(g.matcher, i) for g, i in guides], out)
        for g, i in guides:
            g.adjust(out[i])


class Guide:
    """One sequence's grammar state: mask the logits, then consume the sampled token."""

    def __init__(self, matcher: Any, vocab_size: int, policy: Any = None) -> None:
        self.matcher = matcher
        self.vocab_size = vocab_size
        self.policy = policy  # engine/closing.py: JsonBudget, ToolBudget or None

    def compute_mask(self, out: np.ndarray) -> None:
        from llguidance.numpy import fill_next_token_bitmask

        fill_next_token_bitmask(self.matcher, out.reshape(1, -1))
        self.adjust(out.reshape(-1))

    def adjust(self, row: np.ndarray) -> None:
        """The policy's changes to a freshly computed mask row (closing, whitespace, ending a call list)."""
        if self.policy is not None:
            self.policy.adjust(self.matcher, row)

    def consume(self, token: int) -> None:
        if not self.matcher.consume_token(token):
            raise RuntimeError(f"grammar rejected token {token}: {self.matcher.get_error()}")
        if self.policy is not None:
            self.policy.observe(token, self.matcher)

    @property
    def stopped(self) -> bool:
        """No more tokens: the grammar is complete, or the policy ended the answer."""
        return bool(self.matcher.is_stopped()) or (self.policy is not None and self.policy.ended)

    @property
    def finish_reason(self) -> str:
        """Why a stopped guide stopped: "stop" (complete), also where the budget closed it
        (``policy.closed_early``; engine/closing.py)."""
        return self.policy.finish_reason if self.policy is not None else "stop"


def fit_vocabulary(tokenizer_json: Path, vocab_size: int) -> str:
    """tokenizer.json's text with no id at or past ``vocab_size`` (the model's logit rows), so
    llguidance, the sampler and the detokenizer agree on one size. Added tokens past the rows
    (an older GGUF import's invented ``<|endoftext|>``, issue 46) are dropped, with a warning:
    the model can never produce them. A model vocabulary past the rows is refused here, at load."""
    text = tokenizer_json.read_text(encoding="utf-8")
    tok = json.loads(text)
    vocab = (tok.get("model") or {}).get("vocab")
    ids = vocab.values() if isinstance(vocab, dict) else range(len(vocab or ()))
    top = max(ids, default=-1)
    if top >= vocab_size:
        raise ModelError(f"{tokenizer_json}: the tokenizer has token id {top} but the model has "
                         f"{vocab_size} vocabulary rows", hint="the model's tokenizer and weights disagree")
    extra = [a for a in tok.get("added_tokens") or [] if int(a["id"]) >= vocab_size]
    if not extra:
        return text
    log.warning("%s names %d added token(s) past the model's %d rows (%s): masked, as the model cannot "
                "produce them; re-import the model to drop them", tokenizer_json, len(extra), vocab_size,
                ", ".join(a["content"] for a in extra[:4]))
    tok["added_tokens"] = [a for a in tok["added_tokens"] if int(a["id"]) < vocab_size]
    return json.dumps(tok)


def allocate_masks(rows: int, vocab_size: int) -> np.ndarray:
    return np.full((rows, (vocab_size + 31) // 32), -1, dtype=np.int32)


def apply_mask(logits: np.ndarray, mask: np.ndarray) -> None:
    """Set the logits of tokens the mask forbids to -inf, in place (1-D logits)."""
    allowed = np.unpackbits(mask.view(np.uint8), bitorder="little").view(bool)
    n = min(logits.shape[-1], allowed.size)
    logits[:n][~allowed[:n]] = -np.inf
    logits[n:] = -np.inf


def _what(c: Constraint) -> str:
    return {"json_schema": "JSON schema", "regex": "regex", "grammar": "grammar"}[c.kind]


def constraint_of(params: Any) -> Constraint | None:
    """The constraint a SamplingParams asks for (json_schema, regex or grammar), if any."""
    if params.json_schema is not None:
        return replace(Constraint.json_schema(params.json_schema, param="json_schema"), max_tokens=params.max_tokens)
    if params.regex is not None:
        return Constraint("regex", params.regex, "regex", params.max_tokens)
    if params.grammar is not None:
        return Constraint("grammar", params.grammar, "grammar", params.max_tokens)
    return None
