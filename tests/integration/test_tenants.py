"""Issue 45 part 3: several API keys, each its own tenant, through a real server and the real
openai client. Two user keys (alice, bob) and an admin key (ops) from a key file made with the
CLI, beside ORTSERVE_API_KEY (root: an admin that sees everything, as before key files)."""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest
from click.testing import CliRunner
from tests.servers import ServerThread

from ortserve.cli.main import cli

ROOT = "root-secret"
MISSING = {"files": "file-000000000000000000000000", "vector_stores": "vs_000000000000000000000000",
           "responses": "resp_000000000000000000000000"}


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    path = tmp_path_factory.mktemp("keys") / "keys.txt"
    out = {"file": str(path)}
    for name, scope in (("alice", "user"), ("bob", "user"), ("ops", "admin"), ("carol", "user")):
        r = CliRunner().invoke(cli, ["keys", "add", name, "--scope", scope, "--file", str(path)])
        assert r.exit_code == 0, r.output
        out[name] = r.stdout.strip()
    return out


@pytest.fixture(scope="module")
def srv(tiny_model: Path, embedding_model: Path, keys: dict[str, str], tmp_path_factory: pytest.TempPathFactory):
    with ServerThread(tiny_model, rag_dir=tmp_path_factory.mktemp("rag"), api_key=ROOT,
                      api_keys_file=keys["file"]) as s:
        yield s


