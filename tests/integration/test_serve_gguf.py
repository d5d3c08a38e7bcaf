"""`ortserve serve --model FILE.gguf`, as `llama-server -m FILE.gguf` (issue 31): the file is
imported into the store once (exactly), then served; a changed file or a taken id is an error
that says what to do."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("gguf")
sys.path.insert(0, str(Path(__file__).parent))

from test_gguf_exact import uniform, write_tiny_gguf

from ortserve.config import load_settings
from ortserve.errors import StoreError
from ortserve.loopback import free_port, wait_healthy
from ortserve.models.locate import resolve_model_dir
from ortserve.models.store import ModelStore


def test_serve_a_gguf_file_imports_it_once_then_serves_it(tmp_path: Path) -> None:
    from openai import OpenAI

    gguf_file = write_tiny_gguf(tmp_path / "Tiny-Chat.Q4_0.gguf", uniform("Q4_0"))
    home = tmp_path / "home"
    port = free_port()
    log = (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen([str(Path(sys.executable).with_name("ortserve")), "serve", "--model", str(gguf_file),
                             "--port", str(port)], env={**os.environ, "ORTSERVE_HOME": str(home)},
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        assert wait_healthy(url, 300, proc), (tmp_path / "serve.log").read_text()
        client = OpenAI(base_url=f"{url}/v1", api_key="x")
        assert "tiny-chat.q4_0:q4_0-cpu" in [m.id for m in client.models.list().data]
        r = client.chat.completions.create(model="tiny-chat.q4_0", max_tokens=6,
                                           messages=[{"role": "user", "content": "Hello"}])
        assert r.model == "tiny-chat.q4_0:q4_0-cpu" and r.usage.completion_tokens >= 1  # names its variant
        assert r.choices[0].finish_reason in ("stop", "length")
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()
    said = (tmp_path / "serve.log").read_text()
    assert "importing Tiny-Chat.Q4_0.gguf as tiny-chat.q4_0 (once" in said, said

    store = ModelStore(home / "models")
    (v,) = store.find("tiny-chat.q4_0")
    assert v.variant == "q4_0-cpu" and v.source == f"gguf:{gguf_file.resolve()}" and v.notes["gguf_exact"]
    settings = load_settings(home=home)
    said_again: list[str] = []
    path, mid = resolve_model_dir(str(gguf_file), settings, said_again.append)   # served again: no import
    assert (path, mid) == (v.path, "tiny-chat.q4_0:q4_0-cpu") and not said_again
    assert store.find("tiny-chat.q4_0")[0].created == v.created

    os.utime(gguf_file, (v.created + 60, v.created + 60))    # the file changed after its import
    with pytest.raises(StoreError, match="changed after it was imported") as err:
        resolve_model_dir(str(gguf_file), settings)
    assert "ortserve models rm tiny-chat.q4_0" in err.value.hint
    other = tmp_path / "elsewhere" / gguf_file.name      # another file under the same name
    other.parent.mkdir()
    other.write_bytes(gguf_file.read_bytes())
    with pytest.raises(StoreError, match="already installed from gguf:") as err:
        resolve_model_dir(str(other), settings)
    assert "--id NAME" in err.value.hint
