"""The versioned table of ``torch.ops._C*`` schemas that vLLM's Python needs at import time.

Which ops: every ``torch.ops._C*.<op>.<overload>`` that a vLLM module touches while it is
being imported (``compat/scan.py`` finds them; ``tests/test_compat_schemas.py`` re-derives
the set from the installed vLLM and fails when it differs from the row set here), plus
``scaled_fp4_quant.default``: defining ``scaled_fp4_quant.out`` makes vLLM's
``hasattr(torch.ops._C, "scaled_fp4_quant")`` true, and ``vllm/_custom_ops.py`` then calls
``register_fake("_C::scaled_fp4_quant")``, which needs the default overload to exist.

The strings are exact copies of the schemas in vLLM 0.33.0's kernel library
(``_C_stable_libtorch.abi3.so``; shared/research/vllm_upstream.md §5), spacing included.
For 0.32 the same strings are used: every call site in 0.32's ``_custom_ops.py`` and the
fusion passes passes the same arguments in the same order (checked by reading 0.32.0's
Python; 0.32's CUDA binary was not inspected).

Adding a vLLM line (e.g. the MetaX 0.23-0.26 line): add a tuple of rows and an entry in
``TABLES``; where one schema changed between versions, copy the row with the other string.
"""
from __future__ import annotations

from dataclasses import dataclass

# How a missing op gets a kernel when this package defines it:
REAL = "real"  # a torch implementation of vLLM's semantics (fallbacks.py / nvfp4.py)
STUB = "stub"  # schema + fake only; calling it on a device raises a clear error


@dataclass(frozen=True)
class OpSchema:
    schema: str  # exact text: "name[.overload](args) -> returns"
    fallback: str  # REAL or STUB
    namespace: str = "_C"
    # vLLM's _custom_ops registers its own fake for this op behind ``hasattr``. apply() imports
    # _custom_ops before defining anything, so that guard is already false for an op we add
    # and our fake is the only one (checked against vLLM's source by the schema test).
    vllm_registers_fake: bool = False

    @property
    def full_name(self) -> str:
        return self.schema.split("(", 1)[0].strip()

    @property
    def name(self) -> str:
        return self.full_name.split(".", 1)[0]

    @property
    def overload(self) -> str:
        """Overload name, ``"default"`` for the unnamed one."""
        parts = self.full_name.split(".", 1)
        return parts[1] if len(parts) == 2 else "default"

    @property
    def qualname(self) -> str:
        return f"{self.namespace}::{self.name}"

    @property
    def label(self) -> str:
        return f"{self.namespace}::{self.name}.{self.overload}"


_V0_33 = (
    OpSchema("silu_and_mul(Tensor! result, Tensor input) -> ()", REAL),
    OpSchema("silu_and_mul_quant(Tensor! result, Tensor input, Tensor scale) -> ()", REAL),
    OpSchema(
        "silu_and_mul_nvfp4_quant(Tensor! result, Tensor! result_block_scale, Tensor input, "
        "Tensor input_global_scale) -> ()",
        REAL,
    ),
    OpSchema(
        "silu_and_mul_per_block_quant(Tensor! out, Tensor input, Tensor! scales, int group_size, "
        "Tensor? scale_ub=None, bool is_scale_transposed=False) -> ()",
        REAL,
    ),
    OpSchema(
        "scaled_fp4_quant(Tensor input, Tensor input_scale, bool is_sf_swizzled_layout) -> (Tensor, Tensor)",
        REAL,
        vllm_registers_fake=True,
    ),
    OpSchema(
        "scaled_fp4_quant.out(Tensor input, Tensor input_scale, bool is_sf_swizzled_layout, *, "
        "Tensor(a!) output, Tensor(b!) output_scale) -> ()",
        REAL,
    ),
    OpSchema(
        "rotary_embedding(Tensor positions, Tensor! query, Tensor!? key, int head_size, "
        "Tensor cos_sin_cache, bool is_neox, int rope_dim_offset=0, bool inverse=False) -> ()",
        STUB,
    ),
    OpSchema("static_scaled_fp8_quant(Tensor! result, Tensor input, Tensor scale, int[]? group_shape=None) -> ()", REAL),
    OpSchema("dynamic_scaled_fp8_quant(Tensor! result, Tensor input, Tensor! scale) -> ()", REAL),
    OpSchema(
        "dynamic_per_token_scaled_fp8_quant(Tensor! result, Tensor input, Tensor! scale, Tensor? scale_ub) -> ()",
        REAL,
    ),
    OpSchema(
        "per_token_group_fp8_quant(Tensor input, Tensor! output_q, Tensor! output_s, int group_size, "
        "float eps, float fp8_min, float fp8_max, bool scale_ue8m0, bool dummy_is_scale_transposed, "
        "bool dummy_is_tma_aligned ) -> ()",
        REAL,
    ),
    OpSchema(
        "fused_qk_norm_rope(Tensor! qkv, int num_heads_q, int num_heads_k, int num_heads_v, int head_dim, "
        "float eps, Tensor q_weight, Tensor k_weight, Tensor cos_sin_cache, bool is_neox, "
        "Tensor position_ids, int forced_token_heads_per_warp=-1) -> ()",
        STUB,
    ),
    OpSchema("fused_add_rms_norm(Tensor! input, Tensor! residual, Tensor? weight, float epsilon) -> ()", REAL),
    OpSchema(
        "rms_norm_static_fp8_quant(Tensor! result, Tensor input, Tensor weight, Tensor scale, float epsilon) -> ()",
        REAL,
    ),
    OpSchema(
        "fused_add_rms_norm_static_fp8_quant(Tensor! result, Tensor input, Tensor! residual, Tensor weight, "
        "Tensor scale, float epsilon) -> ()",
        REAL,
    ),
    OpSchema(
        "rms_norm_dynamic_per_token_quant(Tensor! result, Tensor input, Tensor weight, Tensor! scale, "
        "float epsilon, Tensor? scale_ub, Tensor!? residual) -> ()",
        REAL,
    ),
    OpSchema(
        "rms_norm_per_block_quant(Tensor! result, Tensor input, Tensor weight, Tensor! scale, float epsilon, "
        "Tensor? scale_ub, Tensor!? residual, int group_size, bool is_scale_transposed) -> ()",
        REAL,
    ),
)

# (major, minor) of vLLM -> rows. 0.32 uses the 0.33 strings (see the module docstring).
TABLES: dict[tuple[int, int], tuple[OpSchema, ...]] = {
    (0, 32): _V0_33,
    (0, 33): _V0_33,
}


def parse_version(version: str) -> tuple[int, int]:
    parts = version.split("+", 1)[0].split(".")
    try:
        return int(parts[0]), int("".join(ch for ch in parts[1] if ch.isdigit()) or 0)
    except (IndexError, ValueError):
        raise ValueError(f"cannot read a vLLM version from {version!r}") from None


def table_for(version: str) -> tuple[tuple[int, int], tuple[OpSchema, ...], str]:
    """Rows for vLLM ``version``: ``(table key, rows, note)``.

    An unlisted version gets the newest table not newer than it (else the oldest); the note
    says so, so that doctor shows it.
    """
    want = parse_version(version)
    if want in TABLES:
        return want, TABLES[want], f"schema table {want[0]}.{want[1]}"
    older = [k for k in TABLES if k <= want]
    key = max(older) if older else min(TABLES)
    return key, TABLES[key], (
        f"no schema table for vLLM {version}; using the {key[0]}.{key[1]} table "
        "(add one to vllm_platform_ext/compat/schemas.py)"
    )
