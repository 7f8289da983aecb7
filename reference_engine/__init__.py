"""Reference engine for residual-stream pruning: per decode token, a router decides before each
block runs whether to compute it or bypass it, against an adaptive threshold.

    from reference_engine import Engine, PruningConfig
    engine = Engine.load()                       # embedded SmolLM2-135M-Instruct
    [r] = engine.generate(["Hello"], max_new_tokens=32, config=PruningConfig(sensitivity=0.5))
    r.text, r.token_ids, r.stats

A library of its own: it never imports the harness (``rsp_bench``) or pytest.
"""

from .config import PruningConfig
from .errors import ConfigError, EngineInputError, ModelLoadError, PromptError


def __getattr__(name: str):
    # Engine pulls in torch and transformers; import it only when asked, so that the harness
    # and the CLI can use the config and errors without paying for torch.
    if name in ("Engine", "GenerationResult"):
        from . import engine

        return getattr(engine, name)
    raise AttributeError(f"module 'reference_engine' has no attribute {name!r}")


__all__ = ["Engine", "GenerationResult", "PruningConfig", "ConfigError", "EngineInputError",
           "ModelLoadError", "PromptError"]
