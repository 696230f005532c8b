"""Model-free replays of a trace through a block manager (vLLM's KVCacheManager, or ours) with a shadow content map."""
