"""TurboQuant KV-cache layout: presets, slot sizes, bit packing, fp8 bytes, rotation, codebooks.

Matches the byte layout vLLM 0.32 writes (``triton_turboquant_store``): one byte slot per
(block, position, kv head)::

    [ key: fp8 bytes (D)           | value: packed idx | fp16 scale | fp16 zero ]   k8v4
    [ key: packed idx | fp16 ||k|| | value: packed idx | fp16 scale | fp16 zero ]   MSE presets

4-bit fields hold two indices per byte (even element in the low nibble); 3-bit fields hold
eight indices in three little-endian bytes. The slot is padded to an even size.

Pure torch (no Triton, no vLLM).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import torch

PRESETS: dict[str, tuple[int, int, bool]] = {
    # name: (key_quant_bits, value_quant_bits, norm_correction); 8 key bits = fp8 keys
    "turboquant_k8v4": (8, 4, False),
    "turboquant_4bit_nc": (4, 4, True),
    "turboquant_k3v4_nc": (3, 4, True),
    "turboquant_3bit_nc": (3, 3, True),
}


class TurboQuantLayoutError(ValueError):
    """Unknown preset or a head dim the layout cannot hold."""


@dataclass(frozen=True)
class TQLayout:
    preset: str
    head_dim: int
    key_fp8: bool
    key_bits: int  # MSE key bits (0 for fp8 keys)
    value_bits: int
    norm_correction: bool

    @property
    def centroid_bits(self) -> int:
        """Bits of the Lloyd-Max codebook vLLM builds (value bits for fp8-key presets)."""
        return self.value_bits if self.key_fp8 else self.key_bits

    @property
    def mse_bytes(self) -> int:
        return 0 if self.key_fp8 else math.ceil(self.head_dim * self.key_bits / 8)

    @property
    def key_packed_size(self) -> int:
        return self.head_dim if self.key_fp8 else self.mse_bytes + 2

    @property
    def value_data_bytes(self) -> int:
        return math.ceil(self.head_dim * self.value_bits / 8)

    @property
    def value_packed_size(self) -> int:
        return self.value_data_bytes + 4

    @property
    def slot_size(self) -> int:
        return self.key_packed_size + self.value_packed_size

    @property
    def slot_size_aligned(self) -> int:
        return self.slot_size + self.slot_size % 2

    # byte offsets inside a slot
    @property
    def norm_offset(self) -> int:
        return self.mse_bytes

    @property
    def value_offset(self) -> int:
        return self.key_packed_size

    @property
    def scale_offset(self) -> int:
        return self.key_packed_size + self.value_data_bytes


def layout_for(preset: str, head_dim: int) -> TQLayout:
    if preset not in PRESETS:
        raise TurboQuantLayoutError(f"unknown TurboQuant preset {preset!r}; expected one of {sorted(PRESETS)}")
    if head_dim <= 0 or head_dim & (head_dim - 1) or head_dim < 16:
        raise TurboQuantLayoutError(
            f"TurboQuant head dim {head_dim} unsupported: needs a power of two >= 16 "
            "(Sylvester Hadamard rotation, 3-bit groups of 8)"
        )
    kb, vb, nc = PRESETS[preset]
    return TQLayout(preset, head_dim, kb == 8, 0 if kb == 8 else kb, vb, nc)


# --------------------------------------------------------------------------------------
# bit packing (LSB first, little endian) for 3- and 4-bit indices
# --------------------------------------------------------------------------------------
def pack_indices(idx: torch.Tensor, bits: int) -> torch.Tensor:
    """``idx[..., D]`` (ints in [0, 2**bits)) -> ``uint8[..., ceil(D*bits/8)]``."""
    d = idx.shape[-1]
    v = idx.to(torch.int64)
    if bits == 4:
        if d % 2:
            raise TurboQuantLayoutError(f"4-bit packing needs an even length, got {d}")
        v = v.reshape(*v.shape[:-1], d // 2, 2)
        return ((v[..., 0] & 0xF) | ((v[..., 1] & 0xF) << 4)).to(torch.uint8)
    if bits == 3:
        if d % 8:
            raise TurboQuantLayoutError(f"3-bit packing needs a multiple of 8, got {d}")
        v = (v & 0x7).reshape(*v.shape[:-1], d // 8, 8)
        word = (v << (torch.arange(8, device=v.device) * 3)).sum(-1)
        out = torch.stack([word & 0xFF, (word >> 8) & 0xFF, (word >> 16) & 0xFF], dim=-1)
        return out.reshape(*v.shape[:-2], d // 8 * 3).to(torch.uint8)
    raise TurboQuantLayoutError(f"unsupported index width {bits} bits (3 or 4)")


def unpack_indices(packed: torch.Tensor, bits: int, d: int) -> torch.Tensor:
    """Inverse of :func:`pack_indices`: ``uint8[..., nbytes]`` -> ``int64[..., d]``."""
    p = packed.to(torch.int64)
    if bits == 4:
        return torch.stack([p & 0xF, (p >> 4) & 0xF], dim=-1).reshape(*p.shape[:-1], d)
    if bits == 3:
        g = p.reshape(*p.shape[:-1], d // 8, 3)
        word = g[..., 0] | (g[..., 1] << 8) | (g[..., 2] << 16)
        return ((word[..., None] >> (torch.arange(8, device=p.device) * 3)) & 0x7).reshape(*p.shape[:-1], d)
    raise TurboQuantLayoutError(f"unsupported index width {bits} bits (3 or 4)")


def fp16_to_bytes(x: torch.Tensor) -> torch.Tensor:
    """``float[...]`` -> ``uint8[..., 2]`` little-endian fp16 bytes."""
    u = x.to(torch.float16).contiguous().view(torch.int16).to(torch.int32) & 0xFFFF
    return torch.stack([u & 0xFF, u >> 8], dim=-1).to(torch.uint8)


def bytes_to_fp16(b: torch.Tensor) -> torch.Tensor:
    """``uint8[..., 2]`` -> ``float32[...]``."""
    u = b[..., 0].to(torch.int32) | (b[..., 1].to(torch.int32) << 8)
    u = torch.where(u >= 0x8000, u - 0x10000, u).to(torch.int16)
    return u.view(torch.float16).to(torch.float32)


# --------------------------------------------------------------------------------------
# fp8 keys: e4m3 with exponent bias 7 ("e4nv", SM >= 8.9) or 15 ("e4b15", older GPUs)
# --------------------------------------------------------------------------------------
def fp8_to_float(b: torch.Tensor, e4b15: bool = False) -> torch.Tensor:
    """Decode fp8 key bytes. e4nv: bias 7, S.1111.111 is NaN. e4b15: bias 15, all finite."""
    v = b.to(torch.int32)
    sign = torch.where(v >= 128, -1.0, 1.0).to(torch.float64)
    e = (v >> 3) & 0xF
    m = (v & 7).to(torch.float64)
    bias = 15 if e4b15 else 7
    mag = torch.where(e == 0, m / 8 * 2.0 ** (1 - bias), (1 + m / 8) * torch.pow(2.0, (e - bias).to(torch.float64)))
    out = sign * mag
    if not e4b15:
        out = torch.where((v & 0x7F) == 0x7F, torch.full_like(out, float("nan")), out)
    return out.to(torch.float32)


def float_to_fp8(x: torch.Tensor, e4b15: bool = False) -> torch.Tensor:
    """Encode floats as fp8 key bytes (round to nearest even, saturating).

    e4b15 values are the e4m3 values scaled by 2**-8, so they are encoded through
    ``torch.float8_e4m3fn`` after scaling (max 1.75 here; Triton's own e4b15 reaches 1.875).
    """
    x = x.to(torch.float32)
    if e4b15:
        x = x * 256.0
    x = x.clamp(-448.0, 448.0)
    return x.to(torch.float8_e4m3fn).view(torch.uint8)


# --------------------------------------------------------------------------------------
# rotation and codebook
# --------------------------------------------------------------------------------------
@lru_cache(maxsize=8)
def _hadamard_cpu(d: int) -> torch.Tensor:
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < d:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return (h / math.sqrt(d)).to(torch.float32)


def hadamard(d: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Normalized Sylvester Hadamard ``H/sqrt(d)`` (symmetric, so Pi == Pi.T): vLLM's rotation."""
    layout_for("turboquant_k8v4", d)  # validates d
    return _hadamard_cpu(d).to(device)


@lru_cache(maxsize=32)
def lloyd_max_centroids(d: int, bits: int, iters: int = 200, tol: float = 1e-10) -> torch.Tensor:
    """Lloyd-Max codebook for N(0, 1/d) on 2**bits levels (float32, sorted).

    Same problem vLLM solves (range +-3.5 sigma start, trapezoid rule with 200 panels on each
    cell, outer edges at +-10.5 sigma); in production the layer's own codebook is passed in.
    """
    n = 2**bits
    sigma = 1.0 / math.sqrt(d)
    lo, hi = -3.5 * sigma, 3.5 * sigma
    norm = 1.0 / math.sqrt(2 * math.pi * sigma * sigma)

    def pdf(x: float) -> float:
        return norm * math.exp(-x * x / (2 * sigma * sigma))

    def trapz(f, a: float, b: float, panels: int = 200) -> float:
        h = (b - a) / panels
        s = 0.5 * (f(a) + f(b)) + sum(f(a + i * h) for i in range(1, panels))
        return s * h

    c = [lo + (hi - lo) * (i + 0.5) / n for i in range(n)]
    for _ in range(iters):
        edges = [3 * lo] + [(c[i] + c[i + 1]) / 2 for i in range(n - 1)] + [3 * hi]
        new = []
        for i in range(n):
            den = trapz(pdf, edges[i], edges[i + 1])
            num = trapz(lambda x: x * pdf(x), edges[i], edges[i + 1])
            new.append(num / den if den > 1e-15 else c[i])
        if max(abs(a - b) for a, b in zip(new, c)) < tol:
            break  # keep the last iterate, as vLLM does
        c = new
    return torch.tensor(c, dtype=torch.float32)


def midpoints(centroids: torch.Tensor) -> torch.Tensor:
    c = centroids.sort().values
    return (c[:-1] + c[1:]) / 2
