"""What a regression baseline is keyed by: the engine's name and version, the model's hash,
the flags that change what the cache does, and the suite (its name and a digest of its
file). A run is compared only with a baseline of the same key; the allocator under test is
not part of the key, so a faulty allocator is measured against the guarded baseline.

    reference target   engine "reference", version = kvdiag's, model = <dir>-<sha8 of
                       config.json + weights>, flags = block size, max_num_seqs, device,
                       dtype, prefix caching
    URL target         engine and version from the server (/version for vLLM, the OpenAPI
                       title otherwise), model = <served name>@<sha8 of its /v1/models
                       entry> (weights cannot be hashed from outside), flags = the labels
                       of vLLM's cache_config_info metric plus any --flag KEY=VALUE
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kvdiag.errors import KvdiagError

CACHE_FLAGS = ("block_size", "cache_dtype", "enable_prefix_caching", "prefix_caching_hash_algo",
               "kv_cache_dtype", "sliding_window", "calculate_kv_scales")


def parse_flags(values: list[str] | None) -> dict:
    """--flag NAME=VALUE strings as {NAME: VALUE}; ValueError names a malformed one."""
    flags = {}
    for v in values or []:
        name, sep, value = v.partition("=")
        if not sep or not name.strip():
            raise KvdiagError(f"--flag {v!r}: expected NAME=VALUE")
        flags[name.strip()] = value.strip()
    return flags


@dataclass(frozen=True)
class BaselineKey:
    engine: str
    engine_version: str
    model: str
    suite: str
    suite_sha: str
    flags: dict = field(default_factory=dict)

    @property
    def id(self) -> str:
        """sha256 of the canonical JSON, 12 hex digits: the key in one word."""
        blob = json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> BaselineKey:
        return cls(**{k: data[k] for k in ("engine", "engine_version", "model", "suite", "suite_sha")},
                   flags=dict(data.get("flags") or {}))

    def differences(self, other: BaselineKey) -> list[str]:
        """'field: baseline X, run Y' for every field that differs (flags one by one)."""
        out = []
        for name in ("engine", "engine_version", "model", "suite", "suite_sha"):
            mine, theirs = getattr(other, name), getattr(self, name)
            if mine != theirs:
                out.append(f"{name}: baseline {theirs}, run {mine}")
        for flag in sorted(set(self.flags) | set(other.flags)):
            mine, theirs = other.flags.get(flag, "(unset)"), self.flags.get(flag, "(unset)")
            if str(mine) != str(theirs):
                out.append(f"flag {flag}: baseline {theirs}, run {mine}")
        return out


def suite_sha(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:8]


def reference_key(suite, model_dir: Path, device: str, dtype: str | None,
                  extra_flags: dict | None = None) -> BaselineKey:
    from kvdiag import __version__
    from kvdiag.record.results import model_label

    flags = {"block_size": suite.block_size, "max_num_seqs": suite.max_num_seqs, "device": device,
             "dtype": dtype or ("float32" if device == "cpu" else "bfloat16"),
             "enable_prefix_caching": True} | {k: str(v) for k, v in (extra_flags or {}).items()}
    return BaselineKey("reference", __version__, model_label(model_dir), suite.name,
                       suite_sha(suite.path), flags)


def endpoint_key(suite, base_url: str, model: str, api_key: str | None = None,
                 extra_flags: dict | None = None) -> BaselineKey:
    """Ask the server who it is; raises EndpointError when it cannot be reached."""
    from kvdiag.runners.live.endpoint import Endpoint

    endpoint = Endpoint(base_url, model, api_key, retries=2)
    try:
        endpoint.check()
        who = endpoint.identity()
        flags = _cache_flags(endpoint) | {k: str(v) for k, v in (extra_flags or {}).items()}
        label = endpoint.model_label()
    finally:
        endpoint.sync.close()
    return BaselineKey(who["name"], who["version"], label, suite.name, suite_sha(suite.path), flags)


def _cache_flags(endpoint) -> dict:
    """The labels of vLLM's `vllm:cache_config_info` gauge that change what the cache does."""
    labels = endpoint.cache_config()
    return {k: str(v) for k, v in labels.items() if k in CACHE_FLAGS}
