"""Whisper's special token ids, read from the model's own tokenizer.json, and its languages."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

# Whisper's language codes and names (openai/whisper tokenizer.py), in token order
_PAIRS = (
    "en:english zh:chinese de:german es:spanish ru:russian ko:korean fr:french ja:japanese pt:portuguese "
    "tr:turkish pl:polish ca:catalan nl:dutch ar:arabic sv:swedish it:italian id:indonesian hi:hindi "
    "fi:finnish vi:vietnamese he:hebrew uk:ukrainian el:greek ms:malay cs:czech ro:romanian da:danish "
    "hu:hungarian ta:tamil no:norwegian th:thai ur:urdu hr:croatian bg:bulgarian lt:lithuanian la:latin "
    "mi:maori ml:malayalam cy:welsh sk:slovak te:telugu fa:persian lv:latvian bn:bengali sr:serbian "
    "az:azerbaijani sl:slovenian kn:kannada et:estonian mk:macedonian br:breton eu:basque is:icelandic "
    "hy:armenian ne:nepali mn:mongolian bs:bosnian kk:kazakh sq:albanian sw:swahili gl:galician mr:marathi "
    "pa:punjabi si:sinhala km:khmer sn:shona yo:yoruba so:somali af:afrikaans oc:occitan ka:georgian "
    "be:belarusian tg:tajik sd:sindhi gu:gujarati am:amharic yi:yiddish lo:lao uz:uzbek fo:faroese "
    "ht:haitian_creole ps:pashto tk:turkmen nn:nynorsk mt:maltese sa:sanskrit lb:luxembourgish my:myanmar "
    "bo:tibetan tl:tagalog mg:malagasy as:assamese tt:tatar haw:hawaiian ln:lingala ha:hausa ba:bashkir "
    "jw:javanese su:sundanese yue:cantonese")
LANGUAGES = {k: v.replace("_", " ") for k, _, v in (p.partition(":") for p in _PAIRS.split())}
NAMES = {v: k for k, v in LANGUAGES.items()}
_LANG_RE = re.compile(r"^<\|([a-z]{2,3})\|>$")
_TS_RE = re.compile(r"^<\|(\d+\.\d\d)\|>$")


@dataclass(frozen=True)
class SpecialTokens:
    eot: int
    sot: int
    sot_prev: int
    translate: int
    transcribe: int
    no_speech: int
    no_timestamps: int
    timestamp_begin: int      # <|0.00|>; every id from here up is a timestamp (0.02 s apart)
    languages: dict[str, int]   # code -> id
    vocab_size: int
    suppress: tuple[int, ...]   # never sampled: non-speech symbols (the model's config) and control tokens

    @property
    def language_ids(self) -> list[int]:
        return list(self.languages.values())

    def language_of(self, token: int) -> str:
        return next(code for code, t in self.languages.items() if t == token)


def load_special_tokens(model_dir: Path, vocab_size: int, suppress_extra: list[int] | None = None) -> SpecialTokens:
    data = json.loads((model_dir / "tokenizer.json").read_text(encoding="utf-8"))
    ids = {t["content"]: int(t["id"]) for t in data.get("added_tokens", [])}

    def need(*names: str) -> int:
        for n in names:
            if n in ids:
                return ids[n]
        raise ValueError(f"tokenizer.json has none of {names}: not a Whisper tokenizer")

    langs = {m.group(1): i for c, i in sorted(ids.items(), key=lambda kv: kv[1])
             if (m := _LANG_RE.match(c)) and m.group(1) in LANGUAGES}
    ts = min((i for c, i in ids.items() if _TS_RE.match(c)), default=need("<|notimestamps|>") + 1)
    special = SpecialTokens(
        eot=need("<|endoftext|>"), sot=need("<|startoftranscript|>"), sot_prev=need("<|startofprev|>"),
        translate=need("<|translate|>"), transcribe=need("<|transcribe|>"),
        no_speech=need("<|nospeech|>", "<|nocaptions|>"), no_timestamps=need("<|notimestamps|>"),
        timestamp_begin=ts, languages=langs, vocab_size=vocab_size, suppress=())
    control = [special.sot, special.sot_prev, special.translate, special.transcribe, special.no_speech,
               ids.get("<|startoflm|>", special.sot), *langs.values()]
    return SpecialTokens(**{**special.__dict__, "suppress": tuple(sorted(set(control + (suppress_extra or []))))})
