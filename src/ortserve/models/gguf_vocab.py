"""One vocabulary size for an imported GGUF: its token list, its embedding and output rows, and
the tokenizer.json written for it (issue 46).

llama.cpp refuses a file whose ``tokenizer.ggml.tokens`` count differs from the rows of
``token_embd.weight`` / ``output.weight`` (its loader checks every tensor's shape against
``n_vocab``); ``check_rows`` refuses the same at ``models import``, from the header alone and
before any output, naming both numbers.

transformers' GGUF tokenizer conversion can add a token the file does not have: a byte-level
(``gpt2``) vocabulary with no unknown token gets GPT-2's default ``<|endoftext|>`` appended as an
added token, one id past the model's rows (128,256 for Llama 3's ``llama-bpe``). llguidance then
refuses the tokenizer ("vocab size too small; 128256 vs 128257"), and the sampler could never
produce that id anyway. ``fit_tokenizer`` drops such added tokens from the written tokenizer.json
so that the tokenizer, llguidance, the sampler and the detokenizer agree on one size, and refuses
a tokenizer that still names an id the model has no row for.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ortserve.errors import ModelError

VOCAB_TENSORS = ("token_embd.weight", "output.weight")


def check_rows(name: str, meta: Mapping[str, Any], rows: Mapping[str, int]) -> int | None:
    """The file's vocabulary size, or a ModelError where its declared token count and a vocabulary
    tensor's rows disagree. ``meta['tokenizer.ggml.tokens']`` is the list or its length (the
    header reader keeps only counts of long arrays); ``rows`` maps tensor name -> row count (the
    GGUF's second dimension). None where the file declares no tokens (nothing to compare)."""
    tokens = meta.get("tokenizer.ggml.tokens")
    if tokens is None:
        return None
    declared = tokens if isinstance(tokens, int) else len(tokens)
    for tensor in VOCAB_TENSORS:
        if tensor in rows and rows[tensor] != declared:
            raise ModelError(
                f"{name}: the file declares {declared} tokens (tokenizer.ggml.tokens) but {tensor} has "
                f"{rows[tensor]} rows; the vocabulary and the weights must agree (llama.cpp refuses this file too)",
                hint="re-convert the model with llama.cpp's convert_hf_to_gguf.py")
    return declared


def fit_tokenizer(out_dir: Path, rows: int) -> list[str]:
    """Make ``out_dir/tokenizer.json`` (and tokenizer_config.json) name no id at or past ``rows``:
    added tokens the conversion invented there are dropped (returned, by content); an id past the
    rows that is in the model's own vocabulary is a disagreement, refused."""
    path = out_dir / "tokenizer.json"
    tok = json.loads(path.read_text(encoding="utf-8"))
    dropped = [a for a in tok.get("added_tokens") or [] if int(a["id"]) >= rows]
    if dropped:
        tok["added_tokens"] = [a for a in tok["added_tokens"] if int(a["id"]) < rows]
        path.write_text(json.dumps(tok, ensure_ascii=False, indent=2), encoding="utf-8")
        _fit_config(out_dir / "tokenizer_config.json", {a["content"] for a in dropped}, rows)
    vocab = (tok.get("model") or {}).get("vocab")
    ids = vocab.values() if isinstance(vocab, dict) else range(len(vocab or ()))
    top = max(ids, default=-1)
    if top >= rows:
        raise ModelError(f"the tokenizer has token id {top} but the model has {rows} vocabulary rows",
                         hint="the file's tokenizer and weights disagree")
    return [a["content"] for a in dropped]


def _fit_config(path: Path, gone: set[str], rows: int) -> None:
    if not path.is_file():
        return
    cfg = json.loads(path.read_text(encoding="utf-8"))
    decoder = cfg.get("added_tokens_decoder")
    if isinstance(decoder, dict):
        cfg["added_tokens_decoder"] = {k: v for k, v in decoder.items() if int(k) < rows}
    for key in ("bos_token", "eos_token", "unk_token", "pad_token"):
        if cfg.get(key) in gone:
            cfg[key] = None
    extra = cfg.get("extra_special_tokens") or cfg.get("additional_special_tokens")
    if isinstance(extra, list):
        cfg["additional_special_tokens" if "additional_special_tokens" in cfg else "extra_special_tokens"] = [
            t for t in extra if t not in gone]
    path.write_text(json.dumps(cfg, ensure_ascii=False, indent=2), encoding="utf-8")


def tokenizer_size(tokenizer_json: Path) -> int:
    """The number of ids tokenizer.json names (model vocabulary and added tokens): max id + 1."""
    tok = json.loads(Path(tokenizer_json).read_text(encoding="utf-8"))
    vocab = (tok.get("model") or {}).get("vocab")
    ids = list(vocab.values()) if isinstance(vocab, dict) else list(range(len(vocab or ())))
    ids += [int(a["id"]) for a in tok.get("added_tokens") or []]
    return max(ids, default=-1) + 1


FIM_KEYS = ("pre", "suf", "mid", "pad", "rep", "sep")  # tokenizer.ggml.fim_<key>_token_id


def keep_fim_ids(meta: Mapping[str, Any], out_dir: Path) -> dict[str, int]:
    """The GGUF's fill-in-the-middle token ids (``tokenizer.ggml.fim_*_token_id``, as llama.cpp's
    converter writes them; ``meta`` is the file's metadata, validate.gguf_metadata), kept in the
    written ``tokenizer_config.json`` as ``fim_token_ids`` (engine/fim.py reads them there before
    looking for the tokens by their text)."""
    ids = {k: int(v) for k in FIM_KEYS if (v := meta.get(f"tokenizer.ggml.fim_{k}_token_id")) is not None}
    if ids:
        path = out_dir / "tokenizer_config.json"
        cfg = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
        path.write_text(json.dumps({**cfg, "fim_token_ids": ids}, ensure_ascii=False, indent=2), encoding="utf-8")
    return ids
