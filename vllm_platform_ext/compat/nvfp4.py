"""Torch implementation (any device) and fakes of vLLM's NVFP4 quantization ops:
``scaled_fp4_quant`` (+ ``.out``) and ``silu_and_mul_nvfp4_quant``.

Format (vLLM ``_custom_ops.scaled_fp4_quant`` and ``nvfp4_emulation_utils.ref_nvfp4_quant``):

* blocks of 16 consecutive elements along the last dim; ``input_scale`` is the global scale
  ``g`` (float32, one value; callers use ``448 * 6 / amax``);
* block scale ``sf = e4m3(min(g * amax_block / 6, 448))``; the block is multiplied by
  ``g / sf`` (0 when ``sf == 0``), clamped to +-6 and rounded to the nearest E2M1 value
  {0, .5, 1, 1.5, 2, 3, 4, 6} (ties to even, as the hardware ``cvt.rn`` does); the sign is
  kept, so a small negative value becomes -0 (code 8);
* packing: element ``2i`` in the low nibble, ``2i+1`` in the high nibble of one uint8;
* scales: swizzled (``is_sf_swizzled_layout``): padded to ``round_up(m, 128)`` x
  ``round_up(n/16, 4)`` with zeros, tiled 128x4 in the 32x4x4 order of the PTX tcgen05
  scale-factor layout, stored as int32 [rows, cols/4]; linear: uint8 [m, n/16];
* ``output`` may be wider than the input (``padded_n``): the extra columns are written as
  zero values with zero scales.
"""
from __future__ import annotations

import torch

from vllm_platform_ext.compat.fallbacks import _check_float, _need, _silu_and_mul

BLOCK = 16
E2M1_MAX = 6.0
E4M3_MAX = 448.0
# Midpoints between E2M1 magnitudes; at the ones listed in _TIE_UP a tie rounds up (to the
# value with the even mantissa), at the others down.
_BOUNDS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
_TIE_UP = (0.75, 1.75, 3.5)


