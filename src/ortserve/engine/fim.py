r"""Fill-in-the-middle: a code model's FIM tokens and the prompt built from them.

A FIM model was trained on ``PRE prefix SUF suffix MID`` and writes the middle. Which tokens those
are depends on the family; as llama.cpp does (llama-vocab.cpp), they are found by their text in the
vocabulary, unless ``tokenizer_config.json`` names them (``fim_token_ids``: ``{pre, suf, mid, rep, sep}``,
a GGUF's ``tokenizer.ggml.fim_*_token_id`` keys, kept there at import by models/gguf_vocab.py). The prompt is llama-server's ``/infill`` one:
``[REP repo\n] [SEP filename\n text]... [SEP filename\n] [BOS] PRE prefix prompt SUF suffix MID``
(the repository and file parts only where the model has those tokens and, for the files, where
they are given). The user's text is tokenized as text: a ``<fim_suffix>`` typed in the code does
not become the control token.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

# (prefix, suffix, middle, repository, file separator) token texts, per family
SHAPES: dict[str, tuple[str, str, str, str | None, str | None]] = {
    "qwen2.5-coder": ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|repo_name|>", "<|file_sep|>"),
    "starcoder": ("<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<repo_name>", "<file_sep>"),
    "codellama": ("\u2581<PRE>", "\u2581<SUF>", "\u2581<MID>", None, None),
    "codellama-plain": ("<PRE>", "<SUF>", "<MID>", None, None),
    "deepseek-coder": ("<\uff5cfim\u2581begin\uff5c>", "<\uff5cfim\u2581hole\uff5c>", "<\uff5cfim\u2581end\uff5c>",
                       None, None),
    "refact": ("<fim-prefix>", "<fim-suffix>", "<fim-middle>", None, None),
}
GGUF_KEYS = {"pre": "prefix", "suf": "suffix", "mid": "middle", "rep": "repo", "sep": "file_sep"}
# llama-server's fixed names where the request has none (its TODOs: the project and current file)
REPO_NAME, CURRENT_FILE, EXTRA_FILE = "myproject", "filename", "tmp"


@dataclass(frozen=True)
class FimTokens:
    shape: str
    prefix: int
    suffix: int
    middle: int
    repo: int | None = None
    file_sep: int | None = None


def find_fim(token_id: Callable[[str], int | None], declared: dict[str, int] | None = None) -> FimTokens | None:
    """This vocabulary's FIM tokens: the ones ``declared`` (GGUF keys ``pre``/``suf``/``mid``/
    ``rep``/``sep``), else the first family shape whose prefix, suffix and middle all exist."""
    if declared and all(isinstance(declared.get(k), int) for k in ("pre", "suf", "mid")):
        return FimTokens("gguf", declared["pre"], declared["suf"], declared["mid"],
                         declared.get("rep"), declared.get("sep"))
    for shape, (pre, suf, mid, rep, sep) in SHAPES.items():
        ids = [token_id(pre), token_id(suf), token_id(mid)]
        if all(i is not None for i in ids):
            return FimTokens(shape, *ids,  # type: ignore[arg-type]
                             repo=token_id(rep) if rep else None, file_sep=token_id(sep) if sep else None)
    return None


def infill_ids(fim: FimTokens, encode: Callable[[str], list[int]], prefix: str, suffix: str, *,
               prompt: str = "", extra: list[tuple[str, str]] | None = None, bos: list[int] | None = None,
               repo_header: bool = True) -> list[int]:
    """The prompt's token ids. ``encode`` tokenizes plain text (no special tokens added or parsed);
    ``extra`` is (filename, text) pairs of other files; ``repo_header`` False leaves out the
    repository and file parts (``suffix`` on /v1/completions, as Ollama's FIM templates)."""
    head: list[int] = []
    if repo_header:
        if fim.repo is not None:
            head += [fim.repo, *encode(REPO_NAME + "\n")]
        for filename, text in extra or []:
            if fim.file_sep is not None:
                head += [fim.file_sep, *encode((filename or EXTRA_FILE) + "\n")]
            else:  # llama-server's chunk separator where there is no file token
                head += encode("\n\n--- snippet ---\n\n")
            head += encode(text)
        if fim.file_sep is not None:
            head += [fim.file_sep, *encode(CURRENT_FILE + "\n")]
    return [*head, *(bos or []), fim.prefix, *encode(prefix), *encode(prompt), fim.suffix, *encode(suffix),
            fim.middle]
