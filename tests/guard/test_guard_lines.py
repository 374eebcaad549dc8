"""What the guard's hooks need, in each served vLLM line's own source (read with ``ast``, not imported).

``guard.live`` patches ``vllm.v1.engine.async_llm:load_stat_logger_plugin_factories`` (called by
``AsyncLLM.__init__``, its result added to the stat loggers) and
``OutputProcessor.process_outputs(self, engine_core_outputs, ...)``, reads ``self.request_states``,
``EngineCoreOutput.request_id / new_token_ids / finish_reason``, ``SchedulerStats.spec_decoding_stats /
num_running_reqs``, ``SpecDecodingStats.num_drafts / num_draft_tokens / num_accepted_tokens``, and
subclasses ``StatLoggerBase`` (``record(scheduler_stats, iteration_stats, ...)``,
``log_engine_initialized``). Every line of the compat index is checked: a line that renames one of
these fails here before a server runs unwatched. (Importing ``async_llm`` costs ~18 s a line: the
venv's 0.32 does it in test_guard_hooks.py and under `vllm serve` in test_guard_serve.py.)
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from conftest import line_id, line_source
from vllm_platform_ext.compat import lines


def _tree(root: str, rel: str) -> ast.Module:
    return ast.parse((Path(root) / rel).read_text())


def _class(tree: ast.Module, name: str) -> ast.ClassDef:
    found = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name]
    assert found, f"class {name} not found"
    return found[0]


def _method(cls: ast.ClassDef, name: str) -> ast.FunctionDef:
    found = [n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name]
    assert found, f"{cls.name}.{name} not found"
    return found[0]


def _fields(cls: ast.ClassDef) -> set[str]:
    out = {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    for fn in (n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"):
        out |= {t.attr for n in ast.walk(fn) for t in getattr(n, "targets", [getattr(n, "target", None)])
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"}
    return out


@pytest.mark.parametrize("key", lines.LINES, ids=line_id)
def test_the_lines_own_code_has_what_the_guard_hooks(key):
    root = line_source(key)
    alm = _tree(root, "vllm/v1/engine/async_llm.py")
    imported = {a.name for n in ast.walk(alm) if isinstance(n, ast.ImportFrom) and n.module == "vllm.v1.metrics.loggers"
                for a in n.names}
    assert "load_stat_logger_plugin_factories" in imported
    init = _method(_class(alm, "AsyncLLM"), "__init__")
    assert any(isinstance(n, ast.Call) and getattr(n.func, "id", None) == "load_stat_logger_plugin_factories"
               for n in ast.walk(init)), "AsyncLLM.__init__ does not call load_stat_logger_plugin_factories"

    op = _class(_tree(root, "vllm/v1/engine/output_processor.py"), "OutputProcessor")
    args = [a.arg for a in _method(op, "process_outputs").args.args]
    assert args[:2] == ["self", "engine_core_outputs"], args
    assert "request_states" in _fields(op)

    core = _fields(_class(_tree(root, "vllm/v1/engine/__init__.py"), "EngineCoreOutput"))
    assert {"request_id", "new_token_ids", "finish_reason"} <= core
    stats = _tree(root, "vllm/v1/metrics/stats.py")
    assert {"spec_decoding_stats", "num_running_reqs"} <= _fields(_class(stats, "SchedulerStats"))
    assert {"num_drafts", "num_draft_tokens", "num_accepted_tokens"} <= _fields(
        _class(_tree(root, "vllm/v1/spec_decode/metrics.py"), "SpecDecodingStats"))

    base = _class(_tree(root, "vllm/v1/metrics/loggers.py"), "StatLoggerBase")
    rec = [a.arg for a in _method(base, "record").args.args]
    assert rec[:3] == ["self", "scheduler_stats", "iteration_stats"], rec
    _method(base, "log_engine_initialized")
    init_args = [a.arg for a in _method(base, "__init__").args.args]
    assert init_args[:3] == ["self", "vllm_config", "engine_index"], init_args
