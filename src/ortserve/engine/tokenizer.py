"""Tokenizer and chat template of a model directory (HF `tokenizers` + jinja2; no torch)."""

from __future__ import annotations

import json
import logging
from datetime import datetime
from pathlib import Path
from typing import Any

from ortserve.engine.fim import FimTokens, find_fim
from ortserve.engine.formats import FALLBACK, Tool, ToolFormat, choose
from ortserve.engine.reasoning import MISTRAL, left_open, markers_of
from ortserve.errors import InvalidRequest, ModelError

log = logging.getLogger("ortserve.engine")
ROLES = ("system", "user", "assistant", "tool", "developer")
# A model with no chat template (a base model's GGUF, as Gemma 3 270M's) chats through ChatML, as
# llama-server does; the chat routes name it in the header TEMPLATE_HEADER and the load log says so.
# The tokenizer's own special tokens (BOS) are added as it adds them to any text (add_special_tokens).
CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
FALLBACK_TEMPLATE = "fallback-chatml"
TEMPLATE_HEADER = "x-ortserve-chat-template"


class TextCodec:
    tool_format: ToolFormat = FALLBACK  # set per model in __init__ (engine/formats/registry.py)
    reasoning_markers: tuple[str, str] | None = None  # a thinking model's (engine/reasoning.py), set in __init__
    added_tokens: dict[str, int] = {}  # noqa: RUF012 - text -> id, set in __init__ (never mutated)
    _dropped: set[int] | None = None  # special tokens the decoder skips, where it keeps some (set in __init__)

    def __init__(self, model_dir: Path) -> None:
        from tokenizers import Tokenizer

        path = model_dir / "tokenizer.json"
        if not path.is_file():
            raise ModelError(f"{model_dir} has no tokenizer.json",
                             hint="copy the model's tokenizer files next to genai_config.json")
        self.tokenizer = Tokenizer.from_file(str(path))
        cfg = _read_json(model_dir / "tokenizer_config.json")
        self.bos_token = _token_text(cfg.get("bos_token"))
        self.eos_token = _token_text(cfg.get("eos_token"))
        template_file = model_dir / "chat_template.jinja"
        template = template_file.read_text(encoding="utf-8") if template_file.is_file() else cfg.get("chat_template")
        if isinstance(template, list):  # named templates: take the default
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        self.chat_template: str | None = template
        # "model" (its own template) or FALLBACK_TEMPLATE (none: ChatML, named in TEMPLATE_HEADER)
        self.template_source = "model" if template else FALLBACK_TEMPLATE
        if not template:
            log.warning("%s has no chat template: chat requests use the fallback ChatML template (as llama-server "
                        "does), named in the %s header; /v1/completions takes raw text", model_dir, TEMPLATE_HEADER)
        self._compiled: Any = None
        # the tool-call syntax this model speaks (engine/formats/registry.py decides; the manifest may say)
        override = _read_json(model_dir / "ortserve.json").get("tool_format")
        decoder = self.tokenizer.get_added_tokens_decoder()
        added = {t.content: i for i, t in decoder.items()}
        specials = {t.content: i for i, t in decoder.items() if t.special}
        try:
            fmt, source = choose(template, specials, override if isinstance(override, str) else None)
        except InvalidRequest as exc:
            raise ModelError(f"{model_dir / 'ortserve.json'}: {exc.message}") from exc
        self.tool_format = fmt.bind(added, set(specials))
        self.added_tokens = added
        # a thinking model's reasoning markers (engine/reasoning.py); where they are special tokens
        # (Mistral's [THINK]) the decoder keeps them, so the answer still shows where reasoning ends
        self.reasoning_markers = markers_of(template)
        kept = {specials[m] for m in self.reasoning_markers or () if m in specials}
        self._dropped = set(specials.values()) - kept if kept else None
        self._opens: dict[bool | None, bool] = {}  # answer_starts_thinking, per ``thinking``
        self.tool_format_source = source
        fim_ids = cfg.get("fim_token_ids")  # a GGUF's tokenizer.ggml.fim_*_token_id, kept at import
        self.fim: FimTokens | None = find_fim(self.token_id, fim_ids if isinstance(fim_ids, dict) else None)
        self._plain: Any = None  # a copy that reads special-token text as text (text_ids)
        log.info("%s: tool calls in the %s syntax (from its %s)", model_dir.name, fmt.name, source)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)

    def text_ids(self, text: str, add_special: bool = False) -> list[int]:
        """``text`` as plain text: a special token's text typed in it stays text (llama.cpp's
        ``parse_special=false``; the FIM prompt's user parts); ``add_special`` adds what the
        tokenizer adds around a text (a BOS)."""
        if self._plain is None:
            from tokenizers import Tokenizer

            plain = Tokenizer.from_str(self.tokenizer.to_str())
            plain.encode_special_tokens = True
            self._plain = plain
        return list(self._plain.encode(text, add_special_tokens=add_special).ids)

    def chat_ids(self, messages: list[dict[str, Any]], tools: list[Tool] | None = None,
                 thinking: bool | None = None) -> list[int]:
        """The token ids of a conversation's rendered prompt: what every chat API submits and every
        token count (/tokenize's ``messages``, count_tokens, /v1/responses/input_tokens) counts."""
        text = self.render_chat(messages, tools=tools, thinking=thinking)
        return self.encode(text, add_special_tokens=self.template_source == FALLBACK_TEMPLATE)  # a template writes BOS

    def piece(self, token: int) -> str:
        """One token's text as it decodes alone (special tokens included)."""
        return str(self.tokenizer.decode([token], skip_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        if self._dropped:  # every special token but the reasoning markers
            return str(self.tokenizer.decode([i for i in ids if i not in self._dropped], skip_special_tokens=False))
        return str(self.tokenizer.decode(ids, skip_special_tokens=True))

    def token_id(self, text: str) -> int | None:
        return self.tokenizer.token_to_id(text)

    @property
    def thinks(self) -> bool:
        """Whether the model writes reasoning in ``<think>`` (or ``[THINK]``) blocks (engine/reasoning.py)."""
        return self.reasoning_markers is not None

    @property
    def thinking_switch(self) -> bool:
        """Whether the template can turn the reasoning off (``enable_thinking``, Qwen3's). DeepSeek-R1's
        always opens the block; Ministral 3 Reasoning's asks for it in its default system prompt."""
        return self.thinks and "enable_thinking" in (self.chat_template or "")

    def answer_starts_thinking(self, thinking: bool | None = None) -> bool:
        """Whether this template's generation prompt opens a ``<think>`` block (DeepSeek-R1's), so
        the answer starts inside it; ``thinking`` as for ``render_chat``."""
        if self.reasoning_markers is None:
            return False
        if thinking not in self._opens:  # the same for every conversation: rendered once
            self._opens[thinking] = left_open(
                self.render_chat([{"role": "user", "content": "x"}], thinking=thinking), self.reasoning_markers)
        return self._opens[thinking]

    def think_lark(self, thinking: bool | None = None) -> tuple[str, bool] | None:
        """This model's reasoning block for a tool grammar (``ToolFormat.grammar``'s ``think``): its
        Lark, where its markers are single tokens (a grammar's text cannot write those), and whether
        it must come first (the prompt opened it); None where it has none, or where the markers are
        ordinary text that prose already covers."""
        if self.reasoning_markers is None:
            return None
        ids = [self.added_tokens.get(m) for m in self.reasoning_markers]
        if None in ids:
            return None
        if self.answer_starts_thinking(thinking):  # the prompt opened the block: it comes first
            return f"THOUGHT <[{ids[1]}]>", True
        return None if thinking is False else (f"<[{ids[0]}]> THOUGHT <[{ids[1]}]>", False)

    @property
    def supports_tools(self) -> bool:
        """Whether the model's template renders the ``tools`` variable itself."""
        return bool(self.chat_template) and "tools" in (self.chat_template or "")

    def render_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                    tools: list[Tool] | None = None, thinking: bool | None = None) -> str:
        """Apply the model's own chat template to OpenAI-style messages.

        Tools and tool messages go through the template's own ``tools`` support when it has
        some; otherwise through the documented fallback (tools described in the system prompt).
        ``thinking=False`` turns a thinking model's reasoning off (its template's ``enable_thinking``);
        None leaves the template's default.
        """
        check_messages(messages)
        uses_tools = bool(tools) or any(m.get("tool_calls") or m["role"] == "tool" for m in messages)
        extra: dict[str, Any] = {}
        if thinking is not None and self.thinks:
            extra["enable_thinking"] = thinking
        if uses_tools and self.supports_tools:
            messages = self.tool_format.hf_messages(messages, tools)
            extra["tools"] = [t.as_openai() for t in tools] if tools else None
        elif uses_tools:
            messages = self.tool_format.fallback_messages(messages, tools or [])
        if self.reasoning_markers == MISTRAL:  # its templates take reasoning as a chunk
            messages = [_thinking_chunks(m) for m in messages]
        if self._compiled is None:
            self._compiled = template_env().from_string(self.chat_template or CHATML)
        try:
            return str(self._compiled.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                             bos_token=self.bos_token or "", eos_token=self.eos_token or "",
                                             **extra))
        except InvalidRequest:
            raise
        except Exception as exc:  # any error raised while rendering is the template's answer
            raise InvalidRequest(f"chat template failed to render these messages: {type(exc).__name__}: {exc}",
                                 param="messages", code="chat_template_error") from exc


