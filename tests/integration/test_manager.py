"""The model manager through a real server: two store models, keep_alive, eviction under a
budget, one load for concurrent first requests, a model too large, and ps/load/unload."""

from __future__ import annotations

import concurrent.futures
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from tests.clocks import ManualClock, wait_until
from tests.servers import ServerThread

from ortserve.config import load_settings
from ortserve.models.store import ModelStore
from ortserve.server.manager import chat_estimate, weights_bytes

A, B = "tiny-a:fp32-cpu", "tiny-b:fp32-cpu"
MSG = [{"role": "user", "content": "Say hi"}]


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Path:
    """A store holding copies of the tiny model as tiny-a and tiny-b, and tiny-same: a link to
    the very directory the servers below start with."""
    home = tmp_path_factory.mktemp("manager-home")
    store = ModelStore(home / "models")

    def copy(tmp: Path) -> dict[str, str]:
        shutil.copytree(tiny_model, tmp, dirs_exist_ok=True)
        return {"precision": "fp32", "device": "cpu"}

    for name in ("tiny-a", "tiny-b"):
        store.install(name, "fp32-cpu", copy)
    store.install("tiny-same", "fp32-cpu", lambda _tmp: {"precision": "fp32", "device": "cpu",
                                                         "link": str(tiny_model)})
    return home


@pytest.fixture(scope="module")
def model_mb(tiny_model: Path) -> float:
    """What an on-demand tiny model plans (and is capped at): weights + KV of max_batch x 512 tokens."""
    return chat_estimate(load_settings())(tiny_model) / (1 << 20)


@pytest.fixture(scope="module")
def pinned_mb(home: Path, tiny_model: Path) -> float:
    """What the pinned start model holds: weights + the engine's own KV budget."""
    with ServerThread(tiny_model, home=home) as srv:
        return ps(srv)["models"][0]["memory_bytes"] / (1 << 20)


def chat(srv: ServerThread, model: str, **extra: object) -> httpx.Response:
    return httpx.post(f"{srv.url}/v1/chat/completions", timeout=60,
                      json={"model": model, "messages": MSG, "max_tokens": 4, "temperature": 0, **extra})


def ps(srv: ServerThread) -> dict:
    return httpx.get(f"{srv.url}/v1/admin/ps", timeout=10).json()


def loaded(srv: ServerThread) -> list[str]:
    return [m["model"] for m in ps(srv)["models"] if m["state"] == "loaded"]


def test_two_store_models_served_by_one_server(home: Path, tiny_model: Path) -> None:
    with ServerThread(tiny_model, home=home) as srv:
        ra, rb, rt = chat(srv, A), chat(srv, "tiny-b"), chat(srv, "tiny")
        assert [r.status_code for r in (ra, rb, rt)] == [200, 200, 200]
        assert (ra.json()["model"], rb.json()["model"], rt.json()["model"]) == (A, B, "tiny")
        assert loaded(srv) == ["tiny", A, B]  # pinned first
        seed = httpx.post(f"{srv.url}/v1/chat", json={"model": A, "messages": MSG, "max_tokens": 2}, timeout=60)
        assert seed.status_code == 200
        rows = {m["model"]: m for m in ps(srv)["models"]}
        assert rows[A]["requests"] == 2 and rows[B]["requests"] == 1 and rows["tiny"]["pinned"]
        models = {m["id"]: m for m in httpx.get(f"{srv.url}/v1/models").json()["data"]}
        assert models["tiny"]["loaded"] and models[A]["loaded"] and models[B]["loaded"]
        assert "tiny-same:fp32-cpu" not in models  # the pinned model's own directory: listed once, as "tiny"
        same = chat(srv, "tiny-same")
        assert same.status_code == 200 and same.json()["model"] == "tiny" and ps(srv)["loads_total"]["tiny"] == 1
        metrics = httpx.get(f"{srv.url}/metrics").text
        assert f'ortserve_model_loaded{{kind="chat",model="{A}"}} 1.0' in metrics
        assert f'ortserve_model_requests_total{{model="{B}"}} 1.0' in metrics
        missing = chat(srv, "no-such-model")
        assert missing.status_code == 404 and missing.json()["error"]["param"] == "model"
        assert chat(srv, str(tiny_model)).status_code == 404  # requests name store models, not paths


