"""Where the bundled files are, in a checkout and in an installed wheel alike.

The suites and the canary live where users see them, in the checkout's `suites/` and
`fixtures/canary/`. `kvdiag/_bundled/` holds relative symlinks to those two folders, so
that setuptools ships them as package data (the wheel and the sdist hold real copies) and
the same two paths below work in a checkout, an editable install and a wheel.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
BUNDLED = PACKAGE / "_bundled"
SUITES = BUNDLED / "suites"
CANARY = BUNDLED / "canary"
# The checkout root: meaningful only when kvdiag runs from a checkout (tests, scripts);
# nothing that an installed kvdiag needs may live only here.
REPO_ROOT = PACKAGE.parent
REPORTS = Path("reports")  # relative to where kvdiag runs


def cache_root() -> Path:
    """$XDG_CACHE_HOME/kvdiag (default ~/.cache/kvdiag): what kvdiag builds once and keeps
    (the contiguous reference's turns, imported models, the canary's LoRA adapter)."""
    import os

    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kvdiag"
