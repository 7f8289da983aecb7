"""Errors the reference engine raises for bad input.

Every error names the bad value. All are ``ValueError`` subclasses so callers that
only know the standard library can still catch them; the CLI turns them into one
line on stderr and exit code 2. Must not import the harness (``rsp_bench``).
"""


class EngineInputError(ValueError):
    """Base class: bad input to the reference engine (configuration, prompt or model)."""


class ConfigError(EngineInputError):
    """A pruning configuration value is out of range or of the wrong type."""


class PromptError(EngineInputError):
    """A prompt list is empty, or a prompt does not fit the model's context."""


class ModelLoadError(EngineInputError):
    """A model path is missing, unreadable or not a Llama-family checkpoint."""
