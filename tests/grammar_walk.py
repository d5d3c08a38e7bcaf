"""A random but grammar-valid completion, for tests of the tool-call grammars: the argmax of
random logits under the grammar's mask, token by token, until the grammar stops, an end token is
taken, or ``budget`` tokens are written. Callers assert how it may end."""
from __future__ import annotations

from typing import Any

import numpy as np

from ortserve.engine.guidance import Constraint, Guidance, allocate_masks, apply_mask


def random_completion(guidance: Guidance, grammar: str, seed: int, budget: int) -> tuple[list[int], Any]:
    """(the tokens written, end token excluded; the guide after them)."""
    rng = np.random.default_rng(seed)
    guide = guidance.guide(Constraint("grammar", grammar, "tools", budget))
    mask, ids = allocate_masks(1, guidance.vocab_size), []
    while not guide.stopped and len(ids) < budget:
        guide.compute_mask(mask[0])
        logits = rng.standard_normal(guidance.vocab_size).astype(np.float32)
        apply_mask(logits, mask[0])
        token = int(np.argmax(logits))
        guide.consume(token)
        if token in guidance.eos_ids:
            break
        ids.append(token)
    return ids, guide
