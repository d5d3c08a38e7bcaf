"""Draft-model speculation: a small model of the same vocabulary guesses the next tokens.

What vLLM's ``speculative_config={"model": ..., "num_speculative_tokens": k}`` and llama-server's
``--model-draft`` give. The draft is its own ONNX Runtime session with one KV row (``Runner(slots=1)``)
that follows the one sequence the engine speculates on: before it guesses, it catches up on the
tokens the target accepted since (one multi-token step), then proposes k greedy tokens one decode
step at a time. The target verifies them in one step (engine/speculation/speculate.py, the same verify path as
prompt lookup, so the output is exactly what the target alone would give).

Rolling back is keeping: the draft's row holds the tokens in ``held``; at the next guess it keeps
the longest prefix that still agrees with the sequence (what was accepted) and feeds the rest. A
different sequence (another request) shares what its prompt has in common and recomputes the rest.

The vocabularies must be identical (every token id names the same string, the same tokens are
special): a draft's token id is fed to the target as is. ``check_vocabulary`` says which differ.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from ortserve.engine.runner import ModelSpec, Runner
from ortserve.errors import ModelError

log = logging.getLogger("ortserve.engine")

CATCH_UP_CHUNK = 512  # tokens the draft prefills per call when it catches up on a long prompt


def vocabulary(model_dir: Path) -> tuple[dict[int, str], frozenset[int]]:
    """A model's token id -> string map (added tokens included) and its special token ids."""
    from tokenizers import Tokenizer

    path = Path(model_dir) / "tokenizer.json"
    if not path.is_file():
        raise ModelError(f"{model_dir} has no tokenizer.json: its vocabulary cannot be compared")
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises a bare Exception
        raise ModelError(f"cannot read {path}: {exc}") from exc
    ids = {i: s for s, i in tok.get_vocab(with_added_tokens=True).items()}
    special = frozenset(i for i, t in tok.get_added_tokens_decoder().items() if t.special)
    return ids, special


def check_vocabulary(target_dir: Path, target_id: str, draft_dir: Path, draft_id: str) -> None:
    """Raise a ModelError naming both models and the first difference unless their vocabularies
    are identical (the same string for every token id, the same special tokens)."""
    if Path(target_dir).resolve() == Path(draft_dir).resolve():
        return
    (t_ids, t_special), (d_ids, d_special) = vocabulary(target_dir), vocabulary(draft_dir)
    why = None
    if len(t_ids) != len(d_ids):
        why = f"{len(t_ids)} tokens against {len(d_ids)}"
    elif (diff := next((i for i in sorted(t_ids) if t_ids[i] != d_ids.get(i)), None)) is not None:
        why = f"token {diff} is {t_ids[diff]!r} in {target_id} and {d_ids.get(diff)!r} in {draft_id}"
    elif t_special != d_special:
        odd = min(t_special ^ d_special)
        why = f"token {odd} ({t_ids[odd]!r}) is special in only one of them"
    if why is not None:
        raise ModelError(f"draft model {draft_id} cannot speculate for {target_id}: their vocabularies "
                         f"differ ({why})", hint="a draft model needs the target's tokenizer, e.g. a smaller "
                                                 "model of the same family")


class DraftModel:
    """The draft's session, its one KV row, and the tokens that row holds."""

    def __init__(self, model_dir: Path, model_id: str, runner: Runner) -> None:
        self.dir, self.id, self.runner = Path(model_dir), model_id, runner
        self.held: list[int] = []      # the tokens whose KV row 0 holds, in order
        self.steps = 0                 # draft model calls (catch-up and guesses)

    @classmethod
    def load(cls, model_dir: Path, model_id: str, target_dir: Path, target_id: str, *,
             providers: list[Any], session_options: Any, settings: Any = None) -> DraftModel:
        """Check the vocabulary against the target's, then load the draft with one KV row."""
        check_vocabulary(target_dir, target_id, model_dir, model_id)
        spec = ModelSpec.read(Path(model_dir))
        runner = Runner(spec, slots=1, providers=providers, session_options=session_options,
                        kv_placement=str(getattr(settings, "kv_placement", "auto")),
                        huge_pages=bool(getattr(settings, "huge_pages", True)))
        log.info("draft model %s speculates for %s", model_id, target_id)
        return cls(model_dir, model_id, runner)

    @property
    def context_length(self) -> int:
        return self.runner.spec.context_length

    def max_bytes(self, context_length: int) -> int:
        """The most KV the draft's row can take, for a target of ``context_length`` tokens."""
        return min(self.context_length, context_length) * self.runner.bytes_per_token

    def propose(self, context: list[int], k: int, vocab: int) -> list[int]:
        """k greedy guesses for what follows ``context`` (ids below ``vocab``, the target's width)."""
        k = min(k, self.context_length - len(context))
        if k <= 0:
            return []
        keep = common_prefix(self.held, context, limit=len(context) - 1)  # the last token is fed again
        self.runner.keep(0, keep)
        del self.held[keep:]
        logits = None
        while keep < len(context):  # catch up: what the target accepted since, or a new prompt
            chunk = context[keep:keep + CATCH_UP_CHUNK]
            logits = self.runner.prefill(0, chunk, start=keep, total=len(context) + k)
            self.held += chunk
            keep += len(chunk)
            self.steps += 1
        assert logits is not None
        guesses = [int(np.argmax(logits[:vocab]))]
        while len(guesses) < k:
            logits = self.runner.decode(np.asarray(guesses[-1:], dtype=np.int64))[0]
            self.held.append(guesses[-1])
            self.steps += 1
            guesses.append(int(np.argmax(logits[:vocab])))
        return guesses

    def forget(self) -> None:
        """Hold nothing (after an error: what the row holds is not known)."""
        self.held.clear()
        self.runner.keep(0, 0)


def common_prefix(a: list[int], b: list[int], limit: int) -> int:
    """How many leading tokens ``a`` and ``b`` share, at most ``limit``."""
    n = min(len(a), len(b), limit)
    if n <= 0:
        return 0
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if diff.size else n

