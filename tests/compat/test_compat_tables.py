"""Every vLLM line's compat schema table (0.22-0.34, the MetaX lines 0.22-0.26 among them) against that
line's own wheel: the ops its Python touches at import are all in the table and nothing else
is, each schema is the one its kernel library registers, and ``real`` rows have a torch kernel
that takes exactly those arguments.

These checks read the wheels with the same scanner that derived the tables; the independent
check, every line's real Python imported with ``_C`` absent, is tests/compat/test_compat_lines_import.py.

The wheels are fetched (not installed) by ``python ci/tools/compat_tables.py fetch``, which
``ci/setup.sh test`` runs; their sha256 must be the one the table records.
"""
from __future__ import annotations

import pytest
import torch

from conftest import table_wheel
from vllm_platform_ext.compat import registry, scan, schemas
from vllm_platform_ext.compat.schemas import REAL

METAX_LINES = [(0, 22), (0, 23), (0, 24), (0, 25), (0, 26)]
LINES = sorted(schemas.TABLES)


def test_every_served_line_has_its_own_table():
    assert set(METAX_LINES + [(0, 32), (0, 33)]) <= set(LINES)
    for key in LINES:
        assert schemas.table_for(schemas.TABLE_SOURCES[key]["vllm"])[0] == key


@pytest.fixture(scope="module", params=LINES, ids=lambda k: f"vllm-{k[0]}.{k[1]}")
def line(request):
    key = request.param
    wheel = table_wheel(key)
    uses = scan.scan_wheel(wheel)
    return key, uses, scan.wheel_library_schemas(wheel)


def test_import_time_ops_are_all_in_the_table(line):
    key, uses, _ = line
    table = {(r.namespace, r.name, r.overload) for r in schemas.TABLES[key]}
    where = {(u.namespace, u.op, u.overload or "default"): f"{u.file}:{u.line}" for u in uses}
    derived = scan.required_ops(uses)
    missing = sorted(derived - table)
    assert not missing, f"vLLM {key}: touched at import but not in the table: {[(m, where.get(m)) for m in missing]}"
    assert not sorted(table - derived), f"vLLM {key}: table rows its Python no longer touches: {sorted(table - derived)}"


def test_schemas_are_what_the_kernel_library_registers(line):
    key, _, library = line
    for row in schemas.TABLES[key]:
        text = library.get((row.namespace, row.full_name))
        assert text is not None, f"vLLM {key}: {row.label} is not registered by its kernel libraries"
        assert str(torch._C.parse_schema(text)) == str(torch._C.parse_schema(row.schema)), (row.label, text)


def test_fallback_kind_and_fake_flag(line):
    key, uses, _ = line
    faked = {(u.namespace, u.op, u.overload) for u in uses if u.kind == "fake"}
    for row in schemas.TABLES[key]:
        assert (row.fallback == REAL) == registry.real_kernel_fits(row), row
        assert row.vllm_registers_fake == ((row.namespace, row.name, row.overload) in faked), row.label


def test_tables_differ_where_the_libraries_do():
    """Why one table per line: vLLM 0.22/0.23 register ``fused_add_rms_norm`` with a required
    weight, 0.24 on with an optional one; a table from another line would report a mismatch."""
    def schema(key, name):
        return next(str(torch._C.parse_schema(r.schema)) for r in schemas.TABLES[key] if r.name == name)

    assert "Tensor weight" in schema((0, 23), "fused_add_rms_norm")
    assert "Tensor? weight" in schema((0, 24), "fused_add_rms_norm")
    assert schema((0, 23), "fused_add_rms_norm") != schema((0, 33), "fused_add_rms_norm")


def test_real_kernel_fit_rejects_other_arguments():
    from vllm_platform_ext.compat.schemas import STUB, OpSchema

    assert registry.real_kernel_fits(OpSchema("silu_and_mul(Tensor! result, Tensor input) -> ()", STUB))
    assert not registry.real_kernel_fits(OpSchema("silu_and_mul(Tensor! out, Tensor input) -> ()", STUB))
    assert not registry.real_kernel_fits(OpSchema("silu_and_mul(Tensor! result, Tensor input, float s) -> ()", STUB))
    assert not registry.real_kernel_fits(OpSchema("rotary_embedding(Tensor positions) -> ()", STUB))
