"""Documents to text, text to chunks.

Parsers: plain text and Markdown (UTF-8, refused when binary), HTML (the stdlib parser,
script/style dropped), PDF (pypdf). Chunking is token-aware: windows of at most
``max_tokens`` tokens of the embedding model's tokenizer, ``overlap`` tokens shared with the
previous window, ending on a sentence or line break when one is near the end, each with its
character offsets in the parsed text.
"""

from __future__ import annotations

import hashlib
import io
import posixpath
import re
from dataclasses import dataclass
from html.parser import HTMLParser
from typing import Any, ClassVar

from ortserve.errors import InvalidRequest

TEXT_TYPES = {".txt", ".md", ".markdown", ".rst", ".text", ".csv", ".json", ".yaml", ".yml", ".toml", ".py",
              ".log"}
HTML_TYPES = {".html", ".htm"}
PDF_TYPES = {".pdf"}
SUPPORTED = TEXT_TYPES | HTML_TYPES | PDF_TYPES
DEFAULT_CHUNK_TOKENS = 200
DEFAULT_OVERLAP_TOKENS = 40
_NAME_RE = re.compile(r"^[^\x00-\x1f/\\:*?\"<>|]{1,255}$")


class UnsupportedFile(InvalidRequest):
    code = "unsupported_file"


@dataclass(frozen=True)
class Chunk:
    index: int
    text: str
    start: int       # character offsets in the parsed text
    end: int
    tokens: int

    @property
    def hash(self) -> str:
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()


def safe_filename(name: str | None, param: str = "file") -> str:
    """A plain file name: no directories, no '..', no control characters (else a 400)."""
    if not name:
        raise InvalidRequest("the uploaded file has no name", param=param)
    if "/" in name or "\\" in name or name in (".", "..") or name.startswith("..") or not _NAME_RE.match(name):
        raise InvalidRequest(f"file name {name!r} is not allowed: give a plain name without directories, "
                             "'..' or control characters", param=param, code="invalid_file_name")
    return name


def extension(name: str) -> str:
    return posixpath.splitext(name.lower())[1]


def parse(name: str, data: bytes, param: str = "file") -> str:
    """The text of a document, by its extension; a clear 400 for what cannot be read."""
    ext = extension(name)
    if ext not in SUPPORTED:
        raise UnsupportedFile(f"{name}: unsupported file type {ext or '(none)'!r}; supported: "
                              f"{', '.join(sorted(SUPPORTED))}", param=param)
    if not data.strip():
        raise InvalidRequest(f"{name} is empty", param=param, code="empty_file")
    if ext in PDF_TYPES:
        text = _pdf_text(name, data, param)
    else:
        text = _decode_text(name, data, param)
        if ext in HTML_TYPES:
            text = html_text(text)
    if not text.strip():
        raise InvalidRequest(f"{name} has no text to index", param=param, code="empty_file")
    return text


def _decode_text(name: str, data: bytes, param: str) -> str:
    head = data[:8192]
    if b"\x00" in head:
        raise UnsupportedFile(f"{name} is binary, not text (it contains NUL bytes)", param=param)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise UnsupportedFile(f"{name} is not UTF-8 text (invalid byte at offset {exc.start})", param=param) \
            from None
    controls = sum(1 for c in text[:8192] if ord(c) < 32 and c not in "\t\n\r\f")
    if controls > 0.05 * min(len(text), 8192):
        raise UnsupportedFile(f"{name} looks binary ({controls} control characters)", param=param)
    return text.replace("\r\n", "\n")


def _pdf_text(name: str, data: bytes, param: str) -> str:
    from pypdf import PdfReader
    from pypdf.errors import PyPdfError

    if not data.startswith(b"%PDF"):
        raise UnsupportedFile(f"{name} is not a PDF (no %PDF header)", param=param)
    try:
        reader = PdfReader(io.BytesIO(data))
        return "\n\n".join((page.extract_text() or "") for page in reader.pages)
    except (PyPdfError, ValueError, KeyError, TypeError) as exc:
        raise UnsupportedFile(f"{name}: the PDF cannot be read ({exc})", param=param) from None


class _HTMLText(HTMLParser):
    BLOCK: ClassVar[set[str]] = {"p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "section", "article", "pre",
             "table", "ul", "ol", "blockquote", "title"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.skip = 0

    def handle_starttag(self, tag: str, attrs: Any) -> None:
        if tag in ("script", "style", "noscript", "template"):
            self.skip += 1
        elif tag in self.BLOCK:
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in ("script", "style", "noscript", "template"):
            self.skip = max(0, self.skip - 1)
        elif tag in self.BLOCK:
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        if not self.skip:
            self.parts.append(data)


def html_text(html: str) -> str:
    p = _HTMLText()
    p.feed(html)
    p.close()
    text = re.sub(r"[ \t]+", " ", "".join(p.parts))
    return re.sub(r"\n\s*\n+", "\n\n", text).strip()


# ---- chunking -------------------------------------------------------------------

def chunk_text(text: str, tokenizer: Any, max_tokens: int = DEFAULT_CHUNK_TOKENS,
               overlap: int = DEFAULT_OVERLAP_TOKENS) -> list[Chunk]:
    """Token windows with overlap, cut at a sentence/line end in the window's last third if any."""
    if overlap >= max_tokens:
        raise InvalidRequest("chunk overlap must be smaller than the chunk size", param="chunking_strategy")
    enc = tokenizer.encode(text, add_special_tokens=False)
    offsets = [o for o in enc.offsets]
    n = len(offsets)
    chunks: list[Chunk] = []
    i = 0
    while i < n:
        end = min(n, i + max_tokens)
        if end < n:
            end = _break_point(text, offsets, i, end)
        start_c, end_c = offsets[i][0], offsets[end - 1][1]
        piece = text[start_c:end_c].strip()
        if piece:
            chunks.append(Chunk(len(chunks), piece, start_c, end_c, end - i))
        if end >= n:
            break
        nxt = max(i + 1, end - overlap)
        while nxt > i + 1 and _mid_word(text, offsets[nxt][0]):
            nxt -= 1      # start the next window on a word, not inside one (word-piece tokens)
        i = nxt
    return chunks


def _mid_word(text: str, pos: int) -> bool:
    return 0 < pos < len(text) and text[pos - 1].isalnum() and text[pos].isalnum()


def _break_point(text: str, offsets: list[tuple[int, int]], start: int, end: int) -> int:
    """The last token in the window's last third that ends a sentence or a line (else ``end``)."""
    floor = start + (end - start) * 2 // 3
    for j in range(end - 1, floor, -1):
        a, b = offsets[j]
        tail = text[a:b]
        nxt = text[b:b + 1]
        if tail.endswith((".", "!", "?", ":")) and (nxt in ("", " ", "\n")) or nxt == "\n":
            return j + 1
    return end
