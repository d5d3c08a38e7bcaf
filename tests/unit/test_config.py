"""Settings precedence: flags > env > .env > config file > defaults; seed variable names work."""

from __future__ import annotations

from pathlib import Path

import pytest

from ortserve.config import describe, load_settings


def test_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for var in ("PORT", "ORTSERVE_PORT", "HOST", "GENAI_DEVICE", "ORTSERVE_DEVICE", "GENAI_MAX_LENGTH",
                "ORTSERVE_MAX_QUEUE", "ORTSERVE_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    assert load_settings().port == 8002
    (tmp_path / "ortserve.toml").write_text('port = 9001\nmax_queue = 7\ndevice = "cpu"\n', encoding="utf-8")
    assert load_settings().port == 9001 and load_settings().max_queue == 7
    (tmp_path / ".env").write_text("PORT=9002\n", encoding="utf-8")
    assert load_settings().port == 9002
    monkeypatch.setenv("ORTSERVE_PORT", "9003")
    assert load_settings().port == 9003
    assert load_settings(port=9004).port == 9004
    assert load_settings().max_queue == 7  # untouched settings still come from the file


def test_seed_variables_and_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GENAI_MODEL_DIR", "/models/x")
    monkeypatch.setenv("GENAI_DEVICE", "directml")
    monkeypatch.setenv("GENAI_MAX_LENGTH", "1024")
    monkeypatch.setenv("HOME", "/somewhere/else")
    monkeypatch.delenv("ORTSERVE_HOME", raising=False)
    s = load_settings()
    assert s.model == "/models/x" and s.device == "dml" and s.max_length == 1024
    assert s.home == Path("/somewhere/else/.cache/ortserve")  # $HOME is not ORTSERVE_HOME


def test_bad_device_and_describe(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="unknown device"):
        load_settings(device="tpu")
    rows = {r["name"]: r for r in describe(load_settings(api_key="secret"))}
    assert rows["api_key"]["value"] == "***" and "ORTSERVE_API_KEY" in rows["api_key"]["env"]
    assert all(r["doc"] for r in rows.values())
