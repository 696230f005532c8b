"""Session files: JSONL (one conversation a line) or one JSON array, in OpenAI chat format or
ShareGPT (its own dataset is one array: kvdiag.userdata.jsonarray).

    {"messages": [{"role": "system" | "user" | "assistant", "content": "..."}, ...]}
    {"conversations": [{"from": "system" | "human" | "gpt", "value": "..."}, ...]}

A message's content may be a list of text parts ({"type": "text", "text": "..."}), sent joined
by newlines; any other part (an image) is refused.

The format is detected from the file's first conversation (or named: `openai`, `sharegpt`);
every conversation must then be in it. Each is validated strictly by pydantic (no number for a
string, no unknown key in a turn, no unknown role), and must hold a user turn. Any error is
one KvdiagError naming the file, the line (an array's item and its line) and the field. The
file is read a conversation at a time: nothing holds more than one, whatever the file's size.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kvdiag.errors import KvdiagError
from kvdiag.userdata import jsonarray

KIND = "chat"  # a round of a user's conversation (neither "question" nor "recite")

FORMATS = ("openai", "sharegpt")
KEYS = {"openai": "messages", "sharegpt": "conversations"}
OPENAI_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
SHAREGPT_ROLES = {"system": "system", "human": "user", "user": "user", "gpt": "assistant",
                  "assistant": "assistant"}


class TextPart(BaseModel):
    """A part of a message's content as OpenAI's API takes it; only text is replayed."""

    model_config = ConfigDict(strict=True, extra="forbid")
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    role: Literal["system", "developer", "user", "assistant"]  # developer: OpenAI's newer system
    content: str | list[TextPart]  # parts are sent joined by newlines, as one string
    name: str | None = None  # OpenAI fine-tuning files carry these two; neither is sent
    weight: int | None = None


class ChatLine(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")  # ids, tools... are not replayed
    messages: list[ChatMessage]


class ShareGptTurn(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    # the ShareGPT names, and the OpenAI ones some exports use
    from_: Literal["system", "human", "user", "gpt", "assistant"] = Field(alias="from")
    value: str
    weight: int | float | None = None


class ShareGptLine(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    conversations: list[ShareGptTurn]


MODELS = {"openai": ChatLine, "sharegpt": ShareGptLine}
_PARTS = "list[TextPart]"  # pydantic's name for content's second branch, in an error's place


@dataclass(frozen=True)
class Conversation:
    """One line of the file as chat messages ({"role", "content"}), in the file's order."""

    line: int  # 1-based: its line in JSONL, its item in a JSON array
    messages: tuple[dict, ...]
    format: str  # openai or sharegpt

    @property
    def user_turns(self) -> list[int]:
        """The index in `messages` of every user turn: round n ends at the n-th of them."""
        return [i for i, m in enumerate(self.messages) if m["role"] == "user"]


@dataclass(frozen=True)
class FileCheck:
    """What a whole pass over a valid file found."""

    format: str
    conversations: int
    fewest_rounds: int
    most_rounds: int


def read_conversations(path: str | Path, fmt: str | None = None) -> Iterator[Conversation]:
    """The file's conversations in order, validated, read one at a time (a line of JSONL, or
    an item of a JSON array: kvdiag.userdata.jsonarray); `fmt` None or "auto" detects the
    format from the first conversation."""
    path = Path(path)
    if fmt not in (None, "auto", *FORMATS):
        raise KvdiagError(f"the sessions format must be auto, openai or sharegpt, got {fmt!r}")
    try:
        handle = path.open(encoding="utf-8-sig")  # a byte-order mark, as some editors write, is dropped
    except OSError as e:
        raise KvdiagError(f"{path}: cannot read the sessions file ({e.strerror or e})") from None
    seen = False
    with handle:
        try:
            for where, n, data in _array(path, handle) if _is_array(handle) else _lines(path, handle):
                if not isinstance(data, dict):
                    raise KvdiagError(f"{where}: expected a JSON object, got {type(data).__name__}")
                if fmt in (None, "auto"):
                    fmt = _detect(where, data)
                yield _conversation(where, n, data, fmt)
                seen = True
        except UnicodeDecodeError:
            raise KvdiagError(f"{path}: not UTF-8 text") from None
    if not seen:
        raise KvdiagError(f"{path}: empty file (no conversation in it)")


