"""JSON in grammars, the one way every constraint writes it: the style llguidance enforces and a
JSON schema as a Lark ``%json`` body. Shared by engine/guidance.py (response_format) and the
tool-call formats (engine/formats/), which import nothing else from the guidance side."""

from __future__ import annotations

import json
from typing import Any

# JSON the way a person writes it on one line: no free whitespace between tokens, so a model
# cannot pad forever, and the output is stable for the tool-call parsers. (Whitespace inside
# strings is capped per guide, engine/closing.py; a schema's own "x-guidance" wins.)
JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def schema_lark(schema: dict[str, Any]) -> str:
    """A JSON schema as a Lark ``%json`` body, in the one-line style (for embedding in rules)."""
    schema = dict(schema)
    # lenient: a keyword the grammar cannot enforce (propertyNames, ...) loosens the tool's arguments
    # instead of refusing the request; agent clients send tool schemas they do not control
    schema.setdefault("x-guidance", {**JSON_STYLE, "lenient": True})
    return "%json " + json.dumps(schema)
