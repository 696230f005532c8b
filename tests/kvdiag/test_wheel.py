"""The built package works outside the checkout: sdist and wheel carry the bundled suites
and canary, and a fresh venv holding only torch and the wheel runs the commands a new user
runs first, from a directory that is no checkout (`make test-wheel`; minutes, not in
`make test` nor `make test-slow`)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.wheel]
# The same torch as the dev venv (on these machines a CPU build on local disk): a bare
# `torch` requirement would pull a CUDA build.
TORCH = os.environ.get("KVDIAG_WHEEL_TORCH", f"torch=={metadata.version('torch')}")
LIMIT = 1200  # seconds per step: generous, the machine may be shared


def run(args: list, cwd: Path, **kw) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=LIMIT, **kw)


def ok(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert result.returncode == 0, (result.args, result.stdout[-2000:], result.stderr[-3000:])
    return result


@pytest.fixture(scope="module")
def dists(tmp_path_factory) -> dict[str, Path]:
    """The sdist built from the checkout, and the wheel built from that sdist."""
    out = tmp_path_factory.mktemp("dist")
    ok(run([sys.executable, "-c", "import sys; from setuptools import build_meta as b; "
            "b.build_sdist(sys.argv[1])", out], cwd=ROOT))
    sdist = next(out.glob("kvdiag-*.tar.gz"))
    ok(run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", out, sdist], cwd=out))
    return {"sdist": sdist, "wheel": next(out.glob("kvdiag-*.whl"))}


@pytest.fixture(scope="module")
def venv(dists, tmp_path_factory) -> Path:
    """bin/ of a fresh venv holding torch, then the wheel and its dependencies."""
    where = tmp_path_factory.mktemp("venv") / "venv"
    ok(run([sys.executable, "-m", "venv", where], cwd=where.parent))
    pip = [where / "bin" / "python", "-m", "pip", "install", "-q"]
    ok(run([*pip, TORCH], cwd=where.parent))
    ok(run([*pip, dists["wheel"]], cwd=where.parent))
    return where / "bin"


def test_wheel_carries_the_bundled_suites_canary_and_patches_byte_for_byte(dists) -> None:
    with zipfile.ZipFile(dists["wheel"]) as wheel:
        # and llama.cpp's faults and fixes, each a patch its target builds from
        for folder, inside in ((ROOT / "suites", "kvdiag/_bundled/suites"),
                               (ROOT / "fixtures" / "canary", "kvdiag/_bundled/canary"),
                               (ROOT / "kvdiag/engines/llamacpp/patches", "kvdiag/engines/llamacpp/patches"),
                               (ROOT / "kvdiag/engines/llamacpp/fixes", "kvdiag/engines/llamacpp/fixes")):
            files = sorted(p for p in folder.iterdir() if p.is_file())
            assert files
            for path in files:
                shipped = hashlib.sha256(wheel.read(f"{inside}/{path.name}")).hexdigest()
                assert shipped == hashlib.sha256(path.read_bytes()).hexdigest(), path
        sentinel = ROOT / "kvdiag/engines/llamacpp/sentinel.patch"  # every build's first patch
        shipped = wheel.read("kvdiag/engines/llamacpp/sentinel.patch")
        assert hashlib.sha256(shipped).digest() == hashlib.sha256(sentinel.read_bytes()).digest()


def test_installed_commands_work_from_another_directory(venv: Path, tmp_path: Path) -> None:
    kvdiag = venv / "kvdiag"
    where = ok(run([venv / "python", "-c", "import kvdiag; print(kvdiag.__file__)"], tmp_path))
    assert Path(where.stdout.strip()).is_relative_to(venv.parent)  # not the checkout

    generated = json.loads(ok(run([kvdiag, "generate", "--prompt-ids", "1,2,3",
                                   "--max-tokens", "4", "--json"], tmp_path)).stdout)
    assert len(generated["token_ids"]) == 4  # the bundled canary, found without a checkout

    verified = ok(run([kvdiag, "verify", "--expect-guard", "--suite", "smoke"], tmp_path))
    assert "PASS" in verified.stdout + verified.stderr

    ok(run([kvdiag, "reproduce", "--suite", "smoke", "--allocators", "guarded", "--out", "r1",
            "--json"], tmp_path))
    summary = json.loads((tmp_path / "r1" / "summary.json").read_text())
    assert summary["suite"] == "smoke" and summary["verdict"] == "pass"
    assert (tmp_path / "r1" / "report.html").stat().st_size > 0
