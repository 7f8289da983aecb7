"""Engine adapters: the protocol, the registry, and one module per built-in adapter.

  base         the protocol (``EngineAdapter``, ``Output``, ``ConfigSpec``) and the registry
  configs      configuration ids, the suites' ``PruningConfig``, ``plan_configs``
  reference    ``reference`` and the static baselines ``static-shortgpt`` / ``static-random``
  hf_generate  ``hf-generate``: plain ``transformers`` greedy generate, the unpruned peer

Importing this package registers the built-in adapters; none of them imports torch,
transformers or reference_engine until an adapter is built.
"""

from rsp_bench.engines.base import (ENTRY_POINT_GROUP, ConfigSpec, EngineAdapter, Output, available_engines,
                                    declared_modes, engine_factory, get_engine, register_engine)
from rsp_bench.engines.configs import SUITE_WATERMARK, format_config_id, plan_configs, pruning_config
from rsp_bench.engines.reference import (ReferenceAdapter, StaticAdapter, random_blocks,
                                         shortgpt_blocks)
from rsp_bench.engines.hf_generate import HFGenerateAdapter
from rsp_bench.engines import llama_cpp as _llama_cpp  # noqa: F401  registers "llama-cpp" (llama_cpp imported lazily)
from rsp_bench.engines import openai_engine as _openai_engine  # noqa: F401  registers "openai" (openai imported lazily)

__all__ = [
    "ENTRY_POINT_GROUP", "SUITE_WATERMARK", "ConfigSpec", "Output", "EngineAdapter",
    "register_engine", "get_engine", "available_engines", "engine_factory", "declared_modes", "format_config_id",
    "plan_configs", "pruning_config", "shortgpt_blocks", "random_blocks",
    "ReferenceAdapter", "HFGenerateAdapter", "StaticAdapter",
]
