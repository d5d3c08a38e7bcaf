"""Requests that schemathesis found answered 500 (issue 45's 20,000-case run,
benchmarks/schemathesis_run.py), each sent again to a real server: now a 4xx in the API's own
error shape, naming the field."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from tests.servers import ServerThread

from ortserve.errors import NotFound
from ortserve.models import select
from ortserve.models.store import ModelStore


@pytest.fixture(scope="module")
def srv(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    with ServerThread(tiny_model, home=tmp_path_factory.mktemp("fuzz-regress-home"), max_tokens_cap=8,
                      default_max_tokens=4) as s:
        yield s


def _error(r: httpx.Response, status: int, param: str) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["param"] == param, err
    return err


# found: POST /detokenize {"tokens": [-2209, -817], "model": "\n"} -> 500 ". has no genai_config.json":
# the store's resolver stripped the name to "", and Path("") is the current directory, which the
# manager then tried to load as a model
@pytest.mark.parametrize("name", ["\n", " ", "\t \r\n"])
@pytest.mark.parametrize(("path", "body"), [
    ("/detokenize", {"tokens": [1, 2]}),
    ("/tokenize", {"content": "hi"}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 2}),
])
def test_a_blank_model_name_is_a_404_naming_model(srv: ServerThread, name: str, path: str, body: dict) -> None:
    r = httpx.post(f"{srv.url}{path}", json={**body, "model": name}, timeout=60)
    err = _error(r, 404, "model")
    assert err["code"] == "model_not_found"
    assert "blank" in err["message"]


def test_the_store_resolver_refuses_a_blank_name_instead_of_the_current_directory(tmp_path: Path) -> None:
    with pytest.raises(NotFound, match="blank"):
        select.resolve(ModelStore(tmp_path / "models"), " \n")
