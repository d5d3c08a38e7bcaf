"""``tool_choice: "required"`` and a named tool always yield a parseable call within ``max_tokens``
on each family's random GGUF (issue 46), whatever syntax its template picks; a budget that cannot
hold the shortest call is a 400 naming max_tokens. Random weights wander (a Phi-3.5-shaped file
filled a string argument until the budget ran out: no call at all); the closing policy ends the
first call in time (engine/closing.py, ToolBudget). 100 seeds per family: benchmarks/tool_required.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from servers import ServerThread
from tests.integration.family_models import FAMILIES
from tests.integration.required_calls import NAMED, ask, count

SEEDS = range(6)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_required_and_named_always_call(family_models: dict[str, Path], name: str) -> None:
    with ServerThread(family_models[name], model_id=name) as s:
        got, bad = count(s.url, name, SEEDS)
        assert got == len(SEEDS), bad
        got, bad = count(s.url, name, SEEDS, NAMED)
        assert got == len(SEEDS), bad
        r = ask(s.url, name, 0, "required", max_tokens=3)
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == "max_tokens" and "cannot hold a tool call" in err["message"], err
