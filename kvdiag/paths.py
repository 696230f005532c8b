"""Where the bundled files are: the repository's fixtures/ and suites/ folders."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
FIXTURES = REPO_ROOT / "fixtures"
SUITES = REPO_ROOT / "suites"
CANARY = FIXTURES / "canary"
REPORTS = Path("reports")  # relative to where kvdiag runs
