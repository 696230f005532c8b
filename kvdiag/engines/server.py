"""What every real engine kvdiag starts shares (vllm/launcher.py, sglang/launcher.py): the env
it runs from, the model directory check, the log file, a free loopback port, the start with
its version asked, and the stop. A launcher adds its command line and its environment.

    class XLocal(EngineServer):
        NAME, VERSION_PATH, LOG_NAME, FAULT_ENV = "X", "/version", "x.log", "KVDIAG_X_FAULT"
        find_python = staticmethod(find_x_python)     # the env it runs from
        def command(self) -> list[str]: ...       # argv, on self.port
        def environment(self) -> dict[str, str]: ...  # base_environment() plus its own
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from kvdiag.engines.process import ServerProcess
from kvdiag.errors import KvdiagError

OFFLINE = {"PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}

# the prefill chunk kvdiag starts a local engine with (vLLM's --max-num-batched-tokens, SGLang's
# --chunked-prefill-size): shorter than the smoke suite's prompts, so the probe's chunked-prefill
# traffic reaches a prefill that takes several steps
PREFILL_CHUNK = 512


def find_engine_python(module: str, env_var: str, venv_names: tuple[str, ...], make_target: str,
                       name: str) -> str:
    """The python of an env where `module` imports: $env_var, else one of `venv_names` in the
    working directory or the checkout. KvdiagError (exit 2) names the make target."""
    from kvdiag.paths import REPO_ROOT

    given = os.environ.get(env_var)
    candidates = [Path(given)] if given else [
        base / venv / "bin" / "python" for base in (Path.cwd(), REPO_ROOT) for venv in venv_names]
    probe = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"
    for python in candidates:
        if python.is_file() and os.access(python, os.X_OK) and subprocess.run(
                [str(python), "-c", probe], capture_output=True, timeout=60).returncode == 0:
            return str(python)
    where = given or ", ".join(str(c) for c in candidates)
    raise KvdiagError(f"no {name} env ({where}): run `make {make_target}` or set {env_var}")


def torch_sees_cuda(python: str) -> bool:
    """Whether that env's torch sees a CUDA device (a GPU build on a GPU machine)."""
    probe = "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"
    return subprocess.run([python, "-c", probe], capture_output=True, timeout=120).returncode == 0


class EngineServer:
    """A real engine's server for the model in `model_dir`, healthy inside the `with` block:
    `base_url`, `served_model`, `version` (asked at VERSION_PATH once healthy), `log_path`."""

    NAME = "engine"
    VERSION_PATH, VERSION_KEY = "/version", "version"  # where its version is asked, and read
    LOG_NAME = "engine.log"
    FAULT_ENV = ""  # the variable a fault name reaches the engine's kvdiag hook by
    SIZED = True  # its pool is sized from the suite's blocks (engines/local.py)
    ERROR_LINE = r"[\w.]*(Error|Exception)\b.*:"  # how its log's reason line starts (Python's)

    def __init__(self, model_dir: str | Path, *, fault: str | None, python: str | None,
                 log_path: str | Path | None, extra_args: tuple[str, ...], timeout: float,
                 served_model: str | None, sentinel: str | Path | None = None) -> None:
        self.fault = fault
        self.sentinel = None if sentinel is None else Path(sentinel).resolve()
        self.model_dir = self.check_model(Path(model_dir))
        self.python = python or self.find_python()
        self.extra_args, self.timeout = tuple(extra_args), timeout
        self.served_model = served_model or self.model_dir.name
        self.log_path = (Path(log_path) if log_path else
                         Path(tempfile.mkdtemp(prefix=f"kvdiag-{self.NAME.lower()}-")) / self.LOG_NAME)
        self.port = 0
        self.version: str | None = None
        self._server: ServerProcess | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @staticmethod
    def find_python() -> str:
        """The engine's interpreter (or binary); KvdiagError naming the make target that
        installs it. Default: kvdiag's own (the reference server runs from it)."""
        return sys.executable

    @staticmethod
    def default_model() -> Path:
        """The model a run that names none serves: the bundled canary."""
        from kvdiag.paths import CANARY

        return Path(CANARY)

    @staticmethod
    def check_model(model: Path) -> Path:
        """The model as the engine loads it (a Hugging Face directory here), resolved;
        KvdiagError when it is not one."""
        if not (model / "config.json").is_file():
            raise KvdiagError(f"{model}: not a model directory (no config.json)")
        return model.resolve()

    def command(self) -> list[str]:
        raise NotImplementedError

    def environment(self) -> dict[str, str]:
        return self.base_environment()

    def base_environment(self) -> dict[str, str]:
        """This process's environment without a fault or a sentinel of ours, offline,
        unbuffered; the fault named when one is planted, the sentinel's file when it is on."""
        from kvdiag.sentinel.log import ENV

        env = {k: v for k, v in os.environ.items() if k not in (self.FAULT_ENV, ENV)} | OFFLINE
        if self.fault:
            env[self.FAULT_ENV] = self.fault
        if self.sentinel is not None:
            env[ENV] = str(self.sentinel)
        return env

    def _argv(self, port: int) -> list[str]:
        self.port = port
        return self.command()

    def __enter__(self):
        self._server = ServerProcess(self.NAME, self._argv, self.environment(), self.log_path,
                                     timeout=self.timeout, error_line=self.ERROR_LINE)
        self._server.__enter__()
        r = self._server.get(self.VERSION_PATH)
        self.version = (r.json().get(self.VERSION_KEY) or None) if r.status_code == 200 else None
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()

    def kill(self) -> None:
        """SIGKILL the server's whole process group at once, as a crash would (for tests of
        a server that dies mid-run; stop() is the clean way)."""
        if self._server is not None:
            self._server.kill()

    def log_tail(self, lines: int = 15) -> str:
        return self._server.log_tail(lines) if self._server else ""

    def log_error(self) -> str | None:
        return self._server.log_error() if self._server else None
