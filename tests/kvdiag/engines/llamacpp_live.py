"""What the live llama.cpp tests share: their marks (skipped without the build), SmolLM2's
GGUF, and a probe run as a user runs it. test_llamacpp_live.py holds the stock build,
test_llamacpp_fixes_live.py the fixes and the plant written on them,
test_llamacpp_plants_live.py the other planted faults: a CI rotation slot each."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kvdiag.engines.llamacpp.build import installed, stock_server
from kvdiag.errors import KvdiagError


def _there(find) -> bool:
    try:
        find()
    except KvdiagError:
        return False
    return True


MARKS = [pytest.mark.slow, pytest.mark.llamacpp_live,
         pytest.mark.skipif(not _there(stock_server), reason="no llama-server: make llamacpp-env")]
# a planted fault's binary is built from the sdist's tree; the stock build is not needed
PLANT_MARKS = [pytest.mark.slow, pytest.mark.llamacpp_live,
               pytest.mark.skipif(not _there(installed), reason="no llama.cpp tree: make llamacpp-src")]


def gguf_or_skip():
    from kvdiag.models.gguf_import import packaged_gguf

    try:
        return packaged_gguf()
    except KvdiagError as e:
        pytest.skip(f"{e} (make real-model)")


def probe(target: str, out, *extra: str) -> tuple[subprocess.CompletedProcess, dict | None]:
    run = subprocess.run([sys.executable, "-m", "kvdiag", "probe", "--target", target,
                          "--suite", "natural", "--out", str(out), "--json", *extra],
                         capture_output=True, text=True, timeout=1800)
    try:
        return run, json.loads(run.stdout)
    except json.JSONDecodeError:
        return run, None