def test_keep_alive_unloads_and_next_request_reloads(home: Path, tiny_model: Path) -> None:
    # The manager's clock is moved by hand: what is tested is the decision keep_alive makes on
    # the idle time it reads, however slowly a loaded machine answers between the steps.
    clock = ManualClock()
    with ServerThread(tiny_model, home=home, keep_alive=30, manager_clock=clock) as srv:
        assert chat(srv, A).status_code == 200
        srv.reap()
        row = next(m for m in ps(srv)["models"] if m["model"] == A)
        assert A in loaded(srv) and row["idle_seconds"] == 0 and row["expires_in"] == 30
        clock.advance(30)
        assert wait_until(lambda: A not in loaded(srv))  # the reaper's next pass (every 0.1 s)
        assert chat(srv, A, keep_alive=0).status_code == 200  # reloads; 0 = unload right after
        assert wait_until(lambda: A not in loaded(srv))
        assert ps(srv)["loads_total"][A] == 2
        assert chat(srv, A, keep_alive=-1).status_code == 200  # -1: stays
        clock.advance(10**6)
        srv.reap()
        assert A in loaded(srv) and ps(srv)["loads_total"][A] == 3
        assert "tiny" in loaded(srv)  # the pinned model never goes
        bad = chat(srv, A, keep_alive="soon")
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "keep_alive"


def test_eviction_under_a_small_budget(home: Path, tiny_model: Path, model_mb: float, pinned_mb: float) -> None:
    budget = math.ceil(pinned_mb + model_mb * 1.5)  # the pinned model and one more, not two more
    with ServerThread(tiny_model, home=home, memory_budget_mb=budget) as srv:
        assert chat(srv, A).status_code == 200
        assert chat(srv, B).status_code == 200
        assert loaded(srv) == ["tiny", B]  # A (idle, least recently used) made room
        assert chat(srv, A).status_code == 200
        assert loaded(srv) == ["tiny", A]
        assert ps(srv)["used_bytes"] <= budget << 20
        engine_a = srv.state.manager.slots[A].obj
        assert engine_a.kv_budget == math.ceil((model_mb * (1 << 20) - weights_bytes(tiny_model)) / (1 << 20)) << 20


def test_concurrent_first_requests_share_one_load(home: Path, tiny_model: Path) -> None:
    with ServerThread(tiny_model, home=home) as srv, concurrent.futures.ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(lambda _: chat(srv, B).status_code, range(8)))
        assert codes == [200] * 8
        assert ps(srv)["loads_total"] == {"tiny": 1, B: 1}


def test_a_model_too_large_for_the_budget_is_refused(home: Path, tiny_model: Path, model_mb: float,
                                                     pinned_mb: float) -> None:
    with ServerThread(tiny_model, home=home, memory_budget_mb=math.ceil(pinned_mb + model_mb * 0.5)) as srv:
        r = chat(srv, A)
        err = r.json()["error"]
        assert r.status_code == 507 and err["param"] == "model" and err["code"] == "model_too_large"
        assert "MB" in err["message"] and "budget" in err["message"] and A in err["message"]
        assert chat(srv, "tiny").status_code == 200


def test_a_slow_load_gets_503_with_retry_after(home: Path, tiny_model: Path) -> None:
    with ServerThread(tiny_model, home=home, load_wait=0.001) as srv:
        r = chat(srv, A)
        assert r.status_code == 503 and r.headers["Retry-After"] == "5"
        assert r.json()["error"]["code"] == "model_loading"
        assert wait_until(lambda: A in loaded(srv))
        assert chat(srv, A).status_code == 200
        assert ps(srv)["loads_total"][A] == 1


