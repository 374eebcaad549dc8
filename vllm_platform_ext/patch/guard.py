"""The live guard's two hooks into vLLM's API server process (``VLLM_PLATFORM_EXT_GUARD=1``).

* ``vllm.v1.engine.async_llm:load_stat_logger_plugin_factories``: ``AsyncLLM.__init__`` (0.23-0.34)
  adds the factories this returns to its stat loggers; the guard's logger is appended to vLLM's own
  list (the ``vllm.stat_logger_plugins`` entry-point group's). An entry point of that group would
  register the logger on every run, switch or not, and turn on vLLM's stat path even under
  ``--disable-log-stats``; through this group the switch off leaves no logger and no hook.
* ``vllm.v1.engine.output_processor:OutputProcessor.process_outputs``: the guard reads each step's
  ``EngineCoreOutput`` (request id, new token ids, finish reason) before vLLM processes them; a stat
  logger never sees token ids on any line. The outputs are passed on unchanged; an error of the
  guard's turns the guard off and serving goes on.
"""
from __future__ import annotations

from vllm_platform_ext.patching import Patch, PatchGroup

NAME = "guard.live"
FACTORIES = "vllm.v1.engine.async_llm:load_stat_logger_plugin_factories"
PROCESS = "vllm.v1.engine.output_processor:OutputProcessor.process_outputs"


def with_guard_logger(original):
    def load_stat_logger_plugin_factories():
        from vllm_platform_ext.guard.stat_logger import GuardStatLogger

        return [*original(), GuardStatLogger]

    return load_stat_logger_plugin_factories


def observing(original):
    from vllm_platform_ext.guard import monitor

    def process_outputs(self, engine_core_outputs, *args, **kwargs):
        guard = monitor._GUARD
        if guard is not None:
            try:
                guard.observe(engine_core_outputs, self.request_states)
            except Exception as exc:  # never in the way of the outputs
                monitor.disable(exc)
        return original(self, engine_core_outputs, *args, **kwargs)

    return process_outputs


def _skip_if() -> str | None:
    from vllm_platform_ext.guard import enabled

    if not enabled():
        return "off: VLLM_PLATFORM_EXT_GUARD is not set (no guard logger, no output hook)"
    return None


GROUPS = [
    PatchGroup(
        name=NAME,
        why="the live guard (VLLM_PLATFORM_EXT_GUARD=1): adds its stat logger to AsyncLLM's and reads each step's "
            "generated ids as the output processor gets them, to warn of repetition loops, collapsed acceptance "
            "and speculation slower than plain decoding (vllm_platform_ext:guard_* in /metrics)",
        build=lambda: [Patch(FACTORIES, with_guard_logger), Patch(PROCESS, observing)],
        targets=(FACTORIES, PROCESS),
        skip_if=_skip_if,
        upstream="a feature, not a fix: vLLM has the stat-logger interface (vllm.stat_logger_plugins, 0.23+) but no "
                 "hook that shows a logger the generated ids, and no switchable way to add one",
        retire="when vLLM passes output token ids to stat loggers (IterationStats) and stat-logger plugins can be "
               "switched per run: then an entry point of vllm.stat_logger_plugins; tests/guard/test_guard_serve.py",
    ),
]
