"""The kill campaign (issue 45): SIGKILL a real `ortserve serve` (or `ortserve models import-adapter`,
or `serve --model FILE.gguf` while it imports) at seeded random crash points, restart, check
(tests/crash_harness.py), and print JSON: kills, where, inconsistencies (the target is 0).

    .venv/bin/python benchmarks/kill_campaign.py --kills 50 --seed 45

Each round: a server starts armed for the next kill (``ORTSERVE_CRASH_AT=<point>:<n>``), which makes it
also the restart after the previous one, so it is checked first (it may die there, resuming an
ingestion at its armed point: that kill counts too); then the round's workload runs until the
server dies at the point. Import rounds kill the import process instead. One ORTSERVE_HOME
carries all rounds, so state accumulates as on a real machine. Material (a tiny random Llama,
a tiny GGUF, a PEFT adapter, the embedding model) is built once under --work.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "integration")]

from tests import crash_harness as h

WEIGHTS = {"upload": 3, "ingest": 4, "responses": 2, "ledger": 2, "gguf": 0, "lora": 2}   # a GGUF import: minutes


def material(work: Path) -> h.Material:
    """Built once under ``work`` and reused by later runs."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    done = work / "material.json"
    if done.is_file():
        m = json.loads(done.read_text(encoding="utf-8"))
        return h.Material(Path(m["model_dir"]), Path(m["gguf"]), Path(m["adapter"]),
                          [Path(p) for p in m["embedding_variants"]])
    from test_gguf_exact import uniform, write_tiny_gguf
    from tests.integration.lora_material import make_peft
    from transformers import AutoTokenizer

    from ortserve.models.catalog import embedded_gguf
    from ortserve.models.convert import build_onnx, make_tiny_llama
    from ortserve.models.embed_import import ensure_default_embedding
    from ortserve.models.store import ModelStore

    work.mkdir(parents=True, exist_ok=True)
    g = embedded_gguf()
    AutoTokenizer.from_pretrained(str(g.parent), gguf_file=g.name).save_pretrained(str(work / "tok"))
    hf = make_tiny_llama(work / "hf", work / "tok")
    onnx = build_onnx(hf, work / "onnx", precision="fp32")
    gguf = write_tiny_gguf(work / "Tiny-Chat.Q4_0.gguf", uniform("Q4_0"))
    adapter = make_peft(hf, work / "my-adapter", seed=1, r=4)
    v = ensure_default_embedding(ModelStore(work / "embed-home" / "models"), subprocess_import=False)
    variants = sorted(v.path.parent.glob(v.model + "--*"))
    m = h.Material(onnx, gguf, adapter, variants)
    done.write_text(json.dumps({"model_dir": str(onnx), "gguf": str(gguf), "adapter": str(adapter),
                                "embedding_variants": [str(p) for p in variants]}))
    return m


def plan(rng: random.Random, kills: int) -> list[tuple[str, str]]:
    """(scenario, crash spec) per round; every point of every scenario appears."""
    points = {**h.SERVER_POINTS, **h.IMPORT_POINTS}
    rounds = [(s, f"{p}:1") for s, ps in points.items() for p in ps]
    rng.shuffle(rounds)          # every point once first, in a seeded order; then random ones
    names = list(WEIGHTS)
    while len(rounds) < kills:
        s = rng.choices(names, [WEIGHTS[n] for n in names])[0]
        n = rng.randint(1, 2) if s in h.SERVER_POINTS else 1
        rounds.append((s, f"{rng.choice(points[s])}:{n}"))
    return rounds


def campaign(m: h.Material, home: Path, logs: Path, kills: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    h.prepare_home(home, m)
    ex, issues, where, rounds = h.Expect(), [], {}, 0
    started, t0 = 0, time.monotonic()

    def died(line: str | None, during: str) -> None:
        where[line or "?"] = where.get(line or "?", 0) + 1
        if line is None:
            issues.append(f"round {rounds}: the process died without reaching a crash point ({during})")

    for scenario, spec in plan(rng, 2 * kills):    # rounds that kill nothing (a swap with nothing to replace) do not count
        if sum(where.values()) >= kills:
            break
        rounds += 1
        log = logs / f"{rounds:03d}-{scenario}.log"
        armed = spec if scenario in h.SERVER_POINTS else None
        srv = h.Server(home, m.model_dir, log, armed)
        started += 1
        try:
            if not srv.wait_ready():
                died(srv.crash_line(), "at start")
                continue
            found = h.check(home, srv, ex)          # the restart after the previous kill
            issues += [f"round {rounds} ({spec}): {i}" for i in found]
            if scenario in h.SERVER_POINTS:
                try:
                    h.WORKLOADS[scenario](srv, ex)
                    issues.append(f"round {rounds}: {spec} was never reached")
                except h.ServerDied:
                    pass
                srv.proc.wait(60)
                died(srv.crash_line(), scenario)
            else:
                srv.kill()                            # idle: a kill that must cost nothing either
                ilog = logs / f"{rounds:03d}-{scenario}-import.log"
                if scenario == "lora":
                    rc = h.import_adapter(home, m, ilog, spec).returncode
                else:
                    rc = h.import_gguf(home, m, ilog, spec, f"Tiny-Chat-r{rounds}.Q4_0.gguf")
                if rc == 0:
                    continue                          # e.g. store.swap with nothing to replace: not a kill
                died(h.crash_line(ilog), scenario)
        except h.ServerDied:
            died(srv.crash_line(), "during the check (resuming work at its armed point)")
        finally:
            srv.kill()
    srv = h.Server(home, m.model_dir, logs / "final.log")
    started += 1
    try:
        assert srv.wait_ready(), (logs / "final.log").read_text(encoding="utf-8")
        issues += [f"final: {i}" for i in h.check(home, srv, ex)]
        stores = srv.call("GET", "/v1/vector_stores", params={"limit": 100}).json()["data"]
        counts = {k: sum(s["file_counts"][k] for s in stores) for k in ("completed", "failed", "in_progress")}
    finally:
        srv.kill()
    return {"seed": seed, "kills": sum(where.values()), "rounds": rounds, "servers_started": started,
            "inconsistencies": len(issues), "issues": issues[:50], "kills_by_point": dict(sorted(where.items())),
            "acknowledged": {"files": len(ex.files), "vector_store_files": len(ex.vs_files),
                             "responses": len(ex.responses), "routed_chats": ex.routed},
            "vector_store_files_at_end": counts, "seconds": round(time.monotonic() - t0, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kills", type=int, default=50)
    ap.add_argument("--seed", type=int, default=45)
    ap.add_argument("--work", type=Path, default=Path("/tmp/ortserve-kill-campaign"))
    a = ap.parse_args()
    m = material(a.work / "material")
    run = a.work / f"run-{a.seed}"
    shutil.rmtree(run, ignore_errors=True)
    (run / "logs").mkdir(parents=True)
    print(json.dumps(campaign(m, run / "home", run / "logs", a.kills, a.seed), indent=2))


if __name__ == "__main__":
    main()
