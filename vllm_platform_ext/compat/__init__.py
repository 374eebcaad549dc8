"""Early compat shims: missing ``torch.ops._C*`` schemas and ``torch.accelerator`` helpers.

``apply(report)`` runs first in ``bootstrap()`` (vLLM's general-plugin hook, in every vLLM
process, spawned EngineCore and workers included), before any fusion/MTP module is imported:

1. load the platform's kernel libraries (``import vllm._custom_ops``, which runs
   ``current_platform.import_kernels()``), so that a real op is registered before we look
   and our definitions can never collide with a library loaded later;
2. for each row of the schema table of the installed vLLM (``schemas.py``): define it when
   missing (torch kernel or clear-error stub + fake); leave it alone when present and report
   whether it matches, differs only in argument names, or differs;
3. backfill ``torch.accelerator`` helpers from the active device module.

``schema_table()`` gives the rows for ``doctor``.
"""
from __future__ import annotations

import importlib
import logging

from vllm_platform_ext.compat import accelerator, registry
from vllm_platform_ext.compat.schemas import OpSchema, parse_version, table_for
from vllm_platform_ext.report import Report

STEP = "compat"
_log = logging.getLogger("vllm_platform_ext.compat")


def vllm_version() -> str:
    import vllm

    return str(getattr(vllm, "__version__", "0.0"))


def _version_key() -> tuple[int, int]:
    return parse_version(vllm_version())


def rows() -> tuple[OpSchema, ...]:
    return table_for(vllm_version())[1]


def _load_kernels(report: Report) -> bool:
    try:
        importlib.import_module("vllm._custom_ops")
    except Exception as exc:
        report.failed(STEP, "kernel libraries",
                      f"import vllm._custom_ops failed ({type(exc).__name__}: {exc}); no schema defined, "
                      "since a kernel library loaded later would collide with our definitions")
        return False
    return True


def _describe(st: registry.RowState) -> str:
    kernels = ",".join(st.kernels) or "none"
    return f"installed `{st.installed}` (kernels: {kernels}); table `{st.row.schema}`"


def apply_schemas(report: Report, table: tuple[OpSchema, ...] | None = None) -> None:
    from vllm_platform_ext.patching import strict_mode

    if table is None:
        key, table, note = table_for(vllm_version())
        if key != _version_key():
            _log.warning("vllm_platform_ext compat: %s", note)
            report.skipped(STEP, "schema table", note)
    errors = []
    for row in table:
        st = registry.state(row)
        if st.status == registry.ADDED:
            report.skipped(STEP, row.label, f"already defined by vllm_platform_ext in this process: {_describe(st)}")
        elif st.status == registry.PRESENT:
            report.skipped(STEP, row.label, f"real kernel present, schema matches: {_describe(st)}")
        elif st.status == registry.RENAMED:
            report.skipped(STEP, row.label, f"real kernel present, argument names differ (types match): {_describe(st)}")
        elif st.status == registry.DIFFERS:
            detail = f"DIFFERS, left as is; vLLM code that uses it may fail: {_describe(st)}"
            _log.warning("vllm_platform_ext compat: %s %s", row.label, detail)
            report.skipped(STEP, row.label, detail)
        else:
            try:
                registry.define(row)
            except Exception as exc:
                errors.append(exc)
                report.failed(STEP, row.label, f"define `{row.schema}` failed: {type(exc).__name__}: {exc}")
                continue
            how = "torch fallback kernel" if row.fallback == "real" else "stub kernel (raises when called)"
            report.applied(STEP, row.label, f"added `{row.schema}` with {how} + fake")
    if errors and strict_mode():
        raise errors[0]


def apply(report: Report) -> None:
    """Run every compat shim, recording one entry per schema row and per accelerator helper."""
    if _load_kernels(report):
        apply_schemas(report)
    else:
        from vllm_platform_ext.patching import strict_mode

        if strict_mode():
            raise RuntimeError(report.find(STEP, "kernel libraries").detail)
    accelerator.backfill(report)


def table_info() -> dict:
    """Which schema table this vLLM uses, where it was derived from, and the note when the
    version has none of its own (for ``doctor``)."""
    from vllm_platform_ext.compat.schemas import TABLE_SOURCES

    version = vllm_version()
    key, rows, note = table_for(version)
    exact = key == _version_key()
    return {"vllm": version, "table": f"{key[0]}.{key[1]}", "rows": len(rows),
            "derived_from": TABLE_SOURCES[key]["wheel"], "note": "" if exact else note}


def schema_table() -> list[dict]:
    """Rows for ``doctor``: op, overload, schema (the table's), status, installed, kernels."""
    out = []
    for row in rows():
        st = registry.state(row)
        out.append({
            "op": row.qualname,
            "overload": row.overload,
            "schema": row.schema,
            "status": st.status,
            "installed": st.installed,
            "kernels": list(st.kernels),
            "fallback": row.fallback,
        })
    return out
