"""The CLI in a subprocess on the tiny model: ask, info, config, chat (pty), devices, clear errors."""

from __future__ import annotations

import json
import os
import pty
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

CLI = [sys.executable, "-m", "ortserve.cli.main"]


def run(args: list[str], tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    e = {**os.environ, "ORTSERVE_HOME": str(tmp_path / "home"), **env}
    return subprocess.run(CLI + args, capture_output=True, text=True, env=e, timeout=300, cwd=tmp_path, check=False, encoding="utf-8", errors="replace")


def test_ask_text_and_json(tiny_model: Path, tmp_path: Path) -> None:
    r = run(["ask", "What is ONNX?", "Name a colour.", "--model", str(tiny_model), "--max-tokens", "12",
             "--temperature", "0"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert "RESULTS" in r.stdout and "Question 1: What is ONNX?" in r.stdout and "Question 2: Name a colour." in r.stdout
    assert r.stdout.count("Tokens: ") == 2
    r = run(["ask", "What is ONNX?", "Name a colour.", "--model", str(tiny_model), "--max-tokens", "12",
             "--temperature", "0", "--json"], tmp_path)
    data = json.loads(r.stdout)
    assert [x["question"] for x in data["results"]] == ["What is ONNX?", "Name a colour."]
    assert all(0 < x["tokens"] <= 12 and x["answer"] for x in data["results"])
    assert all(x["metrics"]["ttft"] > 0 for x in data["results"])


def test_info_json_and_config(tmp_path: Path) -> None:
    r = run(["info", "--json"], tmp_path)
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    for key in ("os", "cpu", "ram_gb", "gpus", "onnxruntime", "onnxruntime_genai", "providers", "store",
                "selected_device", "auto_variant", "install", "gpu_memory"):
        assert key in info
    assert info["cpu"]["logical_cores"] >= 1 and isinstance(info["cpu"]["simd"], list)
    assert info["selected_device"]["device"] == "cpu"  # auto picks CPU on this machine
    assert "CPUExecutionProvider" in info["providers"]
    assert info["install"]["ok"] and info["install"]["runtimes"] == ["onnxruntime"], info["install"]
    r = run(["config"], tmp_path, ORTSERVE_MAX_QUEUE="17")
    assert r.returncode == 0 and "max_queue" in r.stdout and "17" in r.stdout and "GENAI_MODEL_DIR" in r.stdout
    data = json.loads(run(["config", "--json"], tmp_path, PORT="8123").stdout)
    assert {s["name"]: s["value"] for s in data["settings"]}["port"] == 8123


def test_unavailable_device_names_the_package(tiny_model: Path, tmp_path: Path) -> None:
    for device, package in (("cuda", "'ortserve[cuda]'"), ("dml", "'ortserve[directml]'")):
        r = run(["ask", "hi", "--model", str(tiny_model), "--device", device], tmp_path)
        assert r.returncode == 1 and package in r.stderr and "Traceback" not in r.stderr
        assert r.stderr.count("\n") == 1


@pytest.mark.parametrize("breakage,expected", [
    ("missing", "does not exist"), ("no_config", "genai_config.json"), ("no_onnx", "model.onnx"),
    ("no_tokenizer", "tokenizer.json"), ("corrupt", "cannot load"),
])
def test_broken_model_dirs_fail_in_one_line(tiny_model: Path, tmp_path: Path, breakage: str, expected: str) -> None:
    d = tmp_path / "model"
    if breakage != "missing":
        shutil.copytree(tiny_model, d)
    if breakage == "no_config":
        (d / "genai_config.json").unlink()
    elif breakage == "no_onnx":
        (d / "model.onnx").unlink()
    elif breakage == "no_tokenizer":
        (d / "tokenizer.json").unlink()
    elif breakage == "corrupt":
        (d / "model.onnx").write_bytes(b"\x00garbage" * 100)
    r = run(["ask", "hi"], tmp_path, GENAI_MODEL_DIR=str(d))
    assert r.returncode == 1 and expected in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and r.stderr.count("\n") == 1


def test_genai_missing_gives_the_seed_message(tiny_model: Path, tmp_path: Path) -> None:
    code = ("import sys; sys.modules['onnxruntime_genai'] = None; from ortserve.cli.main import cli; "
            f"cli(['ask', 'hi', '--model', {str(tiny_model)!r}], prog_name='ortserve')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False,
                       env={**os.environ, "ORTSERVE_HOME": str(tmp_path)}, encoding="utf-8", errors="replace")
    assert r.returncode == 1 and "onnxruntime-genai not installed" in r.stderr and "pip install" in r.stderr


class Terminal:
    """The CLI on a real pseudo-terminal: type into it, read what it shows."""

    def __init__(self, args: list[str], home: Path) -> None:
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # child
            os.environ["ORTSERVE_HOME"] = str(home)
            # A terminal's shell gives its programs the default Ctrl-C; a suite started in the
            # background (`cmd &`, nohup) hands down SIGINT ignored, and Python keeps it ignored.
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.execv(sys.executable, CLI + args)
        self.out = b""

    def type(self, text: bytes) -> None:
        os.write(self.fd, text)

    def read_until(self, done, timeout: float = 120) -> bytes:
        deadline = time.monotonic() + timeout
        while not done(self.out) and time.monotonic() < deadline:
            if select.select([self.fd], [], [], 0.2)[0]:
                try:
                    self.out += os.read(self.fd, 4096)
                except OSError:
                    break
        return self.out

    def exit_status(self) -> int | None:
        _, status = os.waitpid(self.pid, 0)
        return os.WEXITSTATUS(status) if os.WIFEXITED(status) else None

    def close(self) -> None:
        """Kill the CLI if a failed test left it running (it would wait for input forever)."""
        try:
            if os.waitpid(self.pid, os.WNOHANG) == (0, 0):
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass
        os.close(self.fd)


@pytest.fixture
def terminal(tmp_path: Path) -> Iterator[Callable[[list[str]], Terminal]]:
    opened: list[Terminal] = []

    def _open(args: list[str]) -> Terminal:
        opened.append(Terminal(args, tmp_path))
        return opened[-1]

    yield _open
    for term in opened:
        term.close()


def test_chat_in_a_terminal(tiny_model: Path, terminal: Callable[[list[str]], Terminal]) -> None:
    term = terminal(["chat", "--model", str(tiny_model), "--max-tokens", "8", "--temperature", "0"])
    assert b">>> " in term.read_until(lambda o: b">>> " in o)
    start = len(term.out)
    term.type(b"Hello there\n")
    term.read_until(lambda o: o.count(b">>> ") >= 2)  # the answer streams, then the next prompt
    assert term.out.count(b">>> ") >= 2
    answer = term.out[start:].split(b"Hello there", 1)[-1].replace(b">>> ", b"")
    assert answer.strip()  # something was streamed back
    term.type(b"/reset\n")
    assert b"history cleared" in term.read_until(lambda o: b"history cleared" in o)
    term.type(b"/exit\n")
    assert term.exit_status() == 0


def test_ask_through_the_router(tiny_model: Path, tmp_path: Path) -> None:
    r = run(["ask", "Is this private?", "--model", str(tiny_model), "--provider", "local", "--max-tokens", "6",
             "--json"], tmp_path)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)["results"][0]
    assert res["provider"] == "local" and res["local"] is True and res["tokens"] <= 6
    r = run(["ask", "hi", "--model", str(tiny_model), "--provider", "anthropic"], tmp_path)
    assert r.returncode == 1 and "anthropic" in r.stderr and "Traceback" not in r.stderr


def test_chat_ctrl_c_stops_the_answer_not_the_session(tiny_model: Path,
                                                      terminal: Callable[[list[str]], Terminal]) -> None:
    term = terminal(["chat", "--model", str(tiny_model), "--max-tokens", "1900", "--temperature", "0"])
    term.read_until(lambda o: b">>> " in o)
    term.type(b"Tell me everything\n")
    start = len(term.out)
    term.read_until(lambda o: len(o) > start + 200)  # the answer is streaming
    term.type(b"\x03")                               # Ctrl-C
    out = term.read_until(lambda o: b"[stopped]" in o and o.rstrip().endswith(b">>>"))
    assert b"[stopped]" in out and out.rstrip().endswith(b">>>")  # the session goes on
    term.type(b"/exit\n")
    assert term.exit_status() == 0
