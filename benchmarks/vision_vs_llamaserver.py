"""Image time to first token and decode speed: ortserve against llama-server with the mmproj (issue 42).

    .venv/bin/python benchmarks/vision_vs_llamaserver.py [--size mid|tiny] [--reps 5] [--tokens 32]
        [--images 448 112] [--threads 2] [--source auto|hf|gguf] [--outtype f32|f16] [--llama-poll 0]
        [--work DIR] [--ports 8780 8781] [--out FILE]

One random-weight Qwen2.5-VL (no download; ``--size mid``: a vision tower of 8 blocks, hidden 640,
and a text model of 4 layers, hidden 1024, see ``SIZES``; the real Qwen2.5 tokenizer) is built as a
Hugging Face directory, converted by llama.cpp's own ``convert_hf_to_gguf.py`` into a text GGUF and
an mmproj (both f32, or ``--outtype f16``), and served twice on 127.0.0.1: by ``llama-server -m text.gguf --mmproj
mmproj.gguf`` (tests/llamacpp.py's build) and by ``ortserve serve`` on the same weights, imported from
the GGUF pair (``ortserve models import text.gguf --mmproj mmproj.gguf``) where this checkout's CLI
has ``--mmproj``, else from the Hugging Face directory (``--source``; the JSON says which).

Both get the same requests through the ``openai`` SDK (chat.completions, stream=True, temperature
0, the same prompt and ``--tokens`` tokens, EOS ignored: ``ignore_eos`` on llama-server,
``min_tokens`` on ortserve), the same threads (``-t/-tb`` and ``--intra-op-threads``). Per rep and
image size, alternating which server goes first:

* ``first``: an image neither server has seen (new bytes each rep): decode + encoder + prefill;
* ``repeat``: the same request again (both reuse the prompt's KV: no encoder run on either);
* ``repeat_new_text``: the same image behind another question, so the KV before the image differs:
  ortserve takes the image's features from its cache by the image's sha256, llama-server encodes again.

Time to first token is the first streamed content; decode tok/s is (tokens - 1) / (last - first).
Medians per server, per-pair ratios (ortserve / llama-server, time: < 1 is ortserve faster), the
load (``uptime``) beside each rep. Greedy on the same weights, the two texts should be equal: the
JSON says whether they are. Everything lives under ``--work`` (kept for the next run; delete it).
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "integration")]

SIZES: dict[str, dict[str, dict[str, Any]]] = {
    "mid": {"text_config": {"hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 4,
                            "num_attention_heads": 16, "num_key_value_heads": 2,
                            "rope_scaling": {"type": "mrope", "rope_type": "default", "mrope_section": [8, 12, 12]}},
            "vision_config": {"depth": 8, "hidden_size": 640, "intermediate_size": 1280, "num_heads": 10,
                              "out_hidden_size": 1024, "fullatt_block_indexes": [3, 7]}},
    # tests/integration/vision_material.py's, with a third vision block: llama.cpp's converter maps
    # the merger's tensors by block number and fails on a 2-block tower
    "tiny": {"text_config": {}, "vision_config": {"depth": 3, "fullatt_block_indexes": [2]}},
}
QUESTIONS = ["Describe the image.", "What colours are in this picture?"]
MODEL_ID = "vl-bench"


def config(size: str) -> dict[str, Any]:
    import vision_material as vm

    cfg = vm.tiny_config()
    for part, changes in SIZES[size].items():
        cfg[part].update(changes)
    return cfg


def build_hf(out: Path, size: str) -> None:
    """The random Qwen2.5-VL directory (run in a child: torch stays out of the client)."""
    import vision_material as vm
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    tmp = out.with_name(out.name + ".tmp")
    vm.save_random_model(tmp, Qwen2_5_VLForConditionalGeneration, Qwen2_5_VLConfig, config(size),
                         std=0.08 if size == "tiny" else 0.03)
    vm.qwen25_tokenizer(tmp)
    pre = {**vm.preprocessor_config(), "max_pixels": 1003520}   # a 448x448 image is not resized
    (tmp / "preprocessor_config.json").write_text(json.dumps(pre), encoding="utf-8")
    tmp.replace(out)


def run(cmd: list[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> float:
    t = time.perf_counter()
    done = subprocess.run(cmd, check=False, env={**os.environ, **(env or {})}, cwd=cwd, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return round(time.perf_counter() - t, 1)


def material(work: Path, size: str, source: str, outtype: str) -> dict[str, Any]:
    """The HF directory, the GGUF pair and ortserve's import, each made once under ``work``."""
    import llamacpp

    steps: dict[str, Any] = {}
    hf, text, mmproj, home = work / "hf", work / "text.gguf", work / "mmproj.gguf", work / "home"
    if not hf.is_dir():
        steps["build_hf_s"] = run([sys.executable, __file__, "--build-hf", str(hf), "--size", size])
    src = llamacpp.llama_cpp_src()
    conv = [sys.executable, str(src / "convert_hf_to_gguf.py"), str(hf), "--outtype", outtype]
    env = {"PYTHONPATH": str(src / "gguf-py")}
    if not text.is_file():
        steps["convert_text_s"] = run([*conv, "--outfile", str(text)], env, src)
    if not mmproj.is_file():
        steps["convert_mmproj_s"] = run([*conv, "--mmproj", "--outfile", str(mmproj)], env, src)
    cli = [sys.executable, "-m", "ortserve.cli.main"]
    if source == "auto":
        helptext = subprocess.run([*cli, "models", "import", "--help"], check=False, capture_output=True, text=True).stdout
        source = "gguf" if "--mmproj" in helptext else "hf"
    marker = home / f"imported-{source}"
    if not marker.is_file():
        shutil.rmtree(home, ignore_errors=True)
        what = [str(text), "--mmproj", str(mmproj)] if source == "gguf" else [str(hf)]
        steps["ortserve_import_s"] = run([*cli, "models", "import", *what, "--id", MODEL_ID],
                                         {"ORTSERVE_HOME": str(home)})
        marker.write_text(source, encoding="utf-8")
    return {"hf": str(hf), "text_gguf": str(text), "mmproj_gguf": str(mmproj), "ortserve_home": str(home),
            "ortserve_import_from": source, "steps": steps,
            "sizes_mb": {p.name: round(p.stat().st_size / 2**20, 1) for p in (text, mmproj)}}


