"""Fill-in-the-middle prompts for the wire APIs (``suffix`` on /v1/completions, llama-server's
``/infill``): the model's FIM tokens (engine/fim.py), or a 400 naming the field that asked for them."""

from __future__ import annotations

from typing import Any

from ortserve.engine.fim import infill_ids
from ortserve.errors import InvalidRequest


def fim_prompt(engine: Any, prefix: str, suffix: str, *, field: str, prompt: str = "",
               extra: list[tuple[str, str]] | None = None, repo_header: bool = True) -> list[int]:
    """The token ids of a FIM prompt on ``engine``'s model; ``field`` is what the 400 names."""
    codec = engine.codec
    fim = codec.fim
    if fim is None:
        raise InvalidRequest(
            f"'{field}' needs a fill-in-the-middle model: {engine.model_id} has no FIM tokens in its tokenizer "
            "(such as Qwen2.5-Coder's <|fim_prefix|>/<|fim_suffix|>/<|fim_middle|>, CodeLlama's <PRE>/<SUF>/<MID> "
            "or StarCoder's <fim_prefix>...); serve a code model that has them", param=field,
            code="fim_not_supported")
    bos = codec.encode("", add_special_tokens=True)  # what the tokenizer puts first (CodeLlama's <s>)
    return infill_ids(fim, codec.text_ids, prefix, suffix, prompt=prompt, extra=extra, bos=bos,
                      repo_header=repo_header)
