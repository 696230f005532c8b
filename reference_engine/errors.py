"""Typed errors. Each message is one line that says what is wrong and with what value,
so the CLI can print it as is and exit 2."""


class EngineError(Exception):
    """Base of every error the reference engine raises on bad input."""


class UnsupportedModelError(EngineError):
    """config.json names an architecture or feature the engine does not implement."""


class MissingFileError(EngineError):
    """A file the model directory must hold is absent."""


class ShapeMismatchError(EngineError):
    """A weight's shape disagrees with config.json (or a weight is missing/unexpected)."""


class UnknownAllocatorError(EngineError):
    """No allocator is registered under that name."""


class InvalidRequestError(EngineError):
    """A request the engine cannot serve: empty prompt, bad token id, bad cache_salt, ..."""


class PromptTooLongError(InvalidRequestError):
    """prompt + max_tokens exceeds max_model_len."""


class PoolTooSmallError(EngineError):
    """The KV block pool cannot hold even one request of this size."""


class IntegrityError(RuntimeError):
    """check_integrity() found a broken allocator invariant (a stale hash entry first): an
    engine bug, not bad input. The message names the block and its generations."""