def png(seed: int, side: int) -> bytes:
    """A smooth random picture (an 8x8 random grid scaled up): new bytes for every seed."""
    from PIL import Image

    grid = np.random.default_rng(seed).integers(0, 255, (8, 8, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(grid).resize((side, side), Image.BILINEAR).save(buf, "PNG")
    return buf.getvalue()


class Servers:
    """llama-server and ortserve serve, started once, stopped at the end."""

    def __init__(self, work: Path, mat: dict[str, Any], threads: int, ports: list[int], poll: int | None) -> None:
        import llamacpp

        binary = llamacpp.tool("llama-server")
        if binary is None:
            raise SystemExit("llama-server is not built (docs/bench.md 'llama.cpp tools')")
        self.logs = {name: (work / f"{name}.log").open("w") for name in ("llama", "ortserve")}
        lib = {"LD_LIBRARY_PATH": f"{binary.parent}:{os.environ.get('LD_LIBRARY_PATH', '')}"}
        self.procs = {
            "llama": subprocess.Popen(
                [str(binary), "-m", mat["text_gguf"], "--mmproj", mat["mmproj_gguf"], "-t", str(threads),
                 "-tb", str(threads), "-c", "4096", "-np", "1", "--host", "127.0.0.1", "--port", str(ports[0]),
                 *(["--poll", str(poll)] if poll is not None else [])],
                env={**os.environ, **lib}, stdout=self.logs["llama"], stderr=subprocess.STDOUT),
            "ortserve": subprocess.Popen(
                [sys.executable, "-m", "ortserve.cli.main", "serve", "--model", MODEL_ID, "--port", str(ports[1]),
                 "--intra-op-threads", str(threads)],
                env={**os.environ, "ORTSERVE_HOME": mat["ortserve_home"]},
                stdout=self.logs["ortserve"], stderr=subprocess.STDOUT)}
        self.urls = {"llama": f"http://127.0.0.1:{ports[0]}", "ortserve": f"http://127.0.0.1:{ports[1]}"}
        self.models = {"llama": "mmproj", "ortserve": MODEL_ID}
        self.extra = {"llama": lambda n: {"ignore_eos": True}, "ortserve": lambda n: {"min_tokens": n}}

    def wait(self, timeout: float = 600) -> None:
        import httpx

        for name, url in self.urls.items():
            end = time.monotonic() + timeout
            while True:
                if self.procs[name].poll() is not None:
                    raise SystemExit(f"{name} exited; see its log under --work")
                try:
                    if httpx.get(url + ("/health" if name == "llama" else "/healthz"), timeout=5).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > end:
                    raise SystemExit(f"{name} not healthy in {timeout} s")
                time.sleep(0.5)

    def stop(self) -> None:
        for p in self.procs.values():
            p.terminate()
        for p in self.procs.values():
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        for f in self.logs.values():
            f.close()


def ask(servers: Servers, name: str, image: bytes, question: str, tokens: int) -> dict[str, Any]:
    """One streamed chat with one image: time to first token, decode tok/s, usage, the text."""
    import openai

    client = openai.OpenAI(base_url=servers.urls[name] + "/v1", api_key="x", timeout=600, max_retries=0)
    url = "data:image/png;base64," + base64.b64encode(image).decode()
    t0 = time.perf_counter()
    first = last = None
    text, usage = "", None
    stream = client.chat.completions.create(
        model=servers.models[name], stream=True, max_tokens=tokens, temperature=0,
        stream_options={"include_usage": True}, extra_body=servers.extra[name](tokens),
        messages=[{"role": "user", "content": [{"type": "text", "text": question},
                                               {"type": "image_url", "image_url": {"url": url}}]}])
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        if chunk.choices and chunk.choices[0].delta.content:
            last = time.perf_counter()
            first = first or last
            text += chunk.choices[0].delta.content
    if first is None or usage is None or last is None:
        raise SystemExit(f"{name} streamed no content or no usage")
    n = usage.completion_tokens
    details = usage.prompt_tokens_details
    return {"ttft_s": round(first - t0, 4), "total_s": round(last - t0, 4), "tokens": n,
            "decode_tok_s": round((n - 1) / (last - first), 2) if n > 1 and last > first else None,
            "prompt_tokens": usage.prompt_tokens, "cached_tokens": details.cached_tokens if details else None,
            "text": text}


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], check=False, capture_output=True, text=True).stdout.strip()
    except OSError:
        return str(os.getloadavg())


