"""A Whisper model on ONNX Runtime (GenAI) and its windowed decode loop (openai/whisper transcribe.py).

og's audio processor makes the log-mel features and og's tokenizer the text; the encoder and the
decoder run on ortserve's own ONNX Runtime sessions (``runner.py``; og's Generator with
``backend="og"``), one decoder step at a time driven from here (logits -> the rules in ``rules.py`` ->
the next token), so this module applies Whisper's timestamp and suppression rules, detects the
language from the first step, reads the no-speech probability, falls back to higher temperatures on a repetitive or unlikely
window, and walks audio of any length in 30 s windows that restart at the last timestamp.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ortserve.audio import alignment, rules, runner
from ortserve.audio.decode import RATE, Audio, wav_bytes
from ortserve.audio.tokens import LANGUAGES, SpecialTokens, load_special_tokens

WINDOW = 30 * RATE              # samples per window (the encoder's 3000 frames)
STAMP = 0.02                    # seconds per timestamp token
SAMPLE_LEN = 224                # tokens per window at most (half the decoder's context)
PROMPT_TOKENS = 223             # previous text kept as the next window's prompt
NO_SPEECH = 0.6                 # a window above this, whose text is also unlikely, is silence
LOGPROB_FLOOR = -1.0            # below: the window is decoded again at a higher temperature
COMPRESSION_CEILING = 2.4       # above: the window repeats itself; decode it again
SIDE_FILE = "whisper.json"      # ortserve's notes beside the og files: suppressed ids


@dataclass
class Options:
    task: str = "transcribe"          # or "translate" (to English)
    language: str | None = None       # a code ("en"); None: detected from the first window
    prompt: str = ""                  # text before the audio, as Whisper's previous text
    temperature: float = 0.0          # the first try's; fallbacks rise by 0.2 up to 1.0
    seed: int = 0
    words: bool = False               # word timestamps (cross-attention alignment, audio/alignment.py)


@dataclass
class Segment:
    id: int
    seek: int                         # the window's start in 10 ms frames (as openai-whisper reports it)
    start: float
    end: float
    text: str
    tokens: list[int]
    temperature: float
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float
    words: list[alignment.Word] = field(default_factory=list)   # with Options.words

    def to_json(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k != "words"}
        return {**out, "start": round(self.start, 2), "end": round(self.end, 2)}


@dataclass
class _Try:
    tokens: list[int]
    sum_logprob: float
    no_speech_prob: float
    temperature: float
    language: str
    finished: bool = True             # ended with <|endoftext|> (not cut at SAMPLE_LEN)
    text: str = ""
    avg_logprob: float = 0.0
    compression: float = 0.0
    cross: dict[str, np.ndarray] | None = None   # the encoder's cross-attention keys/values (for words)


@dataclass
class Transcript:
    """What ``WhisperModel.transcribe`` found besides the segments it yields."""
    language: str = ""
    duration: float = 0.0
    segments: list[Segment] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "".join(s.text for s in self.segments).strip()

    @property
    def words(self) -> list[alignment.Word]:
        return [w for s in self.segments for w in s.words]


class WhisperModel:
    def __init__(self, model_dir: Path, threads: int = 0, backend: str = "ort", spin: bool | str = "auto") -> None:
        """``threads``: ONNX Runtime threads for the encoder and decoder (0: its default, every core);
        fewer leave cores to chat engines running beside. ``backend``: ``ort`` runs the encoder and
        decoder on ortserve's own sessions (``runner.py``: threads spin only on an idle machine, the
        encoder runs once per window even when a fallback decodes it again); ``og`` on og's Generator
        (the first implementation, kept to check that both decide the same tokens)."""
        if backend not in ("ort", "og"):
            raise ValueError(f"backend must be 'ort' or 'og', not {backend!r}")
        import onnxruntime_genai as og

        self.og = og
        self.dir = Path(model_dir)
        cfg = json.loads((self.dir / "genai_config.json").read_text(encoding="utf-8"))
        if cfg.get("model", {}).get("type") != "whisper":
            raise ValueError(f"{model_dir} is not an ONNX GenAI Whisper model")
        side = self.dir / SIDE_FILE
        notes = json.loads(side.read_text(encoding="utf-8")) if side.is_file() else {}
        config = og.Config(str(self.dir))
        if threads > 0:   # an overlay's session_options replace the part's own: keep its custom-op library
            config.overlay(json.dumps({"model": {part: {"session_options": {
                "intra_op_num_threads": threads, **{k: v for k, v in cfg["model"][part].get("session_options", {}).items()
                                                    if k == "custom_ops_library"}}} for part in ("encoder", "decoder")}}))
        self.model = og.Model(config)
        self.processor = self.model.create_multimodal_processor()
        self.tokenizer = og.Tokenizer(self.model)
        self.special: SpecialTokens = load_special_tokens(self.dir, int(cfg["model"]["vocab_size"]),
                                                          notes.get("suppress_tokens"))
        self.multilingual = len(self.special.languages) > 1
        self.rules = rules.Rules(self.special)
        self.lock = threading.Lock()
        self.threads = threads
        dec = cfg["model"]["decoder"]
        self.layers, self.kv_heads, self.head_size = (int(dec["num_hidden_layers"]), int(dec["num_key_value_heads"]),
                                                      int(dec["head_size"]))
        heads = notes.get("alignment_heads") or alignment.default_heads(self.layers, int(dec["num_attention_heads"]))
        self.alignment_heads = [(int(a), int(b)) for a, b in heads]
        self._aligner: alignment.Aligner | None = None
        self.backend = backend
        self.runner = runner.Runner(self.dir, self.layers, threads, spin) if backend == "ort" else None

    def memory_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.dir.glob("*.onnx*"))

    # ---- one window ---------------------------------------------------------
    def _inputs(self, pcm: np.ndarray, prompt: str) -> Any:
        """og's audio processor: the window's log-mel features and the prompt's token ids."""
        og = self.og
        prefix = (f"<|startofprev|>{prompt}" if prompt else "") + "<|startoftranscript|>"
        return self.processor(prompt=prefix, audios=og.Audios.open_bytes(wav_bytes(pcm)))

    def _steps(self, inputs: Any, cross: dict[str, np.ndarray] | None) -> tuple[runner.Steps | _OgSteps, np.ndarray]:
        """A fresh decode of the window and its first logits (after the prompt)."""
        if self.runner is not None and cross is not None:
            steps: runner.Steps | _OgSteps = self.runner.start(cross)
            return steps, steps.feed([int(i) for i in inputs["input_ids"].as_numpy().reshape(-1)])
        og = self.og
        params = og.GeneratorParams(self.model)
        params.set_search_options(max_length=448, batch_size=1)
        gen = og.Generator(self.model, params)
        gen.set_inputs(inputs)
        return _OgSteps(gen, self.layers), gen.get_logits().reshape(-1)

    def _decode(self, inputs: Any, cross: dict[str, np.ndarray] | None, language: str | None, task: str,
                temperature: float, rng: np.random.Generator, words: bool = False) -> _Try:
        """One window at one temperature; ``language`` None: detected from this first step."""
        sp = self.special
        steps, first = self._steps(inputs, cross)
        no_speech = float(np.exp(rules.log_softmax(first)[sp.no_speech]))
        if language is None:
            language = self.language_of(first) if self.multilingual else "en"
        head = [sp.languages[language], sp.translate if task == "translate" else sp.transcribe] \
            if self.multilingual else []
        logits = steps.feed(head) if head else first
        sampled: list[int] = []
        total, finished = 0.0, False
        for _ in range(SAMPLE_LEN):
            token, lp = self.rules.next(logits, sampled, temperature, rng)
            total += lp
            if token == sp.eot:
                finished = True
                break
            sampled.append(token)
            logits = steps.feed([token])
        t = _Try(sampled, total, no_speech, temperature, language, finished)
        if words:
            t.cross = cross if cross is not None else steps.cross()  # type: ignore[union-attr]
        t.text = self.text_of(sampled)
        t.avg_logprob = total / (len(sampled) + 1)
        t.compression = rules.compression_ratio(t.text)
        return t

    def text_of(self, tokens: list[int]) -> str:
        text = [t for t in tokens if t < self.special.eot]
        return self.tokenizer.decode(np.array(text, dtype=np.int32)) if text else ""

    def _window(self, pcm: np.ndarray, prompt: str, language: str | None, opts: Options,
                rng: np.random.Generator) -> _Try:
        """Decode at rising temperatures until the text is neither repetitive nor unlikely."""
        temps = [opts.temperature] + [round(t, 1) for t in np.arange(0.2, 1.01, 0.2) if t > opts.temperature + 1e-6]
        tries: list[_Try] = []
        inputs = self._inputs(pcm, prompt)
        # the encoder once per window: every temperature decodes against the same keys and values
        cross = self.runner.encode(inputs["audio_features"].as_numpy()) if self.runner is not None else None
        for temp in temps:
            t = self._decode(inputs, cross, language, opts.task, temp, rng, opts.words)
            language = t.language
            tries.append(t)
            if silent(t):
                return t        # silence: no fallback decides anything there
            if t.finished and t.compression <= COMPRESSION_CEILING and t.avg_logprob >= LOGPROB_FLOOR:
                return t
        sane = [t for t in tries if t.finished and t.compression <= COMPRESSION_CEILING]
        return max(sane, key=lambda t: t.avg_logprob) if sane else tries[-1]

    def language_of(self, logits: np.ndarray) -> str:
        """The most likely language at the first step (after <|startoftranscript|>)."""
        ids = self.special.language_ids
        return list(self.special.languages)[int(np.argmax(logits[ids]))]

    # ---- the whole recording ------------------------------------------------
    def transcribe(self, audio: Audio, opts: Options, found: Transcript | None = None) -> Iterator[Segment]:
        """Segments in order, as each 30 s window is decoded; ``found`` gets the language."""
        found = found if found is not None else Transcript()
        pcm, n = audio.pcm, len(audio.pcm)
        found.duration = n / RATE
        language = opts.language
        found.language = LANGUAGES.get(language, language) if language else ""
        rng = np.random.default_rng(opts.seed)
        # the previous text as Whisper conditions on it: its tokens, timestamps included (without
        # them the model stops writing timestamps, and windows lose their last sentence)
        history = [int(i) for i in self.tokenizer.encode(" " + opts.prompt.strip())] if opts.prompt.strip() else []
        seek = 0
        while seek < n - RATE // 100:          # less than 10 ms left: nothing to hear
            window = pcm[seek:seek + WINDOW]
            size = len(window)
            t = self._window(window, self.prompt_text(history[-PROMPT_TOKENS:]), language, opts, rng)
            if language is None:
                language = t.language
                found.language = LANGUAGES.get(language, language)
            if silent(t):
                seek += size                    # silence: skip the window
                continue
            segments, advance = self._segments(t, seek, size, n)
            if opts.words and segments:
                self._time_words(t, segments, seek, size, opts.task)
            for s in segments:
                s.id = len(found.segments)
                found.segments.append(s)
                history.extend(s.tokens)
                yield s
            seek += advance
            if t.temperature > 0.5:
                history = []                    # a hard window: do not condition the next on it

    def aligner(self) -> alignment.Aligner:
        with self.lock:
            if self._aligner is None:
                self._aligner = alignment.Aligner(self.dir, self.alignment_heads, self.layers, self.kv_heads,
                                                  self.head_size, self.threads)
            return self._aligner

    def _time_words(self, t: _Try, segments: list[Segment], seek: int, size: int, task: str) -> None:
        """Each segment's words, timed by the alignment heads over the whole window's text at once."""
        sp = self.special
        sot = [sp.sot, *([sp.languages[t.language], sp.translate if task == "translate" else sp.transcribe]
                         if self.multilingual else []), sp.no_timestamps]
        text = [x for s in segments for x in s.tokens if x < sp.eot]
        if t.cross is None or not text:
            return
        starts = self.aligner().token_starts(sot, text, sp.eot, t.cross, size // (RATE // 50))
        words = alignment.words_of(text, starts, self.text_of, t.language, seek / RATE)
        for s in segments:                    # hand the words out in order, by their tokens
            need = sum(1 for x in s.tokens if x < sp.eot)
            while need > 0 and words:
                w = words.pop(0)
                s.words.append(w)
                need -= len(w.tokens)
        if words and segments:
            segments[-1].words.extend(words)
        for s in segments:
            alignment.tidy(s.words, s.start, s.end)

    def prompt_text(self, tokens: list[int]) -> str:
        """Tokens as the prompt string og's tokenizer reads back: text, and timestamps as <|x.xx|>."""
        tb, out, run = self.special.timestamp_begin, [], []
        for t in tokens:
            if t >= tb:
                out.append(self.text_of(run))
                out.append(f"<|{(t - tb) * STAMP:.2f}|>")
                run = []
            elif t < self.special.eot:
                run.append(t)
        out.append(self.text_of(run))
        return "".join(out)

    def _segments(self, t: _Try, seek: int, size: int, total: int) -> tuple[list[Segment], int]:
        """Split a window's tokens at its timestamp pairs (transcribe.py); how far to move on."""
        tb, toks = self.special.timestamp_begin, t.tokens
        offset = seek / RATE
        is_ts = [x >= tb for x in toks]
        single_end = len(toks) >= 2 and is_ts[-1] and not is_ts[-2]
        cuts = [i for i in range(1, len(toks)) if is_ts[i] and is_ts[i - 1]]
        out: list[Segment] = []

        def add(start: float, end: float, piece: list[int]) -> None:
            text = self.text_of(piece)
            if not text.strip():
                return
            end = min(end, total / RATE)
            out.append(Segment(0, seek // (RATE // 100), start, max(start, end), text, piece, t.temperature,
                               t.avg_logprob, t.compression, t.no_speech_prob))

        if cuts:
            if single_end:
                cuts.append(len(toks))
            last = 0
            for cut in cuts:
                piece = toks[last:cut]
                add(offset + (piece[0] - tb) * STAMP, offset + (piece[-1] - tb) * STAMP, piece)
                last = cut
            if single_end:
                return out, size
            moved = int((toks[last - 1] - tb) * STAMP * RATE)
            return out, moved if moved > 0 else size
        stamps = [x for x in toks if x >= tb]
        duration = (stamps[-1] - tb) * STAMP if stamps and stamps[-1] != tb else size / RATE
        add(offset, offset + duration, toks)
        return out, size


def silent(t: _Try) -> bool:
    """A window Whisper takes for silence: no speech likely and its text unlikely too."""
    return t.no_speech_prob > NO_SPEECH and t.avg_logprob < LOGPROB_FLOOR


class _OgSteps:
    """og's Generator behind the same ``feed`` as ``runner.Steps``."""

    def __init__(self, gen: Any, layers: int) -> None:
        self.gen, self.layers = gen, layers

    def feed(self, tokens: list[int]) -> np.ndarray:
        self.gen.append_tokens(np.array(tokens, dtype=np.int32))
        return self.gen.get_logits().reshape(-1)

    def cross(self) -> dict[str, np.ndarray]:
        names = [f"present_{kv}_cross_{i}" for kv in ("key", "value") for i in range(self.layers)]
        return {n: np.ascontiguousarray(self.gen.get_output(n)) for n in names}
