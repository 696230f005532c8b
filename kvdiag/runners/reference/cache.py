"""On-disk cache of the contiguous reference (the ground truth of a case).

The contiguous reference is deterministic: the same prompts through the same weights, engine
version, torch version, dtype, device and engine settings give the same tokens. So its turns
are stored once, under a key that digests all of those (the prompts digest covers the suite,
the case, the seed and the tokenizer), and a rerun, or a run with other allocators, reads
them back instead of recomputing them.

Where: $XDG_CACHE_HOME/kvdiag/reference/<suite>-<case>-<key>.json (default ~/.cache).
A file that is missing, unreadable, corrupt or for another key is a miss (recompute, then
overwrite); a cache directory that cannot be written is skipped. Never raises for the cache.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import tempfile
from pathlib import Path

FORMAT = 1  # bump when the stored layout or the meaning of a field changes


@dataclasses.dataclass
class CachedTurn:
    """What the records need of a finished reference turn (duck-types Sequence)."""

    output_ids: list[int]
    stats: object  # reference_engine.sequence.RequestStats


def cache_dir() -> Path:
    from kvdiag.paths import cache_root

    return cache_root() / "reference"


def cache_key(plan, checkpoint, config, max_tokens: int) -> str:
    """sha256 (hex) over everything the reference's tokens depend on. `config`: the
    EngineConfig the contiguous engine runs with."""
    import torch

    import reference_engine
    from kvdiag import __version__

    prompts = hashlib.sha256()
    for session in plan.prompts:
        for prompt in session:
            prompts.update(json.dumps(prompt, separators=(",", ":")).encode() + b"\n")
        prompts.update(b"|")
    settings = {k: v for k, v in dataclasses.asdict(config).items() if k != "check_integrity"}
    settings["dtype"] = str(config.torch_dtype())
    parts = {
        "format": FORMAT, "kvdiag": __version__, "engine": reference_engine.__version__,
        "engine_source": _source_digest(Path(reference_engine.__file__).parent),
        "torch": torch.__version__, "model": checkpoint.model_hash, "config": settings,
        "max_tokens": max_tokens, "stop_ids": list(checkpoint.tokenizer.stop_token_ids),
        "prompts": prompts.hexdigest(),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def _source_digest(package: Path) -> str:
    """sha256 of the engine's own source: an edited engine (same version string, as in a
    checkout under development) never reads an entry the old code wrote."""
    h = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        h.update(path.relative_to(package).as_posix().encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def cache_path(plan, key: str) -> Path:
    label = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{plan.suite.name}-{plan.case.name}")
    return cache_dir() / f"{label}-{key[:16]}.json"


def load(path: Path, key: str, plan) -> list[list[CachedTurn]] | None:
    """The cached turns ([session][round]) if `path` holds a complete, valid entry for
    `key` and the plan's shape; None otherwise (a miss, never an error)."""
    from reference_engine.sequence import RequestStats

    try:
        data = json.loads(path.read_text())
        if data["format"] != FORMAT or data["key"] != key:
            return None
        turns = [[CachedTurn([int(t) for t in turn["output_ids"]], RequestStats(**turn["stats"]))
                  for turn in session] for session in data["turns"]]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None  # unreadable, not JSON, or not our layout: recompute
    if [len(s) for s in turns] != [len(s) for s in plan.prompts]:
        return None
    return turns


def store(path: Path, key: str, turns: dict) -> bool:
    """Write turns ({session index: [Sequence per round]}) atomically (a reader never sees
    half a file). Returns False, writing nothing, where the directory is not writable."""
    data = {"format": FORMAT, "key": key,
            "turns": [[{"output_ids": list(seq.output_ids), "stats": dataclasses.asdict(seq.stats)}
                       for seq in turns[s]] for s in sorted(turns)]}
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp", delete=False) as f:
            tmp = f.name
            json.dump(data, f, separators=(",", ":"))
        os.replace(tmp, path)
        return True
    except OSError:
        if tmp:
            Path(tmp).unlink(missing_ok=True)
        return False
