"""What a run writes to disk can be trusted: output paths are checked before any work (as a
user whom file modes bind: root with CAP_DAC_OVERRIDE dropped), secrets never reach disk,
and an unfinished run never reads as a verdict."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvdiag.cli import app
from kvdiag.paths import REPO_ROOT
from tests.kvdiag.commands.test_regress import TINY
from tests.kvdiag.serving import served

pytestmark = pytest.mark.e2e  # starts a server, a CLI subprocess or a browser

CAPSH = shutil.which("capsh")
needs_capsh = pytest.mark.skipif(CAPSH is None or os.geteuid() != 0,
                                 reason="needs root and capsh to drop CAP_DAC_OVERRIDE")


def _as_bound_user(*args: str) -> subprocess.CompletedProcess:
    """`kvdiag ARGS` with file modes enforced even for root."""
    line = " ".join([sys.executable, "-m", "kvdiag", *args])
    return subprocess.run([CAPSH, "--drop=cap_dac_override,cap_dac_read_search", "--", "-c", line],
                          capture_output=True, text=True, cwd=REPO_ROOT, timeout=300)


@pytest.fixture
def read_only(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    yield ro
    ro.chmod(0o755)


@needs_capsh
@pytest.mark.parametrize("option", ["--out", "--history", "--junit"])
def test_unwritable_paths_fail_before_any_work(read_only, tmp_path, option):
    paths = {"--out": tmp_path / "run", "--history": tmp_path / "h.sqlite", "--junit": tmp_path / "j.xml"}
    paths[option] = read_only / ("run" if option == "--out" else "file")
    run = _as_bound_user("regress", "--suite", "smoke", "--target", "reference:guarded",
                         *(w for flag, path in paths.items() for w in (flag, str(path))))
    assert run.returncode == 2, run.stderr
    assert "cannot write there" in run.stderr and "Traceback" not in run.stderr
    assert "PagedAttention" not in run.stderr  # no engine was built: nothing was measured
    assert len(run.stderr.strip().splitlines()) == 1


@needs_capsh
def test_probe_out_under_a_regular_file_fails_before_contacting_anyone(tmp_path):
    plain = tmp_path / "plain"
    plain.write_text("")
    run = _as_bound_user("probe", "--base-url", "http://127.0.0.1:9", "--model", "m",
                         "--out", str(plain / "run"))
    assert run.returncode == 2 and "cannot write there" in run.stderr, run.stderr


def test_out_never_overwrites_and_an_unreachable_probe_leaves_nothing(tmp_path):
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "summary.json").write_text("{}")
    refused = CliRunner().invoke(app, ["reproduce", "--suite", "smoke", "--out", str(taken)])
    assert refused.exit_code == 2 and "never overwrites" in refused.output
    dead = CliRunner().invoke(app, ["probe", "--base-url", "http://127.0.0.1:9", "--model", "m",
                                    "--suite", "smoke", "--out", str(tmp_path / "p")])
    assert dead.exit_code == 2
    assert not (tmp_path / "p").exists() and not (tmp_path / "p.partial").exists()


@pytest.mark.slow  # ~60 s: two live servers and two regress runs
def test_api_keys_never_reach_disk(tmp_path):
    """Against a server that requires a key: given by flag, then by environment variable;
    no file the runs wrote (run directories, history, JUnit) holds either key."""
    flag_key, env_key = "sk-flag-3f1a9c", "sk-env-77b2d0"
    suite = tmp_path / "tiny.yaml"
    suite.write_text(TINY)
    common = ["--suite", str(suite), "--model", "canary", "--history", str(tmp_path / "h.sqlite"),
              "--junit", str(tmp_path / "j.xml")]
    runner = CliRunner()
    with served("--allocator", "guarded", "--max-model-len", "2048",
                env={"KVDIAG_API_KEY": flag_key}) as (url, _):
        by_flag = runner.invoke(app, ["regress", "--target", url, "--api-key", flag_key,
                                      "--out", str(tmp_path / "a"), *common])
    with served("--allocator", "guarded", "--max-model-len", "2048",
                env={"KVDIAG_API_KEY": env_key}) as (url, _):
        by_env = runner.invoke(app, ["regress", "--target", url, "--out", str(tmp_path / "b"), *common],
                               env={"OPENAI_API_KEY": env_key})
    assert by_flag.exit_code == 0, by_flag.output
    assert by_env.exit_code == 0, by_env.output
    written = [p for p in Path(tmp_path).rglob("*") if p.is_file()]
    assert any(p.name == "report.html" for p in written) and any(p.suffix == ".sqlite" for p in written)
    for path in written:
        data = path.read_bytes()
        assert flag_key.encode() not in data and env_key.encode() not in data, path
    assert "--api-key '***'" in (tmp_path / "a" / "summary.json").read_text()  # shlex-quoted