def _is_array(handle) -> bool:
    """Whether the file's first character that is not white space is '[' (then rewound)."""
    while (c := handle.read(1)) and c.isspace():
        pass
    handle.seek(0)
    return c == "["


def _array(path: Path, handle) -> Iterator[tuple[str, int, object]]:
    """(where, item number, item) of a JSON array; a conversation's `line` is its item number."""
    where = lambda item, line: f"{path}:item {item} (line {line})"  # noqa: E731
    for n, line, data in jsonarray.items(handle, where):
        yield where(n, line), n, data


def _lines(path: Path, handle) -> Iterator[tuple[str, int, object]]:
    """(where, line number, decoded line) of JSONL, blank lines skipped."""
    n = 0
    while True:
        try:
            raw = handle.readline()
        except UnicodeDecodeError:
            raise KvdiagError(f"{path}:{n + 1}: not UTF-8 text") from None
        if not raw:
            return
        n += 1
        if not raw.strip():
            continue
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as e:
            raise KvdiagError(f"{path}:{n}: not valid JSON ({e.msg} at column {e.colno})") from None
        yield f"{path}:{n}", n, data


def check_file(path: str | Path, fmt: str | None = None) -> FileCheck:
    """Validate the whole file (streamed); KvdiagError at its first bad line."""
    count, fewest, most, found = 0, 0, 0, ""
    for conv in read_conversations(path, fmt):
        rounds = len(conv.user_turns)
        fewest = min(fewest, rounds) if count else rounds
        count, most, found = count + 1, max(most, rounds), conv.format
    return FileCheck(found, count, fewest, most)


def sessions_file(suite_path: Path | None, sessions: str, fmt: str | None) -> str:
    """The sessions file's path (relative paths from a suite's directory), after a whole
    validating pass over it (KvdiagError at its first bad line)."""
    p = Path(sessions)
    if suite_path is not None and not p.is_absolute() and not p.is_file():
        p = Path(suite_path).parent / p
    check_file(p, fmt)
    return str(p)


def _detect(where: str, data: dict) -> str:
    for fmt, key in KEYS.items():
        if key in data:
            return fmt
    raise KvdiagError(f"{where}: neither 'messages' (OpenAI chat format) nor 'conversations' "
                      "(ShareGPT): cannot tell the file's format")


def _conversation(where: str, n: int, data: dict, fmt: str) -> Conversation:
    key = KEYS[fmt]
    if key not in data:
        raise KvdiagError(f"{where}: {key}: required (the file is in {fmt} format)")
    try:
        line = MODELS[fmt].model_validate(data)
    except ValidationError as e:
        raise KvdiagError(f"{where}: {_first_error(e)}") from None
    if fmt == "openai":
        messages = tuple({"role": OPENAI_ROLES[m.role], "content": m.content if isinstance(m.content, str)
                          else "\n".join(p.text for p in m.content)} for m in line.messages)
    else:
        messages = tuple({"role": SHAREGPT_ROLES[t.from_], "content": t.value} for t in line.conversations)
    if not any(m["role"] == "user" for m in messages):
        raise KvdiagError(f"{where}: {key}: no user turn (a conversation needs at least one)")
    return Conversation(n, messages, fmt)


def _first_error(e: ValidationError) -> str:
    """`messages[2].role: unknown role 'tool' (known: ...)` from pydantic's first error."""
    errors = e.errors()
    first = errors[0]
    if first["loc"][-1:] == ("str",) and isinstance(first["input"], list):  # content as parts
        first = next((x for x in errors if _PARTS in x["loc"]), first)
    loc = [x for x in first["loc"] if x not in ("str", _PARTS)]  # a union's branch, not a field
    where = "".join(f"[{x}]" if isinstance(x, int) else f".{x}" for x in loc).lstrip(".")
    if first["type"] == "literal_error" and _PARTS in first["loc"]:
        return f"{where}: only text parts are replayed (got {first['input']!r})"
    if first["type"] == "literal_error" and where.endswith((".role", ".from")):
        known = first.get("ctx", {}).get("expected", "")
        return f"{where}: unknown role {first['input']!r} (known: {known.replace(' or ', ', ')})"
    got = first.get("input")
    shown = "" if isinstance(got, dict) else f" (got {type(got).__name__})"
    return f"{where}: {first['msg']}{shown}"