def test_ps_load_unload_through_the_cli(home: Path, tiny_model: Path) -> None:
    with ServerThread(tiny_model, home=home, api_key="sekret") as srv:
        env = {**os.environ, "ORTSERVE_HOME": str(home)}

        def cli(*args: str, key: str = "sekret") -> subprocess.CompletedProcess[str]:
            return subprocess.run([sys.executable, "-m", "ortserve.cli.main", *args, "--url", srv.url,
                                   "--api-key", key], capture_output=True, text=True, env=env, timeout=120,
                                  check=False)

        r = cli("load", "tiny-a")
        assert r.returncode == 0 and f"loaded {A}" in r.stdout, r.stderr
        r = cli("ps")
        assert r.returncode == 0 and A in r.stdout and "tiny (pinned)" in r.stdout and "MB budget" in r.stdout
        r = cli("unload", A)
        assert r.returncode == 0 and f"unloaded {A}" in r.stdout
        assert A not in cli("ps").stdout
        r = cli("unload", "tiny")
        assert r.returncode == 1 and "pinned" in r.stderr
        r = cli("ps", key="wrong")
        assert r.returncode == 1 and "401" in r.stderr


def test_a_routing_rule_can_target_any_store_model(home: Path, tiny_model: Path, tmp_path: Path) -> None:
    config = tmp_path / "route.toml"
    config.write_text('defaultProvider = "local"\n[providers.local]\ntype = "local"\n'
                      '[[routing.rules]]\ncondition = { agentType = "coder" }\n'
                      f'action = {{ provider = "local", model = "{B}" }}\nreason = "coders get tiny-b"\n',
                      encoding="utf-8")
    with ServerThread(tiny_model, home=home, router_config=config) as srv:
        body = {"model": "auto", "messages": MSG, "max_tokens": 4, "metadata": {"agent_type": "coder"}}
        r = httpx.post(f"{srv.url}/v1/chat/completions", json=body, timeout=60)
        assert r.status_code == 200 and r.headers["x-ortserve-model"] == B and r.json()["model"] == B
        assert B in loaded(srv)
        plain = httpx.post(f"{srv.url}/v1/chat/completions", json={**body, "metadata": {}}, timeout=60)
        assert plain.status_code == 200 and plain.headers["x-ortserve-model"] == "tiny"


def test_embedding_models_share_the_manager(tiny_model: Path, embedding_model: Path, tmp_path: Path) -> None:
    # the manager's clock is moved by hand: the model stays loaded between the checks however
    # slow the machine, and expires when the test says its keep_alive has passed
    clock = ManualClock()
    with ServerThread(tiny_model, rag_dir=tmp_path / "rag", keep_alive=30, manager_clock=clock) as srv:
        def embed() -> httpx.Response:
            return httpx.post(f"{srv.url}/v1/embeddings", json={"input": "hello"}, timeout=60)

        assert embed().status_code == 200
        rows = {m["model"]: m for m in ps(srv)["models"]}
        emb = next(m for m in rows.values() if m["kind"] == "embedding")
        assert emb["memory_bytes"] > 0 and emb["requests"] == 1
        assert ps(srv)["used_bytes"] == sum(m["memory_bytes"] for m in rows.values())
        r = httpx.post(f"{srv.url}/v1/admin/unload", json={"model": emb["model"]}, timeout=30)
        assert r.status_code == 200 and emb["model"] not in loaded(srv)
        assert embed().status_code == 200 and ps(srv)["loads_total"][emb["model"]] == 2  # reloaded on use
        clock.advance(30)
        assert wait_until(lambda: emb["model"] not in loaded(srv))  # keep_alive 30 s, as the clock reads
        assert ps(srv)["loads_total"][emb["model"]] == 2
        r = httpx.post(f"{srv.url}/v1/admin/load", json={"model": emb["model"]}, timeout=60)
        assert r.status_code == 200 and r.json()["model"]["kind"] == "embedding"
