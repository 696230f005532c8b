"""A small, transparent paged-attention engine for Qwen-family decoders.

Nothing heavy is imported here, so `import reference_engine` is instant; import the
submodules you need (`reference_engine.engine`, `reference_engine.loader`, ...).
"""

__version__ = "0.1.0"
