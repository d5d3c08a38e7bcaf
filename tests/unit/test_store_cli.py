"""`ortserve models` without a model: errors, JSON, verify exit codes, offline pull."""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from ortserve.cli.models import models_group
from ortserve.errors import OfflineError
from ortserve.models.catalog import lookup, require_hub
from ortserve.models.store import ModelStore


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ORTSERVE_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def install_fake(home: Path, model: str = "m", variant: str = "int8-cpu", delta: float = 0.2) -> None:
    def build(tmp: Path) -> dict[str, Any]:
        (tmp / "model.onnx").write_bytes(b"0123456789" * 10)
        return {"precision": variant.split("-", maxsplit=1)[0], "device": "cpu",
                "quality": {"perplexity": 10.0 * (1 + delta / 100), "reference_perplexity": 10.0,
                            "delta_pct": delta},
                "speed": {"decode_tps": 50.0, "device": "cpu"}}

    ModelStore(home / "models").install(model, variant, build)


def run(*args: str) -> Any:
    return CliRunner().invoke(models_group, list(args))


def test_list_and_show_json(home: Path) -> None:
    assert json.loads(run("list", "--json").output) == []
    install_fake(home)
    rows = json.loads(run("list", "--json").output)
    assert [r["id"] for r in rows] == ["m:int8-cpu"] and rows[0]["quality"]["delta_pct"] == 0.2
    shown = json.loads(run("show", "m", "--json").output)
    assert shown["selection"]["cpu"]["id"] == "m:int8-cpu"
    assert "within 1%" in shown["selection"]["cpu"]["reason"]
    text = run("show", "m").output
    assert "on cpu: m:int8-cpu" in text and "perplexity    10.02 (+0.20%)" in text


def test_catalog_listing(home: Path) -> None:
    rows = json.loads(run("list", "--available", "--json").output)
    ids = {r["id"] for r in rows}
    assert {"smollm2-135m", "phi-3-mini-4k-instruct", "phi-2", "qwen2-0.5b-instruct",
            "tinyllama-1.1b-chat"} <= ids
    assert all(r["size_mb"] > 0 and r["ram_gb"] > 0 for r in rows)
    assert lookup("Qwen/Qwen2-0.5B-Instruct").id == "qwen2-0.5b-instruct"


def test_errors_are_one_line_with_exit_codes(home: Path, tmp_path: Path) -> None:
    for args, code, needle in [
        (("show", "nope"), 2, "error: model 'nope' is not installed ("),
        (("rm", "nope"), 2, "error: model 'nope' is not installed"),
        (("import", str(tmp_path / "missing")), 1, "does not exist (check the path)"),
        (("import", str(tmp_path), "--id", "../escape"), 2, "invalid model id '../escape'"),
        (("pull", "no-such-model"), 2, "is not in the catalog"),
        (("convert", "nope", "--precision", "int4"), 2, "is not installed"),
    ]:
        r = run(*args)
        assert r.exit_code == code, (args, r.output)
        lines = r.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], (args, r.output)
        assert "Traceback" not in r.output


def test_verify_flags_a_flipped_byte(home: Path) -> None:
    install_fake(home)
    ok = run("verify", "m", "--json")
    assert ok.exit_code == 0 and json.loads(ok.output)["m:int8-cpu"]["ok"] is True
    f = home / "models" / "m--int8-cpu" / "model.onnx"
    data = bytearray(f.read_bytes())
    data[5] ^= 0xFF
    f.write_bytes(bytes(data))
    bad = run("verify", "m")
    assert bad.exit_code == 1
    assert "m:int8-cpu: FAILED corrupt=['model.onnx']" in bad.output


