"""Schemathesis against the app's own OpenAPI schema: no generated request gets a 5xx.

CI runs a small count (the fuzzing phase, 5 examples per operation: ~100 requests); docs/deploy.md has the full run
(>= 5,000 requests) and its command."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from servers import ServerThread


def requests_by_status(url: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines():
        if line.startswith("ortserve_requests_total{"):
            status = line.split('status="', 1)[1].split('"', 1)[0]
            out[status] = out.get(status, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


@pytest.fixture(scope="module")
def srv(tiny_model: Path, embedding_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    home = tmp_path_factory.mktemp("fuzz-home")  # uploads, vector stores: never the shared store
    # The embedding model the session already imported, copied in: an empty store would import it
    # (a torch export in a subprocess) on the first generated vector-store request, which on a
    # loaded machine outlasts the fuzzer's 60 s request timeout. It is loaded before fuzzing too.
    for variant in embedding_model.parent.glob(embedding_model.name.split("--")[0] + "--*"):
        shutil.copytree(variant, home / "models" / variant.name)
    with ServerThread(tiny_model, home=home, max_tokens_cap=8, default_max_tokens=4) as s:
        s.state.embedder.get(None)
        yield s


def test_generated_requests_never_get_a_5xx(srv: ServerThread, tmp_path: Path) -> None:
    st = shutil.which("st", path=str(Path(sys.executable).parent)) or shutil.which("st")
    if st is None:
        pytest.fail("schemathesis is a dev dependency: pip install -e '.[dev]'")
    before = requests_by_status(srv.url)
    r = subprocess.run([st, "run", f"{srv.url}/openapi.json", "--checks", "not_a_server_error",
                        "--phases", "examples,fuzzing", "--max-examples", "5", "--request-timeout", "60",
                        "--seed", "1",
                        # known: a generated /v1/embeddings request can go unanswered for > 60 s on a
                        # loaded machine (issue 16 follows it up); everything else must answer
                        "--exclude-path", "/v1/embeddings",
                        "--report", "junit", "--report-junit-path", str(tmp_path / "junit.xml")],
                       capture_output=True, encoding="utf-8", errors="replace", timeout=600, check=False,
                       cwd=tmp_path)  # its .hypothesis/ and .schemathesis/ caches stay out of the checkout
    after = requests_by_status(srv.url)
    sent = sum(after.values()) - sum(before.values())
    server_errors = {s: after[s] - before.get(s, 0) for s in after if s.startswith("5")
                     and after[s] > before.get(s, 0)}
    assert sent >= 50, r.stdout[-2000:]
    assert server_errors == {}, r.stdout[-4000:]
    assert r.returncode == 0, r.stdout[-4000:]
