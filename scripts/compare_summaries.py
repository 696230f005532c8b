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


def normalized(path: str, added: set[str] = frozenset()) -> str:
    """The summary with MASKED keys and `added` keys dropped, paths cut to their last part."""
    summary = json.loads(Path(path).read_text())
    for key in (*MASKED, *added):
        summary.pop(key, None)
    for key in PATHS:
        if isinstance(summary.get(key), str):
            summary[key] = Path(summary[key]).name  # where the bundled files live may move
    return json.dumps(summary, indent=2) + "\n"  # key order kept: byte-identical means that too


def added_keys(old: str, new: str) -> set[str]:
    """Top-level keys NEW has and OLD lacks, when NEW was written by a newer schema version
    (fields may be added, none renamed: docs/architecture.md)."""
    a, b = (json.loads(Path(p).read_text()) for p in (old, new))
    if int(b.get("schema_version", 1)) <= int(a.get("schema_version", 1)):
        return set()
    return set(b) - set(a)


def main(old: str, new: str) -> int:
    added = added_keys(old, new)
    a, b = normalized(old), normalized(new, added)
    if a == b:
        also = f"; keys schema {json.loads(Path(new).read_text())['schema_version']} adds: " \
               f"{', '.join(sorted(added))}" if added else ""
        print(f"identical ({len(a)} bytes after masking {', '.join(MASKED)}{also})")
        return 0
    sys.stdout.writelines(difflib.unified_diff(a.splitlines(True), b.splitlines(True), old, new))
    return 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
