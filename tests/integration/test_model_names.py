"""Issue 45 part 5: every response's ``model`` names the model and variant that served it, and
sending that name back selects the same one (chat models and embedding models)."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
from tests.servers import ServerThread

from ortserve.config import load_settings
from ortserve.models.locate import resolve_model_dir
from ortserve.models.store import ModelStore

MSG = [{"role": "user", "content": "Say hi"}]


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Path:
    """A store holding the tiny model as two variants of one model, tiny-r:fp32-cpu and tiny-r:int8-cpu."""
    home = tmp_path_factory.mktemp("names-home")
    store = ModelStore(home / "models")
    for precision in ("fp32", "int8"):
        def copy(tmp: Path, precision: str = precision) -> dict[str, str]:
            shutil.copytree(tiny_model, tmp, dirs_exist_ok=True)
            return {"precision": precision, "device": "cpu"}
        store.install("tiny-r", f"{precision}-cpu", copy)
    return home


def _ps(srv: ServerThread) -> dict:
    return httpx.get(f"{srv.url}/v1/admin/ps", timeout=10).json()


def test_chat_answers_the_variant_and_the_answer_selects_it(home: Path) -> None:
    settings = load_settings(home=home)
    start_dir, start_id = resolve_model_dir("tiny-r", settings)
    assert start_id.startswith("tiny-r:") and start_id.endswith("-cpu")   # the start model is named with its variant
    other = "tiny-r:int8-cpu" if start_id == "tiny-r:fp32-cpu" else "tiny-r:fp32-cpu"
    with ServerThread(start_dir, model_id=start_id, home=home) as srv:
        client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="unused", max_retries=0)
        bare = client.chat.completions.create(model="tiny-r", messages=MSG, max_tokens=2)
        assert bare.model == start_id
        again = client.chat.completions.create(model=bare.model, messages=MSG, max_tokens=2)
        assert again.model == start_id
        picked = client.chat.completions.create(model=other, messages=MSG, max_tokens=2)
        assert picked.model == other
        back = client.chat.completions.create(model=picked.model, messages=MSG, max_tokens=2)
        assert back.model == other
        # each name was served by one load of its own variant: sending a name back loaded nothing new
        rows = {r["model"]: r for r in _ps(srv)["models"]}
        assert set(rows) == {start_id, other} and _ps(srv)["loads_total"][other] == 1
        assert Path(rows[other]["path"]).resolve() == ModelStore(home / "models").get(other).model_dir.resolve()
        # the other wire APIs name it the same way
        done = client.completions.create(model=other, prompt="Hi", max_tokens=2)
        resp = client.responses.create(model=other, input="Hi", max_output_tokens=16)
        assert done.model == resp.model == other


def test_embeddings_answer_the_variant_and_the_answer_selects_it(tiny_model: Path, embedding_model: Path,
                                                                 tmp_path: Path) -> None:
    with ServerThread(tiny_model, rag_dir=tmp_path / "rag") as srv:
        client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="unused", max_retries=0)

        def embed(model: str) -> tuple[str, np.ndarray]:
            r = client.embeddings.create(model=model, input="a cat sat", encoding_format="float")
            return r.model, np.array(r.data[0].embedding, dtype=np.float32)

        fp32_name, fp32 = embed("all-minilm-l6-v2:fp32-cpu")
        int8_name, int8 = embed("all-minilm-l6-v2:int8-cpu")
        assert (fp32_name, int8_name) == ("all-minilm-l6-v2:fp32-cpu", "all-minilm-l6-v2:int8-cpu")
        assert not np.array_equal(fp32, int8)          # the two variants are told apart by their vectors
        default_name, default = embed("all-minilm-l6-v2")
        assert default_name in (fp32_name, int8_name)  # the bare name answers the variant it chose
        for name, vec in ((fp32_name, fp32), (int8_name, int8), (default_name, default)):
            again_name, again = embed(name)
            assert again_name == name and np.array_equal(again, vec)
