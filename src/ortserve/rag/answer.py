"""Answers from a store: the retrieved chunks as numbered sources, and their citations.

A citation is plain JSON (the same over HTTP and in the CLI's --json):
``{"index": 1, "file_id": "...", "filename": "...", "chunk_index": 3, "start": 120, "end": 980,
"score": 0.97}``; ``index`` is the number the answer cites as ``[1]``.
"""

from __future__ import annotations

from typing import Any

INSTRUCTIONS = ("Answer the question using only the numbered sources below, and cite the sources you "
                "used like [1]. If the sources do not contain the answer, say that you do not know.")


def context_message(hits: list[dict[str, Any]]) -> dict[str, str]:
    """One system message: the instructions, then each source with its file and chunk."""
    parts = [INSTRUCTIONS]
    for i, h in enumerate(hits, 1):
        parts.append(f"[{i}] ({h['filename']}, chunk {h['chunk_index']})\n{h['content'][0]['text']}")
    return {"role": "system", "content": "\n\n".join(parts)}


def with_context(messages: list[dict[str, str]], hits: list[dict[str, Any]]) -> list[dict[str, str]]:
    return [context_message(hits), *messages]


def citations(hits: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"index": i, "file_id": h["file_id"], "filename": h["filename"], "chunk_index": h["chunk_index"],
             "start": h["start"], "end": h["end"], "score": h["score"]} for i, h in enumerate(hits, 1)]


def last_user_text(messages: list[dict[str, str]]) -> str:
    for m in reversed(messages):
        if m.get("role") == "user" and m.get("content", "").strip():
            return m["content"]
    return ""
