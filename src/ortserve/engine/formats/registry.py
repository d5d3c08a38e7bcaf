"""Which tool-call syntax a model speaks: the one place that decides.

A model's own chat template says it (each format's ``detect`` strings, first match in ``ORDER``);
the vocabulary's special tokens say it when the template is silent (a GGUF or tokenizer with
``[TOOL_CALLS]`` or ``<|tool_call|>``); a model's manifest may name a format outright
(``"tool_format"``, models/store.py); and a template with no tool syntax gets Hermes."""

from __future__ import annotations

from collections.abc import Iterable

from ortserve.engine.formats.base import ToolFormat
from ortserve.engine.formats.gemma import GEMMA
from ortserve.engine.formats.hermes import HERMES
from ortserve.engine.formats.llama3 import LLAMA3
from ortserve.engine.formats.mistral import MISTRAL
from ortserve.engine.formats.mistral_v11 import MISTRAL_V11
from ortserve.engine.formats.phi4 import PHI4
from ortserve.errors import InvalidRequest

# Hermes first: a Llama-based Hermes template also mentions Llama's markers; Mistral v11 before
# Nemo's: both templates write [TOOL_CALLS], only v11's [ARGS]; Gemma last: its marker is a turn
# marker, not a tool syntax.
ORDER: tuple[ToolFormat, ...] = (HERMES, MISTRAL_V11, MISTRAL, PHI4, LLAMA3, GEMMA)
FORMATS = {f.name: f for f in ORDER}
FALLBACK = HERMES
# special tokens that name a syntax even when a template does not ([ARGS] first: a v11 vocabulary
# has [TOOL_CALLS] too)
TOKENS = {"[ARGS]": MISTRAL_V11, "[TOOL_CALLS]": MISTRAL, "<|tool_call|>": PHI4, "<|python_tag|>": LLAMA3, "<tool_call>": HERMES}


def by_name(name: str, param: str = "tool_format") -> ToolFormat:
    try:
        return FORMATS[name]
    except KeyError:
        raise InvalidRequest(f"'{param}' must be one of {', '.join(FORMATS)}, got {name!r}", param=param) from None


def detect(template: str | None, special_tokens: Iterable[str] = (), override: str | None = None) -> ToolFormat:
    """The format for a model: its manifest's choice, else its template's, else its vocabulary's, else Hermes."""
    return choose(template, special_tokens, override)[0]


def choose(template: str | None, special_tokens: Iterable[str] = (),
           override: str | None = None) -> tuple[ToolFormat, str]:
    """``detect`` and where the choice came from (for the load log): manifest, chat template,
    vocabulary or fallback."""
    if override:
        return by_name(override), "manifest"
    for fmt in ORDER:
        if template and any(marker in template for marker in fmt.detect):
            return fmt, "chat template"
    specials = set(special_tokens)
    found = next((fmt for token, fmt in TOKENS.items() if token in specials), None)
    return (found, "vocabulary") if found else (FALLBACK, "fallback")
