"""A slot file that fails to load partway, for the probe's failed-restore event: llama-server's
own save (POST /slots/ID?action=save) with the type field of its first layer of values made
one no cache has, so a restore places the cells, writes every layer's keys, and then refuses
the values (llama_kv_cache::state_read_data: "mismatched value type"). A healthy server then
removes those cells and clears the slot; #27068 is that cleanup missing.

The layout read is b11434's single-sequence state file (llama-context.cpp
state_seq_save_file, llama-kv-cache.cpp state_write): the header and the prompt's tokens,
then per stream its cells (position, sequence ids), then the data: four fields, each layer's
keys (type, row size, rows), each layer's values. A file that does not walk out exactly so
(another version, more than one sequence per cell, M-RoPE's cell extensions) is not broken
here: None, and the event is said not driven, never guessed at.

Why not a file cut short: b11434's buffered read past a file's end returns nothing without
an error (llama-mmap.cpp read_raw_unsafe), so the restore reads on, and the size check after
it aborts the whole server (GGML_ASSERT(nread <= state_size)): loud, not the event.
"""

from __future__ import annotations

import struct

NO_TYPE = 0x7FFF  # a ggml type id no cache has


def break_values(data: bytes) -> bytes | None:
    """`data` (a saved slot file) with its first value layer's type field set to NO_TYPE;
    None where the file is not b11434's layout as described above."""
    try:
        at = _first_value_layer(data)
    except (struct.error, ValueError):
        return None
    if at is None:
        return None
    return data[:at] + struct.pack("<i", NO_TYPE) + data[at + 4:]


def _first_value_layer(data: bytes) -> int | None:
    u32 = lambda at: struct.unpack_from("<I", data, at)[0]  # noqa: E731
    at = 8  # magic, version
    n_tokens = u32(at)
    at += 4 + 4 * n_tokens
    n_stream = u32(at)
    at += 4
    for _ in range(n_stream):
        cells = u32(at)
        at += 4
        if cells == 0:
            continue
        for _ in range(cells):  # position, sequence-id count (one: a slot's own), the id
            if u32(at + 4) != 1:
                return None
            at += 12
        v_trans, n_layer = u32(at), u32(at + 4)
        at += 16  # v_trans, n_layer, the key and value rotations
        if v_trans not in (0, 1) or not 0 < n_layer < 1024:
            return None
        row = None
        for _ in range(n_layer):  # each layer's keys: type, row size, the rows
            k_size_row = struct.unpack_from("<Q", data, at + 4)[0]
            if row is not None and k_size_row != row or k_size_row == 0:
                return None
            row = k_size_row
            at += 12 + cells * k_size_row
        first, end = at, at  # the first value layer's type; the values walked to the file's end
        for _ in range(n_layer):
            if v_trans:  # type, element size, width, then the rows transposed
                end += 12 + u32(end + 4) * u32(end + 8) * cells
            else:  # type, row size, the rows
                end += 12 + struct.unpack_from("<Q", data, end + 4)[0] * cells
        return first if end == len(data) else None
    return None
