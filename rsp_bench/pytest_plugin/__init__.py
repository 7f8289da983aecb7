"""The parts of the rsp-bench pytest plugin. The plugin itself (the ``pytest11`` entry point)
is ``rsp_bench.plugin``, which imports the hooks and fixtures of these modules into its
namespace, where pytest finds them:

  options   the --rsp-* options: pytest_addoption, parsing and checking into ``RspOptions``
  state     the per-session state kept in ``config.stash`` (``get_options`` reads it)
  fixtures  the session fixtures the suites use (rsp_engine, rsp_configs, rsp_record, ...)
  session   the session end: worker records merged, the run record written, the gate, the
            terminal summary

This package imports none of them (importing it registers nothing), and none of them
imports ``rsp_bench.plugin`` (no circle: the plugin imports them). Must NOT import torch,
transformers, reference_engine or rsp_bench.quality at module import (pytest loads the
plugin for every run): anything heavy is imported inside the function that needs it.
"""
