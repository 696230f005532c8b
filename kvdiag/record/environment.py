"""What a run ran on: package versions, platform, CPU and git commit, as one typed block.

summary.json carries it as its `environment` block (Environment, read by attribute), so a
result says how it was made (as sacrebleu's signatures do) without the reader rerunning
anything. Cheap by contract: package versions come from installed metadata
(importlib.metadata), nothing heavy is imported, and the git commit costs one `git` call
that may fail silently.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

# distribution name -> key in the block; absent packages are reported as None
PACKAGES = {"kvdiag": "kvdiag", "torch": "torch", "transformers": "transformers",
            "spacy": "spacy", "sacrebleu": "sacrebleu"}


class GitCommit(BaseModel):
    """The checkout kvdiag ran from: its short commit and whether tracked files had changes."""

    model_config = ConfigDict(extra="ignore")
    commit: str = ""
    dirty: bool = False


class Environment(BaseModel):
    """summary.json's `environment`: provenance, read by the page only. Every field has a
    default (an older summary, or one never stamped, lacks some); a key not declared here is
    kept as it was written (extra="allow"), since provenance is never dropped."""

    model_config = ConfigDict(extra="allow")
    packages: dict[str, str | None] = Field(
        default_factory=dict, description="distribution -> version (None: not installed), "
        "kvdiag's own dependencies and the engine the run measured")
    spacy_models: dict[str, str | None] = Field(
        default_factory=dict, description="spaCy model -> version (None: asked for, not installed)")
    python: str | None = Field(None, description="the Python version, e.g. 3.11.7")
    implementation: str | None = Field(None, description="sys.implementation.name, e.g. cpython")
    platform: str | None = Field(None, description="platform.platform()")
    machine: str | None = Field(None, description="platform.machine(), e.g. x86_64")
    cpu: str | None = Field(None, description="the CPU's model name ('' where unknown)")
    cpu_count: int | None = Field(None, description="os.cpu_count()")
    git: GitCommit | None = Field(None, description="kvdiag's checkout; None: an installed wheel")


def describe_environment(*, engine: tuple[str, str] | None = None,
                         spacy_model: str | None = None) -> Environment:
    """The environment block of this process (Environment).

    `engine`: (name, version) of the engine the run measured (a live server reports its
    own; vllm for the in-process audit), added as packages[name]; omitted when None. `spacy_model`: the model name the fact checker was
    asked for; listed with its version, or None when it is not installed (the checker then
    falls back to a blank pipeline). Every installed spaCy model is listed as well.
    """
    packages = {key: _version(dist) for dist, key in PACKAGES.items()}
    if engine is not None:
        packages[engine[0]] = engine[1]
    models = installed_spacy_models()
    if spacy_model:
        models.setdefault(spacy_model, _version(spacy_model))
    return Environment(packages=packages, spacy_models=models,
                       python=platform.python_version(), implementation=sys.implementation.name,
                       platform=platform.platform(), machine=platform.machine(), cpu=cpu_model(),
                       cpu_count=os.cpu_count(),
                       git=git_commit(Path(__file__).resolve().parents[2]))


def installed_spacy_models() -> dict[str, str | None]:
    """name -> version of spaCy model packages (they register the `spacy_models` entry point)."""
    found = {}
    for entry in metadata.entry_points(group="spacy_models"):
        dist = getattr(entry, "dist", None)
        found[entry.name] = dist.version if dist is not None else _version(entry.name)
    return found


def cpu_model() -> str:
    """The CPU's model name (Linux /proc/cpuinfo), else platform.processor(), else ''."""
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.lower().startswith(("model name", "hardware", "cpu model")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or ""


def git_commit(where: Path) -> GitCommit | None:
    """The short sha and whether tracked files changed (GitCommit) when `where` is inside a
    git checkout, else None.

    None too when git is absent or slow: describing a run must never fail the run.
    """
    if not (where / ".git").exists():  # an installed wheel: site-packages is no checkout
        return None
    try:
        sha = _git(where, "rev-parse", "--short", "HEAD")
        status = _git(where, "status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return None
    return GitCommit(commit=sha.strip(), dirty=bool(status.strip()))


def _git(where: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(where), *args], capture_output=True, text=True,
                          check=True, timeout=5).stdout


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None
