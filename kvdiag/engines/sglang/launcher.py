"""Start and stop a real SGLang server for kvdiag: `sglang-local[:FAULT]` targets, slow tests,
the detection matrix.

    with SglangLocal("fixtures/canary", fault="stale-node", num_blocks=11000) as server:
        ...  # server.base_url, server.served_model, server.version, server.log_path

`python -m sglang.launch_server` from the SGLang env's python (`make sglang-cpu-env`, or
$KVDIAG_SGLANG_PYTHON), on 127.0.0.1 and a free port (kvdiag.engines.process), with the
radix cache on, per-request cached-token counts (--enable-cache-report) and /metrics. Its
radix cache is token-granular here (page size 1), so the pool is given in tokens:
`num_blocks` (of BLOCK_SIZE = 1 token) becomes --max-total-tokens; without it SGLang would
size the pool from free memory. On CPU it needs SGLANG_USE_CPU_ENGINE=1 and the torch_native
attention backend; a CUDA env (its torch sees a device) gets neither. A fault name is handed
to kvdiag's SGLang hook (kvdiag.engines.sglang.plugin, armed in every process of the env by
a .pth file) through KVDIAG_SGLANG_FAULT, with the environment the fault needs.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from kvdiag.engines.process import ServerProcess
from kvdiag.engines.sglang.faults import FAULT_ENV, check_fault, server_env
from kvdiag.errors import KvdiagError

VENV_NAMES = (".venv-sglang-cpu",)  # `make sglang-cpu-env`; KVDIAG_SGLANG_PYTHON points anywhere else


def find_sglang_python() -> str:
    """The python of an env where SGLang serves: $KVDIAG_SGLANG_PYTHON, else .venv-sglang-cpu
    in the working directory or the checkout. KvdiagError (exit 2) names the make target."""
    import subprocess

    from kvdiag.paths import REPO_ROOT

    given = os.environ.get("KVDIAG_SGLANG_PYTHON")
    candidates = [Path(given)] if given else [
        base / name / "bin" / "python" for base in (Path.cwd(), REPO_ROOT) for name in VENV_NAMES]
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('sglang') is None)"
    for python in candidates:
        if python.is_file() and os.access(python, os.X_OK) and subprocess.run(
                [str(python), "-c", probe], capture_output=True, timeout=60).returncode == 0:
            return str(python)
    where = given or ", ".join(str(c) for c in candidates)
    raise KvdiagError(f"no SGLang env ({where}): run `make sglang-cpu-env` or set KVDIAG_SGLANG_PYTHON")


def sglang_available() -> bool:
    """Whether an SGLang env is there (for tests that skip without one)."""
    try:
        find_sglang_python()
    except KvdiagError:
        return False
    return True


class SglangLocal:
    """A real SGLang server for the model in `model_dir`, healthy inside the `with` block.
    Arguments as kvdiag.engines.vllm.launcher.VllmLocal takes them (block_size: the radix
    cache's page size)."""

    BLOCK_SIZE = 1  # tokens per page of SGLang's radix cache on CPU

    def __init__(self, model_dir: str | Path, *, fault: str | None = None, block_size: int = 1,
                 num_blocks: int | None = None, max_model_len: int | None = None,
                 python: str | None = None, log_path: str | Path | None = None,
                 extra_args: tuple[str, ...] = (), device: str | None = None,
                 timeout: float = 900.0, served_model: str | None = None,
                 adapters: dict[str, Path] | None = None) -> None:
        self.fault = check_fault(fault)
        self.model_dir = Path(model_dir).resolve()
        if not (self.model_dir / "config.json").is_file():
            raise KvdiagError(f"{model_dir}: not a model directory (no config.json)")
        if adapters:
            raise KvdiagError("sglang-local serves no LoRA adapter here (SGLang's LoRA on CPU is "
                              "untested): start SGLang yourself with --lora-paths")
        self.python = python or find_sglang_python()
        self.page_size, self.num_blocks, self.max_model_len = block_size, num_blocks, max_model_len
        self.device = device or _device(self.python)
        self.extra_args, self.timeout = tuple(extra_args), timeout
        self.served_model = served_model or self.model_dir.name
        self.log_path = (Path(log_path) if log_path else
                         Path(tempfile.mkdtemp(prefix="kvdiag-sglang-")) / "sglang.log")
        self.port = 0
        self.version: str | None = None
        self._server: ServerProcess | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        args = [self.python, "-m", "sglang.launch_server", "--model-path", str(self.model_dir),
                "--served-model-name", self.served_model, "--host", "127.0.0.1", "--port",
                str(self.port), "--enable-metrics", "--enable-cache-report",
                "--page-size", str(self.page_size)]
        if self.device == "cpu":
            args += ["--device", "cpu", "--attention-backend", "torch_native"]
        if self.num_blocks is not None:
            args += ["--max-total-tokens", str(self.num_blocks * self.page_size)]
        if self.max_model_len is not None:
            args += ["--context-length", str(self.max_model_len)]
        return args + list(self.extra_args)

    def environment(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != FAULT_ENV}
        env |= {"PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        if self.device == "cpu":
            env["SGLANG_USE_CPU_ENGINE"] = "1"  # else the model build imports vLLM's rotary op
        if self.fault:
            env[FAULT_ENV] = self.fault
            env |= server_env(self.fault)
        return env

    def _argv(self, port: int) -> list[str]:
        self.port = port
        return self.command()

    def __enter__(self) -> SglangLocal:
        self._server = ServerProcess("SGLang", self._argv, self.environment(), self.log_path,
                                     timeout=self.timeout)
        self._server.__enter__()
        r = self._server.get("/server_info")
        self.version = r.json().get("version") if r.status_code == 200 else None
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()

    def kill(self) -> None:
        """SIGKILL the whole process group at once, as a crash would."""
        if self._server is not None:
            self._server.kill()

    def log_error(self) -> str | None:
        return self._server.log_error() if self._server else None


def _device(python: str) -> str:
    import subprocess

    probe = "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"
    return "cuda" if subprocess.run([python, "-c", probe], capture_output=True,
                                    timeout=120).returncode == 0 else "cpu"
