"""``tool_choice: "required"`` on each family's random GGUF (issue 46's target): parseable calls in
N seeded requests at max_tokens 64, per family, as JSON.

    .venv/bin/python benchmarks/tool_required.py [--seeds 100] [--named]

The files are tests/integration/family_models.py's (imported once, cached under the test cache).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from servers import ServerThread
from tests.integration.family_models import FAMILIES, imported_family
from tests.integration.required_calls import NAMED, count


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=100)
    ap.add_argument("--named", action="store_true", help="a named tool instead of required")
    args = ap.parse_args()
    out = {}
    for name in FAMILIES:
        with ServerThread(imported_family(name), model_id=name) as s:
            got, bad = count(s.url, name, range(args.seeds), NAMED if args.named else "required")
        out[name] = {"parseable_calls": got, "requests": args.seeds, "failures": bad[:5]}
        print(json.dumps({name: out[name]}), file=sys.stderr)
    print(json.dumps({"benchmark": "tool_required", "max_tokens": 64, "named": args.named, "families": out}))


if __name__ == "__main__":
    main()
