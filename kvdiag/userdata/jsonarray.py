"""A sessions file written as one JSON array of conversations, the way ShareGPT's own dataset
and vLLM's serving benchmark keep it, read an item at a time: the file is read in chunks and
each item decoded as soon as it is whole, so nothing holds more than one conversation (and a
chunk) whatever the file's size.

    items(handle, where)   # -> (item number, the line it starts on, the decoded item)

`where(item, line)` names a place for an error; any error is one KvdiagError naming it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import TextIO

from kvdiag.errors import KvdiagError

CHUNK = 1 << 16
LARGEST = 1 << 26  # characters one item may take before it is called malformed, not unfinished
_DECODER = json.JSONDecoder()
_SPACE = " \t\r\n"


class _Reader:
    """The unread text of the file, its line count so far, and reading more of it."""

    def __init__(self, handle: TextIO) -> None:
        self.handle, self.text, self.at, self.line, self.done = handle, "", 0, 1, False

    def more(self) -> bool:
        if self.done:
            return False
        chunk = self.handle.read(CHUNK)
        self.done = not chunk
        self.text = self.text[self.at:] + chunk
        self.at = 0
        return bool(chunk)

    def skip_space(self) -> str:
        """The next character that is not white space ('' at the file's end)."""
        while True:
            while self.at < len(self.text) and self.text[self.at] in _SPACE:
                self.line += self.text[self.at] == "\n"
                self.at += 1
            if self.at < len(self.text) or not self.more():
                return self.text[self.at:self.at + 1]

    def take(self, end: int) -> None:
        self.line += self.text.count("\n", self.at, end)
        self.at = end


def items(handle: TextIO, where: Callable[[int, int], str]) -> Iterator[tuple[int, int, object]]:
    """Each item of the array in `handle` (its first character, after white space, is `[`)."""
    r = _Reader(handle)
    r.skip_space()
    r.take(r.at + 1)  # the "["
    n = 0
    while True:
        c = r.skip_space()
        if c == "]" and n == 0:
            r.take(r.at + 1)
            break
        if not c:
            raise KvdiagError(f"{where(n + 1, r.line)}: the array is not closed (no ']' at the end)")
        n += 1
        line = r.line
        while True:
            try:
                value, end = _DECODER.raw_decode(r.text, r.at)
                break
            except json.JSONDecodeError as e:
                if len(r.text) - r.at > LARGEST or not r.more():
                    raise KvdiagError(f"{where(n, line)}: not valid JSON ({e.msg})") from None
        r.take(end)
        yield n, line, value
        c = r.skip_space()
        if c == "]":
            r.take(r.at + 1)
            break
        if c != ",":
            found = repr(c) if c else "the end of the file"
            raise KvdiagError(f"{where(n, r.line)}: expected ',' or ']' after the item, got {found}")
        r.take(r.at + 1)
    if r.skip_space():
        raise KvdiagError(f"{where(n, r.line)}: text after the array's closing ']'")