def test_convert_warns_loudly_beyond_five_percent(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ortserve.models import importer

    install_fake(home, variant="int8-cpu")

    def fake_convert(store: ModelStore, model: str, **kw: Any) -> Any:
        install_fake(home, variant="int4-cpu", delta=12.5)
        return store.get("m:int4-cpu")

    monkeypatch.setattr(importer, "convert_model", fake_convert)
    r = run("convert", "m", "--precision", "int4")
    assert r.exit_code == 0
    assert "WARNING: m:int4-cpu perplexity is +12.5% vs fp32" in r.output
    assert run("convert", "m").exit_code == 2  # --precision is required


def test_hub_offline_flag_fails_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(OfflineError, match="offline"):
        require_hub("Qwen/Qwen2-0.5B-Instruct")


def test_unreachable_hub_fails_fast(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    for var in ("https_proxy", "HTTPS_PROXY"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(OfflineError, match="unreachable"):  # refused: one probe, no retry
        require_hub("microsoft/phi-2", timeout=2.0)


def test_a_hub_probe_that_hangs_is_given_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """"Fails fast" as a decision, not a duration: a probe that never answers (a stuck resolver,
    a silent firewall) is abandoned after its timeout while it still hangs."""
    from ortserve.models import catalog

    hanging, release = threading.Event(), threading.Event()

    def never_answers(address: object, timeout: float) -> None:
        hanging.set()
        release.wait(120)
        raise OSError("released")

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(catalog.socket, "create_connection", never_answers)
    try:
        with pytest.raises(OfflineError, match="unreachable"):
            require_hub("microsoft/phi-2", timeout=0.05)
        assert hanging.is_set() and not release.is_set()  # given up while the probe still hung
    finally:
        release.set()


def test_pull_offline_in_a_subprocess(tmp_path: Path) -> None:
    """The real machine state: no HF_HUB_OFFLINE, default endpoint; must fail fast, exit != 0."""
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_ENDPOINT")}
    env["ORTSERVE_HOME"] = str(tmp_path / "home")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cases = [{"HF_HUB_OFFLINE": "1"}, {"HF_ENDPOINT": f"http://127.0.0.1:{port}"}]
    for extra in cases:  # "fast" is the probe's decision (the test above); 300 s only guards a hang
        p = subprocess.run([sys.executable, "-m", "ortserve.cli.models", "pull", "qwen2-0.5b-instruct"],
                           check=False, env={**env, **extra}, capture_output=True, text=True, timeout=300,
                           encoding="utf-8", errors="replace")
        assert p.returncode != 0, p.stderr
        assert p.stderr.startswith("error: cannot download Qwen/Qwen2-0.5B-Instruct: this machine is offline")
        assert len(p.stderr.strip().splitlines()) == 1
    assert not list((tmp_path / "home").glob("models/*--*"))


class _Tty(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


@pytest.mark.parametrize("tty", [True, False])
def test_progress_only_on_a_terminal(tty: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    from ortserve.cli.models import Progress

    monkeypatch.setenv("TQDM_DISABLE", "0")
    monkeypatch.delenv("TQDM_DISABLE")  # recorded, so teardown restores the real state
    err = _Tty(tty)
    monkeypatch.setattr(sys, "stderr", err)
    with Progress("importing x") as progress:
        progress("building int8 for cpu")
    if tty:
        assert "importing x" in err.getvalue() and "building int8 for cpu" in err.getvalue()
    else:
        assert err.getvalue() == ""
        assert os.environ.get("TQDM_DISABLE") == "1"  # silences transformers' and the builder's bars too


def test_pull_the_default_reuses_an_installed_variant(home: Path) -> None:
    install_fake(home, model="smollm2-135m", variant="int8-cpu")
    r = run("pull", "smollm2", "--json")  # by alias; no conversion, no network
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["id"] == "smollm2-135m:int8-cpu"


def test_requantize_and_precision_must_agree(home: Path, tmp_path: Path) -> None:
    r = run("import", str(tmp_path), "--requantize", "int4", "--precision", "int8")
    assert r.exit_code == 2 and "disagree" in r.output
