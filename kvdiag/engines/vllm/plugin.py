"""kvdiag's vLLM general plugin (entry point group `vllm.general_plugins`): plants the fault
that $KVDIAG_VLLM_FAULT names (plants/), as a positive control for kvdiag's probe, and turns
the sentinel on (kvdiag.engines.vllm.sentinel) when $KVDIAG_SENTINEL names its file, with the
attention its wrong slots drew (attention.py; when $KVDIAG_SENTINEL_ATTENTION is 1), and makes
vLLM's CPU LoRA ops skip base-model tokens (cpu_lora.py) when $KVDIAG_VLLM_CPU_LORA is 1, and
supplies the CPU pieces of Mamba2 prefix caching (cpu_mamba.py) when $KVDIAG_VLLM_CPU_MAMBA is 1;
inert without any.

vLLM calls `register()` in every process it starts (API server, engine core, workers), so
every process logs one line naming the planted fault: no one mistakes a planted server for
a healthy one. An unknown name logs an error and raises, and vLLM does not start. Imports
nothing of kvdiag beyond engines/vllm and kvdiag.errors (vLLM's env holds kvdiag --no-deps).
"""

from __future__ import annotations

import logging
import os

from kvdiag.engines.vllm.catalog import FAULTS, parse
from kvdiag.engines.vllm.faults import FAULT_ENV

log = logging.getLogger("kvdiag.vllm_plugin")
_planted: set[str] = set()
_watching: list[str] = []
_armed: set[str] = set()  # the CPU workarounds installed in this process, by their env name


def _sentinel() -> None:
    """The sentinel, once per process, when asked for. A vLLM it cannot read raises, and
    vLLM does not start: never a silent sentinel."""
    from kvdiag.sentinel.log import ENV

    path = os.environ.get(ENV, "").strip()
    if not path or _watching:
        return
    from kvdiag.engines.vllm.sentinel import install

    install(path)
    _watching.append(path)
    log.warning("kvdiag: SENTINEL on in this vLLM (pid %d): every KV read checked, findings "
                "in %s", os.getpid(), path)
    from kvdiag.sentinel.leakage import asked

    if asked():  # leakage: the attention sampled tokens paid to slots read wrong
        from kvdiag.engines.vllm import attention

        try:
            attention.install()
        except ImportError as e:  # no CPU attention backend in this vLLM: leakage unmeasured
            log.warning("kvdiag: attention leakage not measured in this vLLM (pid %d): %s",
                        os.getpid(), e)
    from kvdiag.sentinel.serve import serve_if_asked

    if (addr := serve_if_asked(path)) is not None:  # the file over HTTP too
        log.warning("kvdiag: the sentinel's file served at http://%s/ (pid %d)", addr, os.getpid())


def _workarounds() -> None:
    """The CPU workarounds the launcher asked for ($ENV=1 each), once per process: vLLM's
    CPU LoRA ops made to skip base-model tokens (cpu_lora.py, vLLM PR #48421), and the CPU
    pieces of Mamba2 prefix caching (cpu_mamba.py)."""
    from kvdiag.engines.vllm import cpu_lora, cpu_mamba

    for module in (cpu_lora, cpu_mamba):
        if os.environ.get(module.ENV, "").strip() != "1" or module.ENV in _armed:
            continue
        module.install()
        _armed.add(module.ENV)
        log.warning("kvdiag: CPU workaround armed in this vLLM (pid %d): %s.py", os.getpid(),
                    module.__name__.replace(".", "/"))


def register() -> None:
    _sentinel()
    _workarounds()
    name = os.environ.get(FAULT_ENV, "").strip()
    if not name or name in _planted:
        return
    try:
        base, _ = parse(name)  # NAME or NAME:ARG
    except Exception as e:  # KvdiagError: vLLM must not start without the fault it was asked for
        log.error("kvdiag: %s=%r: %s: refusing to start", FAULT_ENV, name, e)
        raise ValueError(f"kvdiag: {FAULT_ENV}={name!r}: {e}") from None
    from kvdiag.engines.vllm.plants import plant

    plant(name)
    _planted.add(name)
    # a warning: shown whether or not vLLM configured handlers for foreign loggers (Python's
    # last-resort handler writes it to stderr otherwise)
    log.warning("kvdiag: PLANTED FAULT %s in this vLLM (pid %d): %s", name, os.getpid(),
                FAULTS[base].summary)
