"""describe_environment: versions from installed metadata, git commit only from a checkout."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from kvdiag.record.environment import describe_environment, git_commit

pytestmark = pytest.mark.e2e  # starts a server, a CLI subprocess or a browser

ROOT = Path(__file__).resolve().parents[2]


def test_block_names_the_installed_versions_and_is_json() -> None:
    env = describe_environment()
    json.loads(env.model_dump_json())  # summary.json must hold it as is
    assert env.packages["kvdiag"] == metadata.version("kvdiag")
    assert env.packages["torch"] == metadata.version("torch")
    assert env.packages["sacrebleu"] == metadata.version("sacrebleu")
    assert env.python == ".".join(map(str, sys.version_info[:3]))
    assert "vllm" not in env.packages
    assert describe_environment(engine=("llamacpp", "b11434")).packages["llamacpp"] == "b11434"
    missing = describe_environment(spacy_model="xx_no_such_model").spacy_models
    assert missing["xx_no_such_model"] is None


def test_git_commit_in_a_checkout_and_none_outside(tmp_path: Path) -> None:
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True, check=True).stdout.strip()
    assert git_commit(ROOT).commit == head
    assert git_commit(tmp_path) is None


def test_describing_is_cheap_on_imports() -> None:
    code = ("import sys; from kvdiag.record.environment import describe_environment; "
            "describe_environment(); "
            "print(sorted(m for m in ('torch', 'spacy', 'transformers', 'matplotlib') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
