"""The canary: a tiny Qwen2 checkpoint whose clean output is known exactly.

It answers questions about facts stated in its context and recites marked lines of it,
through a hand-set induction circuit (see docs/canary.md). `build_canary(out_dir)` writes
it; `fixtures/canary/` holds a built copy.
"""

from __future__ import annotations

from pathlib import Path


def build_canary(out_dir: Path) -> dict[str, str]:
    """Write the canary checkpoint into out_dir; return {file name: sha256 hex}."""
    from kvdiag.canary.build import build_canary as build

    return build(out_dir)


__all__ = ["build_canary"]
