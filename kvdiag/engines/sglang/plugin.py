"""kvdiag's SGLang hook: plants the fault that $KVDIAG_SGLANG_FAULT names into SGLang's radix
cache, as a positive control for kvdiag's probe, turns the sentinel on (sentinel.py) when
$KVDIAG_SENTINEL names its file, with the attention its wrong slots drew (attention.py;
when $KVDIAG_SENTINEL_ATTENTION is 1), and lets SGLang's LoRA run on a CPU
(cpu_lora.py) when $KVDIAG_SGLANG_CPU_LORA is 1; inert without any.

How it gets into every SGLang process: SGLang starts its scheduler and detokenizer with the
multiprocessing "spawn" method, so each is a fresh interpreter that runs the venv's .pth
files at start-up. `make sglang-cpu-env` installs one (kvdiag_sglang_faults.pth) that calls
`register()` only when one of those is set. register() imports no SGLang: it waits
for `sglang.srt.plugins` to be imported and wraps its `load_plugins()`, which SGLang calls
early in every process it starts (main, scheduler before it builds the tree cache,
detokenizer). The plant runs there, once per process, and logs one warning line
"kvdiag: PLANTED FAULT <name> ... (pid N)", so no one mistakes a planted server for a
healthy one. (SGLang's own plugin entry points would reach the same processes, but SGLang
logs and swallows a plugin's exception, and an unknown fault must stop the server: here
plant() raises out of load_plugins() and the server does not start.) A fault that needs
server arguments other than those sglang-local passes (page-overrun: 16-token pages) gets
them the same way: register() also waits for `sglang.srt.server_args` and sets them before
ServerArgs.resolve_once() reads them, in the process that builds the server's arguments.

The plants themselves live beside it, imported only when one is planted: plants_keys.py
(key coverage and isolation: stale-node, salt-ignored, match-overrun, page-overrun) and
plants_lifecycle.py (the events of a block's life: dedup-no-remap, ...). Only faults.py and
those modules of kvdiag are imported: the SGLang venv holds kvdiag with --no-deps.
Patched against sglang 0.5.23.
"""

from __future__ import annotations

import importlib.abc
import logging
import os
import sys

from kvdiag.engines.sglang import cpu_lora
from kvdiag.engines.sglang.faults import FAULT_ENV, FAULTS, PAGE_OVERRUN_SIZE

log = logging.getLogger("kvdiag.sglang_plugin")
_planted: set[str] = set()
_armed: list[str] = []  # register() runs once per .pth copy (a venv's lib64 -> lib shows it twice)
# server arguments a fault sets before SGLang resolves its own (sglang-local passes --page-size 1)
_SERVER_ARGS = {"page-overrun": {"page_size": PAGE_OVERRUN_SIZE}}


def register() -> None:
    """Arm the plant, the sentinel and SGLang's LoRA on a CPU (cpu_lora.py) for this process,
    as asked; called by the .pth line when $KVDIAG_SGLANG_FAULT, $KVDIAG_SENTINEL or
    $KVDIAG_SGLANG_CPU_LORA is set."""
    from kvdiag.sentinel.log import ENV

    path, name = os.environ.get(ENV, "").strip(), os.environ.get(FAULT_ENV, "").strip()
    lora = os.environ.get(cpu_lora.ENV, "").strip() == "1"
    if _armed or not (path or name or lora):
        return
    _armed.append(name or "sentinel")
    if lora:
        for module in cpu_lora.MODULES:
            _after_import(module, cpu_lora.unpin)
    if path:
        _after_import("sglang.srt.managers.scheduler", lambda _module: _sentinel(path))
    if not name:
        return
    if name in FAULTS:
        # set here, in the launching process, so the spawned scheduler inherits it
        for key, value in FAULTS[name].server_env.items():
            os.environ.setdefault(key, value)
    if name in _SERVER_ARGS:
        _after_import("sglang.srt.server_args",
                      lambda module: _wrap_resolve(module, _SERVER_ARGS[name]))
    _after_import("sglang.srt.plugins", lambda module: _wrap_load_plugins(module, name))


def _sentinel(path: str) -> None:
    """The sentinel in this process (kvdiag.engines.sglang.sentinel); an SGLang it cannot read
    raises, and the process does not start."""
    from kvdiag.engines.sglang.sentinel import install
    from kvdiag.sentinel.leakage import asked

    weigh = asked()
    if weigh:  # leakage: the attention sampled tokens paid to slots read wrong
        from kvdiag.engines.sglang import attention

        attention.install()
    install(path, weigh)
    log.warning("kvdiag: SENTINEL on in this SGLang process (pid %d): every KV read checked, "
                "findings in %s%s", os.getpid(), path, ", attention weighed" if weigh else "")
    from kvdiag.sentinel.serve import serve_if_asked

    if (addr := serve_if_asked(path)) is not None:  # the file over HTTP too
        log.warning("kvdiag: the sentinel's file served at http://%s/ (pid %d)", addr, os.getpid())


def plant(name: str) -> None:
    """Plant fault `name` in this process, once; an unknown name raises ValueError."""
    if name in _planted:
        return
    if name not in FAULTS:
        log.error("kvdiag: unknown fault %s=%r (known: %s): refusing to start",
                  FAULT_ENV, name, ", ".join(FAULTS))
        raise ValueError(f"kvdiag: unknown fault {FAULT_ENV}={name!r} (known: {', '.join(FAULTS)})")
    _plants()[name]()
    _planted.add(name)
    # a warning: shown whether or not SGLang has configured logging in this process yet
    # (Python's last-resort handler writes it to stderr otherwise)
    log.warning("kvdiag: PLANTED FAULT %s in this SGLang process (pid %d): %s",
                name, os.getpid(), FAULTS[name].summary)


def _wrap_load_plugins(module, name: str) -> None:
    original = module.load_plugins

    def load_plugins():
        plant(name)  # outside SGLang's own try/except: an unknown name stops the process
        return original()

    module.load_plugins = load_plugins


def _wrap_resolve(module, args: dict) -> None:
    """ServerArgs.resolve_once() sets `args` first, in the process that builds the server's
    arguments (spawned processes receive them resolved)."""
    cls = module.ServerArgs
    resolve_once = cls.resolve_once

    def resolve_once_(self) -> None:
        if not getattr(self, "_resolution_finished", False):
            for key, value in args.items():
                setattr(self, key, value)
        return resolve_once(self)

    cls.resolve_once = resolve_once_


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs `callback(module)` right after module `fullname` executes, before anyone can
    `from fullname import ...`; then leaves sys.meta_path."""

    def __init__(self, fullname: str, callback) -> None:
        self.fullname, self.callback = fullname, callback

    def find_spec(self, fullname, path, target=None):
        if fullname != self.fullname:
            return None
        sys.meta_path.remove(self)
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find else None
            if spec is not None and spec.loader is not None:
                break
        else:
            return None
        exec_module, callback = spec.loader.exec_module, self.callback

        def exec_and_call(module):
            exec_module(module)
            callback(module)

        spec.loader.exec_module = exec_and_call  # this module's own loader instance
        return spec


def _after_import(fullname: str, callback) -> None:
    if fullname in sys.modules:
        callback(sys.modules[fullname])
    else:
        sys.meta_path.insert(0, _AfterImport(fullname, callback))


def _plants() -> dict:
    """Every plant by fault name (imported late: register() must stay free of SGLang)."""
    from kvdiag.engines.sglang import plants_keys, plants_lifecycle

    return plants_keys.PLANTS | plants_lifecycle.PLANTS