def template_env() -> Any:
    """A sandboxed jinja2 environment with what Hugging Face chat templates use (no transformers)."""
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    env.filters["tojson"] = _tojson
    return env


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # as transformers does it: no HTML escaping (a prompt is not HTML), indent/sort_keys options
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def check_messages(messages: Any) -> None:
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("'messages' must be a non-empty list", param="messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise InvalidRequest(f"messages[{i}] needs a role ({', '.join(ROLES)}) and string content",
                                 param=f"messages[{i}]")
        calls = m.get("tool_calls")
        if calls is not None and (m["role"] != "assistant" or not isinstance(calls, list) or not all(
                isinstance(c, dict) and isinstance(c.get("function"), dict)
                and isinstance(c["function"].get("name"), str) for c in calls)):
            raise InvalidRequest(f"messages[{i}].tool_calls must be a list of assistant function calls",
                                 param=f"messages[{i}].tool_calls")


def _thinking_chunks(m: dict[str, Any]) -> dict[str, Any]:
    """An assistant message with ``reasoning_content`` as Mistral's templates take it: content chunks,
    the thinking first."""
    if m.get("role") != "assistant" or not m.get("reasoning_content"):
        return m
    chunks = [{"type": "thinking", "thinking": m["reasoning_content"]}]
    if m.get("content"):
        chunks.append({"type": "text", "text": m["content"]})
    return {k: v for k, v in m.items() if k != "reasoning_content"} | {"content": chunks}


def _raise(message: str) -> None:
    raise InvalidRequest(f"chat template: {message}", param="messages")


def _token_text(v: Any) -> str | None:
    if isinstance(v, dict):
        return v.get("content")
    return v if isinstance(v, str) else None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except ValueError as exc:
        raise ModelError(f"{path} is not valid JSON") from exc
