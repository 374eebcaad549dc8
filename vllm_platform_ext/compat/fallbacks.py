"""Torch implementations (any device) and fakes of vLLM's fp8 / RMSNorm / SiLU ``_C`` ops,
for backends whose kernel library lacks them. NVFP4 lives in ``nvfp4.py``.

Semantics follow vLLM's kernels and its Python baselines (``vllm/kernels/helion/ops/*``
``baseline``, ``_custom_ops.py``, ``fp8_utils.per_token_group_quant_fp8``):

* quantized value ``q = clamp(x / scale, qmin, qmax)`` cast to the result dtype (int8 rounds
  half to even first); fp8 e4m3fn range +-448, e4m3fnuz +-224 (vLLM's choice on ROCm);
* dynamic scales ``amax / qmax`` clamped below by ``1 / (qmax * 512)`` (fp8) or float32
  eps (int8); ``scale_ub`` caps ``amax`` first;
* RMSNorm: ``(x * rsqrt(mean(x^2) + eps))`` computed in float32, cast to the input dtype,
  times ``weight`` in the input dtype; the fused-add variants write ``input + residual``
  (rounded to the input dtype) into ``residual`` and normalize that;
* SiLU-and-mul: ``silu(x[..., :d]) * x[..., d:]`` in float32.

Deviation: ``dynamic_scaled_fp8_quant`` clamps its scale below like the per-token op, so an
all-zero input gives zeros instead of NaN.

Every op checks shapes and dtypes first (the same check runs in its fake, so bad input fails
under ``torch.compile`` too) and raises ``ValueError`` / ``TypeError`` naming the op.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

FP8_TYPES = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)
FLOAT_TYPES = (torch.float16, torch.bfloat16, torch.float32)


def _need(ok: bool, op: str, msg: str, exc: type[Exception] = ValueError) -> None:
    if not ok:
        raise exc(f"_C::{op} (vllm_platform_ext torch fallback): {msg}")


def quant_range(dtype: torch.dtype) -> tuple[float, float, float]:
    """``(qmin, qmax, smallest scale)`` of a quantized result dtype."""
    if dtype == torch.int8:
        return -128.0, 127.0, float(torch.finfo(torch.float32).eps)
    if dtype == torch.float8_e4m3fnuz:
        return -224.0, 224.0, 1.0 / (224.0 * 512.0)
    if dtype == torch.float8_e4m3fn:
        qmax = float(torch.finfo(dtype).max)
        return -qmax, qmax, 1.0 / (qmax * 512.0)
    raise TypeError(f"unsupported quantized dtype {dtype}")


def _quantize(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    qmin, qmax, _ = quant_range(dtype)
    y = (x.float() / scale).clamp(qmin, qmax)
    if dtype == torch.int8:
        y = y.round()
    return y.to(dtype)


def _dynamic_scale(amax: torch.Tensor, dtype: torch.dtype, scale_ub: torch.Tensor | None) -> torch.Tensor:
    _, qmax, min_scale = quant_range(dtype)
    amax = amax.float()
    if scale_ub is not None:
        amax = torch.minimum(amax, scale_ub.float().reshape(()))
    return (amax / qmax).clamp(min=min_scale)


# ---- shared checks ---------------------------------------------------------------------


def _check_float(op: str, name: str, t: torch.Tensor) -> None:
    _need(t.dtype in FLOAT_TYPES, op, f"{name} must be float16/bfloat16/float32, got {t.dtype}", TypeError)


def _check_quant_out(op: str, name: str, t: torch.Tensor, allowed=FP8_TYPES) -> None:
    _need(t.dtype in allowed, op, f"{name} must have dtype in {[str(d) for d in allowed]}, got {t.dtype}", TypeError)


def _check_same_shape(op: str, a_name: str, a: torch.Tensor, b_name: str, b: torch.Tensor) -> None:
    _need(a.shape == b.shape, op, f"{a_name} shape {tuple(a.shape)} != {b_name} shape {tuple(b.shape)}")


def _check_scalar_f32(op: str, name: str, t: torch.Tensor | None) -> None:
    if t is None:
        return
    _need(t.numel() == 1, op, f"{name} must hold one value, got shape {tuple(t.shape)}")
    _need(t.dtype == torch.float32, op, f"{name} must be float32, got {t.dtype}", TypeError)


def _check_weight(op: str, weight: torch.Tensor | None, x: torch.Tensor) -> None:
    if weight is None:
        return
    _need(weight.shape == (x.shape[-1],), op, f"weight shape {tuple(weight.shape)} != ({x.shape[-1]},)")
    _need(weight.dtype == x.dtype, op, f"weight dtype {weight.dtype} != input dtype {x.dtype}", TypeError)


def _check_groups(op: str, width: int, group_size: int) -> int:
    _need(group_size > 0 and width % group_size == 0, op, f"width {width} is not a multiple of group_size {group_size}")
    return width // group_size


def _check_scale_2d(op: str, name: str, scale: torch.Tensor, shape: tuple[int, int]) -> None:
    _need(tuple(scale.shape) == shape, op, f"{name} shape {tuple(scale.shape)} != expected {shape}")
    _need(scale.dtype == torch.float32, op, f"{name} must be float32, got {scale.dtype}", TypeError)


# ---- math ------------------------------------------------------------------------------


def _rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    xf = x.float()
    y = (xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)).to(x.dtype)
    return y if weight is None else y * weight


def _add_residual(x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    z = (x.float() + residual.float()).to(x.dtype)
    residual.copy_(z)
    return z


def _silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    xf = x.float()
    return F.silu(xf[..., :d]) * xf[..., d:]


def _group_quant(y: torch.Tensor, out: torch.Tensor, scales: torch.Tensor, group_size: int,
                 scale_ub: torch.Tensor | None) -> None:
    """Per-(row, group) dynamic quantization of ``y`` ([rows, width], float) into ``out``."""
    rows, width = y.shape
    g = y.reshape(rows, width // group_size, group_size).float()
    s = _dynamic_scale(g.abs().amax(dim=-1), out.dtype, scale_ub)
    out.copy_(_quantize(g, s.unsqueeze(-1), out.dtype).reshape(out.shape))
    scales.copy_(s)


# ---- ops: check(args) runs in the fake and before the real math ------------------------


def check_silu_and_mul(result, input) -> None:
    op = "silu_and_mul"
    _check_float(op, "input", input)
    _need(input.shape[-1] % 2 == 0, op, f"input last dim must be even, got {input.shape[-1]}")
    _need(result.shape == (*input.shape[:-1], input.shape[-1] // 2), op,
          f"result shape {tuple(result.shape)} != input shape with half the last dim")


def silu_and_mul(result, input) -> None:
    check_silu_and_mul(result, input)
    result.copy_(_silu_and_mul(input).to(result.dtype))


def check_silu_and_mul_quant(result, input, scale) -> None:
    check_silu_and_mul(result, input)
    _check_quant_out("silu_and_mul_quant", "result", result)
    _check_scalar_f32("silu_and_mul_quant", "scale", scale)


def silu_and_mul_quant(result, input, scale) -> None:
    check_silu_and_mul_quant(result, input, scale)
    result.copy_(_quantize(_silu_and_mul(input), scale.float().reshape(()), result.dtype))


def check_silu_and_mul_per_block_quant(out, input, scales, group_size, scale_ub=None, is_scale_transposed=False) -> None:
    op = "silu_and_mul_per_block_quant"
    _need(input.dim() == 2, op, f"input must be 2-D [tokens, 2*hidden], got shape {tuple(input.shape)}")
    check_silu_and_mul(out, input)
    _check_quant_out(op, "out", out, (*FP8_TYPES, torch.int8))
    groups = _check_groups(op, out.shape[-1], group_size)
    _check_scale_2d(op, "scales", scales, (out.shape[0], groups))
    _check_scalar_f32(op, "scale_ub", scale_ub)


def silu_and_mul_per_block_quant(out, input, scales, group_size, scale_ub=None, is_scale_transposed=False) -> None:
    check_silu_and_mul_per_block_quant(out, input, scales, group_size, scale_ub, is_scale_transposed)
    _group_quant(_silu_and_mul(input), out, scales, group_size, scale_ub)


def _check_fp8_pair(op, result, input) -> None:
    _check_float(op, "input", input)
    _check_quant_out(op, "result", result)
    _check_same_shape(op, "result", result, "input", input)


def _static_group(op: str, shape: tuple[int, ...], scale: torch.Tensor, group_shape) -> tuple[int, int]:
    """Group sizes (rows, cols) of a static scale over a [M, N] input."""
    _need(len(shape) == 2 or scale.numel() == 1, op, f"grouped scales need a 2-D input, got {tuple(shape)}")
    if scale.numel() == 1:
        return -1, -1
    m, n = shape
    if group_shape is not None:
        _need(len(group_shape) == 2, op, f"group_shape must have 2 entries, got {list(group_shape)}")
        gm, gn = (m if group_shape[0] == -1 else group_shape[0]), (n if group_shape[1] == -1 else group_shape[1])
    else:
        _need(scale.dim() == 2, op, f"a {scale.dim()}-D scale needs group_shape")
        gm, gn = m // max(scale.shape[0], 1), n // max(scale.shape[1], 1)
    _need(gm > 0 and gn > 0 and m % gm == 0 and n % gn == 0, op, f"group shape ({gm}, {gn}) does not tile input {tuple(shape)}")
    _need(scale.numel() == (m // gm) * (n // gn), op,
          f"scale has {scale.numel()} values, group shape ({gm}, {gn}) over {tuple(shape)} needs {(m // gm) * (n // gn)}")
    return gm, gn


def check_static_scaled_fp8_quant(result, input, scale, group_shape=None) -> None:
    op = "static_scaled_fp8_quant"
    _check_fp8_pair(op, result, input)
    _need(scale.dtype == torch.float32, op, f"scale must be float32, got {scale.dtype}", TypeError)
    _static_group(op, tuple(input.shape), scale, group_shape)


def static_scaled_fp8_quant(result, input, scale, group_shape=None) -> None:
    check_static_scaled_fp8_quant(result, input, scale, group_shape)
    gm, gn = _static_group("static_scaled_fp8_quant", tuple(input.shape), scale, group_shape)
    if gm == -1:
        s = scale.float().reshape(())
    else:
        m, n = input.shape
        s = scale.float().reshape(m // gm, n // gn).repeat_interleave(gm, 0).repeat_interleave(gn, 1)
    result.copy_(_quantize(input, s, result.dtype))


def check_dynamic_scaled_fp8_quant(result, input, scale) -> None:
    op = "dynamic_scaled_fp8_quant"
    _check_fp8_pair(op, result, input)
    _need(scale.numel() == 1 and scale.dtype == torch.float32, op,
          f"scale must be one float32 value, got shape {tuple(scale.shape)} {scale.dtype}")


def dynamic_scaled_fp8_quant(result, input, scale) -> None:
    check_dynamic_scaled_fp8_quant(result, input, scale)
    s = _dynamic_scale(input.abs().amax() if input.numel() else input.new_zeros(()), result.dtype, None)
    scale.copy_(s.reshape(scale.shape))
    result.copy_(_quantize(input, s, result.dtype))


def _check_per_token(op, result, input, scale, scale_ub) -> None:
    rows = input.numel() // max(input.shape[-1], 1)
    _need(scale.numel() == rows and scale.dtype == torch.float32, op,
          f"scale must hold {rows} float32 values (one per token), got shape {tuple(scale.shape)} {scale.dtype}")
    _check_scalar_f32(op, "scale_ub", scale_ub)


def check_dynamic_per_token_scaled_fp8_quant(result, input, scale, scale_ub) -> None:
    op = "dynamic_per_token_scaled_fp8_quant"
    _check_fp8_pair(op, result, input)
    _check_per_token(op, result, input, scale, scale_ub)


def dynamic_per_token_scaled_fp8_quant(result, input, scale, scale_ub) -> None:
    check_dynamic_per_token_scaled_fp8_quant(result, input, scale, scale_ub)
    x = input.reshape(-1, input.shape[-1])
    s = _dynamic_scale(x.abs().amax(dim=-1, keepdim=True), result.dtype, scale_ub)
    scale.copy_(s.reshape(scale.shape))
    result.copy_(_quantize(x, s, result.dtype).reshape(result.shape))


def check_per_token_group_fp8_quant(input, output_q, output_s, group_size, eps, fp8_min, fp8_max,
                                    scale_ue8m0, dummy_is_scale_transposed, dummy_is_tma_aligned) -> None:
    op = "per_token_group_fp8_quant"
    _check_float(op, "input", input)
    _check_quant_out(op, "output_q", output_q)
    _check_same_shape(op, "output_q", output_q, "input", input)
    groups = _check_groups(op, input.shape[-1], group_size)
    _need(fp8_max > 0 and fp8_min < 0, op, f"bad fp8 range [{fp8_min}, {fp8_max}]")
    want = (*input.shape[:-1], groups)
    _need(tuple(output_s.shape) == want, op, f"output_s shape {tuple(output_s.shape)} != expected {want}")
    _need(output_s.dtype == torch.float32, op, f"output_s must be float32, got {output_s.dtype}", TypeError)


def per_token_group_fp8_quant(input, output_q, output_s, group_size, eps, fp8_min, fp8_max,
                              scale_ue8m0, dummy_is_scale_transposed, dummy_is_tma_aligned) -> None:
    check_per_token_group_fp8_quant(input, output_q, output_s, group_size, eps, fp8_min, fp8_max,
                                    scale_ue8m0, dummy_is_scale_transposed, dummy_is_tma_aligned)
    g = input.float().reshape(*input.shape[:-1], -1, group_size)
    s = g.abs().amax(dim=-1).clamp(min=eps) * (1.0 / fp8_max)
    if scale_ue8m0:
        s = torch.exp2(torch.ceil(torch.log2(s)))
    q = (g / s.unsqueeze(-1)).clamp(fp8_min, fp8_max)
    output_q.copy_(q.reshape(input.shape).to(output_q.dtype))
    output_s.copy_(s)


def check_fused_add_rms_norm(input, residual, weight, epsilon) -> None:
    op = "fused_add_rms_norm"
    _check_float(op, "input", input)
    _check_same_shape(op, "residual", residual, "input", input)
    _need(residual.dtype == input.dtype, op, f"residual dtype {residual.dtype} != input dtype {input.dtype}", TypeError)
    _check_weight(op, weight, input)


def fused_add_rms_norm(input, residual, weight, epsilon) -> None:
    check_fused_add_rms_norm(input, residual, weight, epsilon)
    input.copy_(_rms_norm(_add_residual(input, residual), weight, epsilon))


def _check_rms_quant(op, result, input, weight, residual, quant_types=FP8_TYPES) -> None:
    _check_float(op, "input", input)
    _check_quant_out(op, "result", result, quant_types)
    _check_same_shape(op, "result", result, "input", input)
    _check_weight(op, weight, input)
    if residual is not None:
        _check_same_shape(op, "residual", residual, "input", input)
        _need(residual.dtype == input.dtype, op, f"residual dtype {residual.dtype} != input dtype {input.dtype}", TypeError)


def check_rms_norm_static_fp8_quant(result, input, weight, scale, epsilon) -> None:
    _check_rms_quant("rms_norm_static_fp8_quant", result, input, weight, None)
    _check_scalar_f32("rms_norm_static_fp8_quant", "scale", scale)


def rms_norm_static_fp8_quant(result, input, weight, scale, epsilon) -> None:
    check_rms_norm_static_fp8_quant(result, input, weight, scale, epsilon)
    result.copy_(_quantize(_rms_norm(input, weight, epsilon), scale.float().reshape(()), result.dtype))


def check_fused_add_rms_norm_static_fp8_quant(result, input, residual, weight, scale, epsilon) -> None:
    _check_rms_quant("fused_add_rms_norm_static_fp8_quant", result, input, weight, residual)
    _check_scalar_f32("fused_add_rms_norm_static_fp8_quant", "scale", scale)


def fused_add_rms_norm_static_fp8_quant(result, input, residual, weight, scale, epsilon) -> None:
    check_fused_add_rms_norm_static_fp8_quant(result, input, residual, weight, scale, epsilon)
    normed = _rms_norm(_add_residual(input, residual), weight, epsilon)
    result.copy_(_quantize(normed, scale.float().reshape(()), result.dtype))


def check_rms_norm_dynamic_per_token_quant(result, input, weight, scale, epsilon, scale_ub, residual) -> None:
    op = "rms_norm_dynamic_per_token_quant"
    _check_rms_quant(op, result, input, weight, residual, (*FP8_TYPES, torch.int8))
    _check_per_token(op, result, input, scale, scale_ub)


def rms_norm_dynamic_per_token_quant(result, input, weight, scale, epsilon, scale_ub, residual) -> None:
    check_rms_norm_dynamic_per_token_quant(result, input, weight, scale, epsilon, scale_ub, residual)
    x = input if residual is None else _add_residual(input, residual)
    normed = _rms_norm(x, weight, epsilon).reshape(-1, input.shape[-1])
    s = _dynamic_scale(normed.float().abs().amax(dim=-1, keepdim=True), result.dtype, scale_ub)
    scale.copy_(s.reshape(scale.shape))
    result.copy_(_quantize(normed, s, result.dtype).reshape(result.shape))


def check_rms_norm_per_block_quant(result, input, weight, scale, epsilon, scale_ub, residual, group_size,
                                   is_scale_transposed) -> None:
    op = "rms_norm_per_block_quant"
    _check_rms_quant(op, result, input, weight, residual, (*FP8_TYPES, torch.int8))
    groups = _check_groups(op, input.shape[-1], group_size)
    _check_scale_2d(op, "scale", scale, (input.numel() // input.shape[-1], groups))
    _check_scalar_f32(op, "scale_ub", scale_ub)


def rms_norm_per_block_quant(result, input, weight, scale, epsilon, scale_ub, residual, group_size,
                             is_scale_transposed) -> None:
    check_rms_norm_per_block_quant(result, input, weight, scale, epsilon, scale_ub, residual, group_size,
                                   is_scale_transposed)
    x = input if residual is None else _add_residual(input, residual)
    normed = _rms_norm(x, weight, epsilon).reshape(-1, input.shape[-1])
    _group_quant(normed, result, scale, group_size, scale_ub)


def _unsupported(name: str) -> Callable[..., None]:
    def kernel(*args, **kwargs) -> None:
        raise NotImplementedError(
            f"_C::{name} was defined by vllm_platform_ext so that vLLM modules import on this backend; "
            "there is no kernel for it here (schema and fake only). Provide a real kernel in the "
            "platform's kernel library or disable the feature that calls it."
        )

    kernel.__name__ = f"{name}_unsupported"
    return kernel


def _noop_fake(check: Callable[..., None] | None) -> Callable[..., None]:
    def fake(*args, **kwargs) -> None:
        if check is not None:
            check(*args, **kwargs)
        return None

    return fake


# name -> (real kernel, fake). Ops listed in schemas.py as STUB get (_unsupported, no-op fake).
KERNELS: dict[str, tuple[Callable[..., None], Callable[..., None]]] = {
    fn.__name__: (fn, _noop_fake(check))
    for fn, check in (
        (silu_and_mul, check_silu_and_mul),
        (silu_and_mul_quant, check_silu_and_mul_quant),
        (silu_and_mul_per_block_quant, check_silu_and_mul_per_block_quant),
        (static_scaled_fp8_quant, check_static_scaled_fp8_quant),
        (dynamic_scaled_fp8_quant, check_dynamic_scaled_fp8_quant),
        (dynamic_per_token_scaled_fp8_quant, check_dynamic_per_token_scaled_fp8_quant),
        (per_token_group_fp8_quant, check_per_token_group_fp8_quant),
        (fused_add_rms_norm, check_fused_add_rms_norm),
        (rms_norm_static_fp8_quant, check_rms_norm_static_fp8_quant),
        (fused_add_rms_norm_static_fp8_quant, check_fused_add_rms_norm_static_fp8_quant),
        (rms_norm_dynamic_per_token_quant, check_rms_norm_dynamic_per_token_quant),
        (rms_norm_per_block_quant, check_rms_norm_per_block_quant),
    )
}


def stub_kernels(name: str) -> tuple[Callable[..., None], Callable[..., None]]:
    return _unsupported(name), _noop_fake(None)