def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def scale_shape(m: int, n: int, swizzled: bool) -> tuple[tuple[int, int], torch.dtype]:
    """Shape and dtype of the scale tensor for an [m, n] input (n: padded width)."""
    if swizzled:
        return (_round_up(m, 128), _round_up(n // BLOCK, 4) // 4), torch.int32
    return (m, n // BLOCK), torch.uint8


def e2m1_codes(x: torch.Tensor) -> torch.Tensor:
    """Nearest E2M1 code (uint8, 0..15) of float32 ``x`` (already clamped to +-6)."""
    a = x.abs()
    bounds = torch.tensor(_BOUNDS, dtype=a.dtype, device=a.device)
    code = torch.bucketize(a, bounds, right=False)
    code = code + torch.isin(a, torch.tensor(_TIE_UP, dtype=a.dtype, device=a.device)).to(code.dtype)
    return (code | torch.where(torch.signbit(x), 8, 0)).to(torch.uint8)


def swizzle_scales(sf: torch.Tensor) -> torch.Tensor:
    """[m, k] uint8 block scales -> int32 [round_up(m,128), round_up(k,4)/4] tiled layout."""
    m, k = sf.shape
    pm, pk = _round_up(m, 128), _round_up(k, 4)
    padded = torch.zeros((pm, pk), dtype=torch.uint8, device=sf.device)
    padded[:m, :k] = sf
    tiles = padded.reshape(pm // 128, 4, 32, pk // 4, 4).permute(0, 3, 2, 1, 4)
    return tiles.contiguous().view(torch.int32).reshape(pm, pk // 4)


def _quantize_into(op: str, x: torch.Tensor, global_scale: torch.Tensor, swizzled: bool,
                   output: torch.Tensor, output_scale: torch.Tensor) -> None:
    m, n = x.shape
    width = output.shape[1] * 2
    if width > n:
        x = torch.nn.functional.pad(x, (0, width - n))
    g = global_scale.float().reshape(())
    blocks = x.float().reshape(m, width // BLOCK, BLOCK)
    sf = (g * (blocks.abs().amax(dim=-1) / E2M1_MAX)).clamp(max=E4M3_MAX).to(torch.float8_e4m3fn)
    sf_f = sf.float()
    factor = torch.where(sf_f == 0, torch.zeros_like(sf_f), 1.0 / (sf_f * (1.0 / g)))
    codes = e2m1_codes((blocks * factor.unsqueeze(-1)).clamp(-E2M1_MAX, E2M1_MAX)).reshape(m, width)
    output.copy_(codes[:, 0::2] | (codes[:, 1::2] << 4))
    sf_bytes = sf.view(torch.uint8)
    if swizzled:
        output_scale.copy_(swizzle_scales(sf_bytes))
    else:
        output_scale.copy_(sf_bytes.view(output_scale.dtype) if output_scale.dtype != torch.uint8 else sf_bytes)


def _check_fp4(op: str, input, input_scale, swizzled: bool, output, output_scale) -> None:
    _need(input.dim() == 2, op, f"input must be 2-D [m, n], got shape {tuple(input.shape)}")
    _need(input.dtype in (torch.float16, torch.bfloat16), op,
          f"input must be float16 or bfloat16, got {input.dtype}", TypeError)
    m, n = input.shape
    _need(n % BLOCK == 0, op, f"last dim must be a multiple of {BLOCK}, got {n}")
    _need(input_scale.numel() == 1 and input_scale.dtype == torch.float32, op,
          f"input_scale must be one float32 value, got shape {tuple(input_scale.shape)} {input_scale.dtype}")
    _need(output.dtype == torch.uint8 and output.dim() == 2 and output.shape[0] == m, op,
          f"output must be uint8 [{m}, >= {n // 2}], got {tuple(output.shape)} {output.dtype}")
    width = output.shape[1] * 2
    _need(width >= n and width % BLOCK == 0, op, f"output width {width} must be >= {n} and a multiple of {BLOCK}")
    shape, dtype = scale_shape(m, width, swizzled)
    ok_dtypes = (dtype,) if swizzled else (torch.uint8, torch.float8_e4m3fn)
    _need(tuple(output_scale.shape) == shape and output_scale.dtype in ok_dtypes, op,
          f"output_scale must be {shape} {dtype} (swizzled={swizzled}), got "
          f"{tuple(output_scale.shape)} {output_scale.dtype}")


def check_scaled_fp4_quant_out(input, input_scale, is_sf_swizzled_layout, *, output, output_scale) -> None:
    _check_fp4("scaled_fp4_quant.out", input, input_scale, is_sf_swizzled_layout, output, output_scale)


def scaled_fp4_quant_out(input, input_scale, is_sf_swizzled_layout, *, output, output_scale) -> None:
    check_scaled_fp4_quant_out(input, input_scale, is_sf_swizzled_layout, output=output, output_scale=output_scale)
    _quantize_into("scaled_fp4_quant.out", input, input_scale, is_sf_swizzled_layout, output, output_scale)


def _alloc(input, is_sf_swizzled_layout):
    _need(input.dim() >= 1, "scaled_fp4_quant", "input must have at least one dim")
    n = input.shape[-1]
    m = input.numel() // n if n else 0
    shape, dtype = scale_shape(m, n, is_sf_swizzled_layout)
    out = input.new_empty((m, n // 2), dtype=torch.uint8)
    return out, input.new_empty(shape, dtype=dtype), m, n


def scaled_fp4_quant(input, input_scale, is_sf_swizzled_layout):
    output, output_scale, m, n = _alloc(input, is_sf_swizzled_layout)
    scaled_fp4_quant_out(input.reshape(m, n), input_scale, is_sf_swizzled_layout,
                         output=output, output_scale=output_scale)
    return output, output_scale


def scaled_fp4_quant_fake(input, input_scale, is_sf_swizzled_layout):
    output, output_scale, m, n = _alloc(input, is_sf_swizzled_layout)
    _check_fp4("scaled_fp4_quant", input.reshape(m, n), input_scale, is_sf_swizzled_layout, output, output_scale)
    return output, output_scale


def check_silu_and_mul_nvfp4_quant(result, result_block_scale, input, input_global_scale) -> None:
    op = "silu_and_mul_nvfp4_quant"
    _check_float(op, "input", input)
    _need(input.dim() == 2, op, f"input must be 2-D [m, 2*n], got shape {tuple(input.shape)}")
    _need(input.shape[-1] % 2 == 0, op, f"input last dim must be even, got {input.shape[-1]}")
    m, n = input.shape[0], input.shape[1] // 2
    _need(result.dim() == 2 and result.shape[0] == m, op, f"result must be uint8 [{m}, {n // 2}], got {tuple(result.shape)}")
    swizzled = result_block_scale.dtype == torch.int32
    _check_fp4(op, input.new_empty((m, n)), input_global_scale, swizzled, result, result_block_scale)


def silu_and_mul_nvfp4_quant(result, result_block_scale, input, input_global_scale) -> None:
    check_silu_and_mul_nvfp4_quant(result, result_block_scale, input, input_global_scale)
    act = _silu_and_mul(input).to(input.dtype)
    _quantize_into("silu_and_mul_nvfp4_quant", act, input_global_scale, result_block_scale.dtype == torch.int32,
                   result, result_block_scale)
