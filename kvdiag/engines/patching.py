"""Swapping an engine's class attribute for a wrapper and putting it back: what every plant and
every sentinel hook is built from, in any engine's process (imports nothing)."""

from __future__ import annotations

from collections.abc import Callable

Undo = Callable[[], None]


def swap_attr(owner, name: str, new) -> Undo:
    """Set owner.name (a class attribute) to `new`; undo restores the original object."""
    old = owner.__dict__[name]
    setattr(owner, name, new)

    def undo() -> None:
        if owner.__dict__.get(name) is not new:
            raise RuntimeError(f"kvdiag: {owner.__name__}.{name} was patched again since; "
                               "undo plants in reverse order")
        setattr(owner, name, old)
    return undo


def both(*undos: Undo) -> Undo:
    def undo() -> None:
        for u in reversed(undos):
            u()
    return undo