def client(srv: ServerThread, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{srv.url}/v1", api_key=key, max_retries=0)


def call(srv: ServerThread, key: str, method: str, path: str, **kw: object) -> httpx.Response:
    return httpx.request(method, srv.url + path, headers={"Authorization": f"Bearer {key}"}, timeout=60, **kw)


def same_404(srv: ServerThread, key: str, method: str, path: str, oid: str, kind: str, **kw: object) -> None:
    """Another key's id answers exactly what an id that does not exist answers (the id aside)."""
    foreign = call(srv, key, method, path.format(id=oid), **kw)
    missing = call(srv, key, method, path.format(id=MISSING[kind]), **kw)
    assert foreign.status_code == missing.status_code == 404, (foreign.text, missing.text)
    assert foreign.text.replace(oid, "ID") == missing.text.replace(MISSING[kind], "ID")


def test_files_are_seen_only_by_their_key(srv: ServerThread, keys: dict[str, str]) -> None:
    f = client(srv, keys["alice"]).files.create(file=("notes.txt", b"alice's secret notes"), purpose="assistants")
    assert client(srv, keys["alice"]).files.retrieve(f.id).filename == "notes.txt"
    assert f.id in [x.id for x in client(srv, keys["alice"]).files.list()]
    for other in ("bob", "ops"):        # a user key and an admin key from the file: tenants both
        assert f.id not in [x.id for x in client(srv, keys[other]).files.list()]
        for method, path in (("GET", "/v1/files/{id}"), ("GET", "/v1/files/{id}/content"),
                             ("DELETE", "/v1/files/{id}")):
            same_404(srv, keys[other], method, path, f.id, "files")
    with pytest.raises(openai.NotFoundError):
        client(srv, keys["bob"]).files.content(f.id)
    # ORTSERVE_API_KEY sees every tenant's objects, as it did before key files
    assert f.id in [x.id for x in client(srv, ROOT).files.list()]
    assert client(srv, keys["alice"]).files.content(f.id).read() == b"alice's secret notes"   # still there
    assert client(srv, keys["alice"]).files.delete(f.id).deleted


def test_vector_stores_are_seen_only_by_their_key(srv: ServerThread, keys: dict[str, str]) -> None:
    alice, bob = client(srv, keys["alice"]), client(srv, keys["bob"])
    vs = alice.vector_stores.create(name="alice-docs")
    f = alice.files.create(file=("a.txt", b"The launch code is tangerine."), purpose="assistants")
    assert vs.id in [x.id for x in alice.vector_stores.list()]
    assert vs.id not in [x.id for x in bob.vector_stores.list()]
    for method, path, body in (("GET", "/v1/vector_stores/{id}", None), ("DELETE", "/v1/vector_stores/{id}", None),
                               ("GET", "/v1/vector_stores/{id}/files", None),
                               ("POST", "/v1/vector_stores/{id}/search", {"query": "launch code"}),
                               ("POST", "/v1/vector_stores/{id}/files", {"file_id": f.id})):
        same_404(srv, keys["bob"], method, path, vs.id, "vector_stores", json=body)
    # bob cannot put alice's file into his own store, nor search her store from a chat
    mine = bob.vector_stores.create(name="bob-docs")
    r = call(srv, keys["bob"], "POST", f"/v1/vector_stores/{mine.id}/files", json={"file_id": f.id})
    m = call(srv, keys["bob"], "POST", f"/v1/vector_stores/{mine.id}/files", json={"file_id": MISSING["files"]})
    assert r.status_code == m.status_code == 404
    assert r.text.replace(f.id, "ID") == m.text.replace(MISSING["files"], "ID")
    chat = {"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "the launch code?"}]}
    for vid in (vs.id, MISSING["vector_stores"]):
        r = call(srv, keys["bob"], "POST", "/v1/chat/completions",
                 json={**chat, "file_search": {"vector_store_ids": [vid]}})
        assert r.status_code == 404 and r.json()["error"]["param"] == "vector_store_id"
    assert alice.vector_stores.retrieve(vs.id).name == "alice-docs"
    assert alice.vector_stores.delete(vs.id).deleted


def test_stored_responses_are_seen_only_by_their_key(srv: ServerThread, keys: dict[str, str]) -> None:
    resp = client(srv, keys["alice"]).responses.create(model="tiny", input="Hi", max_output_tokens=16, store=True)
    assert client(srv, keys["alice"]).responses.retrieve(resp.id).id == resp.id
    for method, path in (("GET", "/v1/responses/{id}"), ("DELETE", "/v1/responses/{id}")):
        same_404(srv, keys["bob"], method, path, resp.id, "responses")
    body = {"model": "tiny", "input": "and then?", "max_output_tokens": 16}
    foreign = call(srv, keys["bob"], "POST", "/v1/responses", json={**body, "previous_response_id": resp.id})
    missing = call(srv, keys["bob"], "POST", "/v1/responses",
                   json={**body, "previous_response_id": MISSING["responses"]})
    assert foreign.status_code == missing.status_code == 404
    assert foreign.text.replace(resp.id, "ID") == missing.text.replace(MISSING["responses"], "ID")
    counted = call(srv, keys["bob"], "POST", "/v1/responses/input_tokens",
                   json={**body, "previous_response_id": resp.id})
    assert counted.status_code == 404 and counted.json()["error"]["param"] == "previous_response_id"
    # alice continues her own conversation; ORTSERVE_API_KEY reads any tenant's
    again = client(srv, keys["alice"]).responses.create(model="tiny", input="and then?", max_output_tokens=16,
                                                         previous_response_id=resp.id)
    assert again.previous_response_id == resp.id
    assert client(srv, ROOT).responses.retrieve(resp.id).id == resp.id
    client(srv, keys["alice"]).responses.delete(resp.id)
    with pytest.raises(openai.NotFoundError):
        client(srv, keys["alice"]).responses.retrieve(resp.id)


def test_chat_completions_are_never_stored_so_none_can_leak(srv: ServerThread, keys: dict[str, str]) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client(srv, keys["alice"]).chat.completions.create(
            model="tiny", max_tokens=2, store=True, messages=[{"role": "user", "content": "Hi"}])
    assert e.value.body["param"] == "store"
    assert call(srv, keys["bob"], "GET", "/v1/chat/completions").status_code in (404, 405)


def test_a_user_key_is_refused_on_admin_routes(srv: ServerThread, keys: dict[str, str]) -> None:
    for path, body in (("/v1/admin/load", {"model": "tiny"}), ("/v1/admin/unload", {"model": "tiny-x"})):
        r = call(srv, keys["bob"], "POST", path, json=body)
        assert r.status_code == 403, r.text
        err = r.json()["error"]
        assert err["type"] == "permission_error" and "admin" in err["message"] and "bob" in err["message"]
    pull = call(srv, keys["bob"], "POST", "/api/pull", json={"model": "tiny"})   # Ollama's shape there
    assert pull.status_code == 403 and "admin" in pull.json()["error"]
    assert call(srv, keys["ops"], "POST", "/v1/admin/load", json={"model": "tiny"}).status_code == 200
    assert call(srv, ROOT, "POST", "/v1/admin/load", json={"model": "tiny"}).status_code == 200
    # a user key infers and reads ps
    assert client(srv, keys["bob"]).chat.completions.create(
        model="tiny", max_tokens=2, messages=[{"role": "user", "content": "Hi"}]).choices
    assert call(srv, keys["bob"], "GET", "/v1/admin/ps").status_code == 200


def test_a_revoked_key_is_refused_without_a_restart(srv: ServerThread, keys: dict[str, str]) -> None:
    assert call(srv, keys["carol"], "GET", "/v1/models").status_code == 200
    listed = CliRunner().invoke(cli, ["keys", "list", "--file", keys["file"], "--json"])
    assert listed.exit_code == 0 and "carol" in listed.stdout and keys["carol"] not in listed.stdout
    r = CliRunner().invoke(cli, ["keys", "revoke", "carol", "--file", keys["file"]])
    assert r.exit_code == 0, r.output
    refused = call(srv, keys["carol"], "GET", "/v1/models")
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
    assert call(srv, keys["alice"], "GET", "/v1/models").status_code == 200   # the others still work
    assert call(srv, "not-a-key", "GET", "/v1/models").status_code == 401
    assert "carol" not in Path(keys["file"]).read_text(encoding="utf-8")
