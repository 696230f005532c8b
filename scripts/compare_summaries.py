"""Compare two summary.json files byte for byte, with what may differ between two runs of
the same build masked: timestamps and wall times, the command line, the environment block,
and the keys newer schema versions add. Paths are compared by their last part (two
checkouts live in different folders). Exit 0 when the rest is byte-identical.

    python scripts/compare_summaries.py OLD/summary.json NEW/summary.json
"""

from __future__ import annotations

import difflib
import json
import sys
from pathlib import Path

MASKED = ("created", "wall_seconds", "seconds", "command", "environment", "schema_version", "kind")
PATHS = ("model", "suite_path")


def normalized(path: str) -> str:
    summary = json.loads(Path(path).read_text())
    for key in MASKED:
        summary.pop(key, None)
    for key in PATHS:
        if isinstance(summary.get(key), str):
            summary[key] = Path(summary[key]).name  # where the bundled files live may move
    return json.dumps(summary, indent=2) + "\n"  # key order kept: byte-identical means that too


def main(old: str, new: str) -> int:
    a, b = normalized(old), normalized(new)
    if a == b:
        print(f"identical ({len(a)} bytes after masking {', '.join(MASKED)})")
        return 0
    sys.stdout.writelines(difflib.unified_diff(a.splitlines(True), b.splitlines(True), old, new))
    return 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
