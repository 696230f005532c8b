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

from pathlib import Path

from kvdiag.engines.server import PREFILL_CHUNK, EngineServer, find_engine_python, torch_sees_cuda
from kvdiag.engines.sglang import cpu_lora
from kvdiag.engines.sglang.faults import FAULT_ENV, check_fault, server_env
from kvdiag.engines.spec import ENGINES
from kvdiag.errors import KvdiagError

SPEC = ENGINES["sglang"]  # its name in messages, its log
WAIT_TIMEOUT_ENV = "SGLANG_REQUEST_STATE_WAIT_TIMEOUT"  # SGLang's: seconds between disconnect checks
VENV_NAMES = (".venv-sglang-cpu",)  # `make sglang-cpu-env`; KVDIAG_SGLANG_PYTHON points anywhere else


def find_sglang_python() -> str:
    """The python of an env where SGLang serves: $KVDIAG_SGLANG_PYTHON, else .venv-sglang-cpu
    in the working directory or the checkout. KvdiagError (exit 2) names the make target."""
    return find_engine_python("sglang", "KVDIAG_SGLANG_PYTHON", VENV_NAMES, "sglang-cpu-env", "SGLang")


def sglang_available() -> bool:
    """Whether an SGLang env is there (for tests that skip without one)."""
    try:
        find_sglang_python()
    except KvdiagError:
        return False
    return True


class SglangLocal(EngineServer):
    """A real SGLang server for the model in `model_dir`, healthy inside the `with` block.
    Arguments as kvdiag.engines.vllm.launcher.VllmLocal takes them (block_size: the radix
    cache's page size)."""

    BLOCK_SIZE = 1  # tokens per page of SGLang's radix cache on CPU
    NAME, VERSION_PATH, LOG_NAME, FAULT_ENV = SPEC.label, "/server_info", SPEC.log_name, FAULT_ENV
    find_python = staticmethod(find_sglang_python)

    def __init__(self, model_dir: str | Path, *, fault: str | None = None, block_size: int = 1,
                 num_blocks: int | None = None, max_model_len: int | None = None,
                 python: str | None = None, log_path: str | Path | None = None,
                 extra_args: tuple[str, ...] = (), device: str | None = None,
                 timeout: float = 900.0, served_model: str | None = None,
                 adapters: dict[str, Path] | None = None, sentinel: str | Path | None = None) -> None:
        fault = check_fault(fault)
        super().__init__(model_dir, fault=fault, python=python, log_path=log_path,
                         extra_args=extra_args, timeout=timeout, served_model=served_model,
                         sentinel=sentinel)
        self.page_size, self.num_blocks, self.max_model_len = block_size, num_blocks, max_model_len
        self.adapters = dict(adapters or {})
        self.device = device or ("cuda" if torch_sees_cuda(self.python) else "cpu")

    def command(self) -> list[str]:
        args = [self.python, "-m", "sglang.launch_server", "--model-path", str(self.model_dir),
                "--served-model-name", self.served_model, "--host", "127.0.0.1", "--port",
                str(self.port), "--enable-metrics", "--enable-cache-report",
                "--page-size", str(self.page_size),
                # SGLang reports it in /server_info
                "--chunked-prefill-size", str(PREFILL_CHUNK)]
        if self.device == "cpu":
            args += ["--device", "cpu", "--attention-backend", "torch_native"]
        if self.num_blocks is not None:
            args += ["--max-total-tokens", str(self.num_blocks * self.page_size)]
        if self.max_model_len is not None:
            args += ["--context-length", str(self.max_model_len)]
        if self.adapters:  # a request selects one by lora_path (sglang/protocol.py); SGLang reads the ranks
            args += ["--enable-lora", "--lora-paths",
                     *(f"{name}={Path(path).resolve()}" for name, path in self.adapters.items())]
            if self.device == "cpu":  # the one backend of SGLang's that computes on a CPU
                args += ["--lora-backend", "torch_native"]
        return args + list(self.extra_args)

    def environment(self) -> dict[str, str]:
        env = self.base_environment()
        if self.device == "cpu":
            env["SGLANG_USE_CPU_ENGINE"] = "1"  # else the model build imports vLLM's rotary op
            if self.adapters:  # SGLang's LoRA pins host memory, which a CPU cannot (cpu_lora.py)
                env[cpu_lora.ENV] = "1"
        # SGLang notices a client gone (and aborts its request) only when it polls, every
        # SGLANG_REQUEST_STATE_WAIT_TIMEOUT s (4 by default): at 1 s a cancel lands in the
        # middle of a prefill a few chunks long (the cancel-prefill event)
        env.setdefault(WAIT_TIMEOUT_ENV, "1")
        if self.fault:
            env |= server_env(self.fault)
        return env
