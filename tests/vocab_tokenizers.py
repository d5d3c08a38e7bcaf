"""Real tokenizers as ``tokenizer.json`` directories, made from llama.cpp's vocab GGUFs
(tests/llamacpp.py) and cached beside them (``<cache>/tokenizers/<name>``): transformers reads most
GGUF vocabularies; Gemma 4's (a SentencePiece-style BPE that transformers cannot read yet) is
built here from the GGUF's tokens, merges and token types with the ``tokenizers`` library."""

from __future__ import annotations

import json
import os
from pathlib import Path

from llamacpp import cache_dir, vocab


def tokenizer_dir(name: str) -> Path:
    out = cache_dir() / "tokenizers" / name
    if (out / "tokenizer.json").is_file():
        return out
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    if name == "gemma-4":
        _gemma4(vocab(name), tmp)
    else:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from transformers import AutoTokenizer

        gguf = vocab(name)
        AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name).save_pretrained(str(tmp))
    tmp.replace(out) if not out.exists() else None
    return out


def _gemma4(gguf: Path, out: Path) -> None:
    from gguf import GGUFReader
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers

    r = GGUFReader(str(gguf))

    def array(key: str) -> list:
        f = r.fields[key]
        return [f.contents(i) for i in range(len(f.data))] if hasattr(f, "contents") else [
            bytes(f.parts[i]).decode("utf-8") if f.types[-1].name == "STRING" else f.parts[i][0].item()
            for i in f.data]

    tokens, types = array("tokenizer.ggml.tokens"), array("tokenizer.ggml.token_type")
    merges = [tuple(m.split(" ", 1)) for m in array("tokenizer.ggml.merges")]
    tok = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges, byte_fallback=True, fuse_unk=True,
                               unk_token="<unk>"))
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t, k in zip(tokens, types) if k == 3])
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    eos = tokens[r.fields["tokenizer.ggml.eos_token_id"].contents()]
    (out / "tokenizer_config.json").write_text(json.dumps({"eos_token": eos}), encoding="utf-8")