def measure(servers: Servers, sides: list[int], reps: int, tokens: int) -> list[dict[str, Any]]:
    names = ["ortserve", "llama"]
    for side in sides:   # warm: sessions, thread pools, first-call allocations
        for name in names:
            ask(servers, name, png(10_000 + side, side), QUESTIONS[0], tokens)
    rows = []
    for side in sides:
        for rep in range(reps):
            order = names if rep % 2 == 0 else names[::-1]
            image = png(side * 100 + rep, side)
            row: dict[str, Any] = {"image": f"{side}x{side}", "rep": rep, "order": order, "uptime_before": uptime()}
            for kind, question in (("first", QUESTIONS[0]), ("repeat", QUESTIONS[0]), ("repeat_new_text", QUESTIONS[1])):
                row[kind] = {name: ask(servers, name, image, question, tokens) for name in order}
            row["uptime_after"] = uptime()
            rows.append(row)
    return rows


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for side in dict.fromkeys(r["image"] for r in rows):
        mine = [r for r in rows if r["image"] == side]
        s: dict[str, Any] = {}
        for kind in ("first", "repeat", "repeat_new_text"):
            k: dict[str, Any] = {}
            for name in ("ortserve", "llama"):
                k[f"{name}_ttft_s"] = round(statistics.median(r[kind][name]["ttft_s"] for r in mine), 4)
                k[f"{name}_decode_tok_s"] = round(statistics.median(
                    r[kind][name]["decode_tok_s"] or 0.0 for r in mine), 2)
            ratios = [r[kind]["ortserve"]["ttft_s"] / r[kind]["llama"]["ttft_s"] for r in mine]
            k["ttft_ratio_per_pair"] = [round(x, 3) for x in ratios]
            k["ttft_ratio_median"] = round(statistics.median(ratios), 3)
            dec = [r[kind]["ortserve"]["decode_tok_s"] / r[kind]["llama"]["decode_tok_s"] for r in mine
                   if r[kind]["ortserve"]["decode_tok_s"] and r[kind]["llama"]["decode_tok_s"]]
            k["decode_ratio_median"] = round(statistics.median(dec), 3) if dec else None
            s[kind] = k
        s["same_text_all"] = all(r[kind]["ortserve"]["text"] == r[kind]["llama"]["text"]
                                 for r in mine for kind in ("first", "repeat", "repeat_new_text"))
        s["prompt_tokens"] = {n: sorted({r["first"][n]["prompt_tokens"] for r in mine}) for n in ("ortserve", "llama")}
        s["target_ttft_le_1x_llama"] = s["first"]["ttft_ratio_median"] <= 1.0
        out[side] = s
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size", choices=sorted(SIZES), default="mid")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--images", type=int, nargs="+", default=[448, 112])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--source", choices=["auto", "hf", "gguf"], default="auto")
    p.add_argument("--outtype", choices=["f32", "f16"], default="f32", help="the GGUF pair's type (convert_hf_to_gguf)")
    p.add_argument("--work", type=Path, default=None)
    p.add_argument("--ports", type=int, nargs=2, default=[8780, 8781])
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--llama-poll", type=int, default=None,
                   help="llama-server --poll (0: its threads sleep instead of spinning; default: its own, 50)")
    p.add_argument("--build-hf", type=Path, default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.build_hf:
        build_hf(a.build_hf, a.size)
        return
    work = a.work or Path(f"/tmp/ortserve-vision-bench-{a.size}" + ("" if a.outtype == "f32" else f"-{a.outtype}"))
    work.mkdir(parents=True, exist_ok=True)
    mat = material(work, a.size, a.source, a.outtype)
    from _common import machine

    mach = machine()
    servers = Servers(work, mat, a.threads, a.ports, a.llama_poll)
    try:
        servers.wait()
        started = uptime()
        rows = measure(servers, a.images, a.reps, a.tokens)
    finally:
        servers.stop()
    result = {"benchmark": "vision_vs_llamaserver", "machine": mach, "uptime_at_start": started,
              "model": {"size": a.size, "config": SIZES[a.size], "gguf_type": a.outtype,
                        "weights": "random; ortserve serves the pair widened to fp32",
                        "vocab": "Qwen2.5 (151936)"},
              "material": mat, "threads": a.threads, "llama_poll": a.llama_poll, "tokens": a.tokens, "reps": a.reps,
              "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
              "summary": summary(rows), "rows": rows}
    text = json.dumps(result, indent=1)
    if a.out:
        a.out.write_text(text + "\n", encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
