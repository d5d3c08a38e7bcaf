r"""Schemathesis over the server's whole OpenAPI document (every route), against a real
`ortserve serve` on 127.0.0.1 with the default model (issue 45: >= 20,000 cases, 0 answered 500,
no request left unanswered past its timeout).

    nice -n 10 .venv/bin/python benchmarks/schemathesis_run.py --max-examples 250 --out docs/schemathesis_s45.json

The server runs in a throw-away ``ORTSERVE_HOME`` (the embedding models copied in, so a generated
vector-store or embeddings request never imports one) with generation capped at 8 tokens
(``--max-tokens-cap 8 --default-max-tokens 4``): the fuzzer tests what the API accepts and
refuses, not how fast the model writes. Schemathesis runs every phase (examples, coverage,
fuzzing, stateful) with ``--checks not_a_server_error``, a fixed seed and a per-request timeout
(a request unanswered in time is an error, i.e. a hang). Printed JSON: the cases schemathesis
generated, the server's requests by status over the run (its own ``/metrics``), every failure
(a 5xx, with the request that caused it as schemathesis reports it) and every error (a timeout,
a dropped connection), the command and the duration.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from _common import emit, machine, model_dir

from ortserve.loopback import wait_healthy


def requests_by_status(url: str, headers: dict[str, str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in httpx.get(f"{url}/metrics", headers=headers, timeout=60).text.splitlines():
        if line.startswith("ortserve_requests_total{"):
            status = line.split('status="', 1)[1].split('"', 1)[0]
            out[status] = out.get(status, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--max-examples", type=int, default=250, help="per operation and phase")
    ap.add_argument("--phases", default="examples,coverage,fuzzing,stateful")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--seed", type=int, default=45)
    ap.add_argument("--request-timeout", type=float, default=120)
    ap.add_argument("--port", type=int, default=8795)
    ap.add_argument("--key-scope", choices=("none", "user", "admin"), default="none",
                    help="serve with a key file (ORTSERVE_API_KEYS_FILE) holding one key of this scope, and "
                         "send it: the tenant paths (owners, 403 on admin routes for a user key) fuzzed too")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--keep-report", type=Path, default=None, help="copy schemathesis' own reports here")
    args = ap.parse_args()
    path, model_id = model_dir(args.model)
    work = Path(tempfile.mkdtemp(prefix="st-run-"))
    home = work / "home"
    for variant in path.parent.glob("all-minilm-l6-v2--*"):
        shutil.copytree(variant, home / "models" / variant.name)
    env = {**os.environ, "ORTSERVE_HOME": str(home), "ORTSERVE_LOG_LEVEL": "warning"}
    env.pop("ORTSERVE_API_KEY", None)
    env.pop("ORTSERVE_API_KEYS_FILE", None)
    headers: list[str] = []
    if args.key_scope != "none":
        (work / "keys").write_text(f"fuzz osk-fuzz-key-45 {args.key_scope}\n", encoding="utf-8")
        env["ORTSERVE_API_KEYS_FILE"] = str(work / "keys")
        headers = ["-H", "Authorization: Bearer osk-fuzz-key-45"]
    server = subprocess.Popen([sys.executable, "-m", "ortserve.cli.main", "serve", "--model", str(path),
                               "--port", str(args.port), "--max-tokens-cap", "8", "--default-max-tokens", "4"],
                              env=env)
    url = f"http://127.0.0.1:{args.port}"
    st = shutil.which("st", path=str(Path(sys.executable).parent)) or "st"
    cmd = [st, "run", f"{url}/openapi.json", "--checks", "not_a_server_error", "--phases", args.phases,
           "--max-examples", str(args.max_examples), "--seed", str(args.seed), "--workers", str(args.workers),
           "--request-timeout", str(args.request_timeout), "--generation-database", "none", "--no-color",
           "--continue-on-failure", "--report", "json,ndjson", "--report-dir", str(work / "report"), *headers]
    try:
        if not wait_healthy(url, 300, poll=0.5):
            raise SystemExit("the server did not become healthy")
        auth = {"Authorization": "Bearer osk-fuzz-key-45"} if headers else {}
        httpx.post(f"{url}/v1/embeddings", json={"input": "warm"}, headers=auth, timeout=300).raise_for_status()
        before = requests_by_status(url, auth)
        at_start = machine()
        t0 = time.monotonic()
        r = subprocess.run(cmd, cwd=work, capture_output=True, encoding="utf-8", errors="replace", check=False)
        seconds = time.monotonic() - t0
        after = requests_by_status(url, auth)
        alive = server.poll() is None
    finally:
        server.terminate()
        server.wait(60)
    report = json.loads(next((work / "report").glob("json-*.json")).read_text(encoding="utf-8"))
    if args.keep_report:
        shutil.copytree(work / "report", args.keep_report, dirs_exist_ok=True)
    by_status = {s: int(after[s] - before.get(s, 0)) for s in sorted(after) if after[s] > before.get(s, 0)}
    result: dict[str, Any] = {
        "benchmark": "schemathesis", "model": model_id, "machine": at_start,
        "command": " ".join(cmd[1:]).replace(str(work), "WORK"),
        "schemathesis": report.get("schemathesis_version"), "seed": args.seed, "key_scope": args.key_scope,
        "operations": report["operations"], "phases": {k: v["status"] for k, v in report["phases"].items()},
        "cases": report["test_cases"]["generated"], "test_cases": report["test_cases"],
        "requests_by_status": by_status, "requests": sum(by_status.values()),
        "status_500": by_status.get("500", 0), "status_5xx": sum(v for s, v in by_status.items() if s.startswith("5")),
        "failures": report["failures"], "errors": report["errors"],
        "server_alive_at_end": alive, "exit_code": r.returncode, "seconds": round(seconds),
        "loadavg_at_end": os.getloadavg(),
        "validation_mismatch": report.get("warnings", {}).get("validation_mismatch", []),
    }
    if r.returncode != 0:
        result["stdout_tail"] = r.stdout[-6000:]
    shutil.rmtree(work, ignore_errors=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    emit(result)
    sys.exit(0 if result["status_5xx"] == 0 and not result["failures"] and not result["errors"] else 1)


if __name__ == "__main__":
    main()
