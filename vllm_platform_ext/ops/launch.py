"""Per-platform Triton launch policy for the kernels of this plugin.

Kernel modules declare the launch configuration they want (``num_warps``, ``num_stages``,
block sizes) and pass it through :func:`launch_config` for each platform key of the op
dispatch (``cuda``, ``maca``, ``cpu``); the result goes into ``OpImpl(config=...)`` so that
``doctor`` prints what will actually be launched. At run time, a kernel that computes
``num_warps`` from the problem size clamps it with :func:`clamp_num_warps`.

Rules (see :data:`LIMITS`):

* ``maca``: ``num_warps`` <= 16. MetaX's Triton rejects larger values; vLLM-metax caps
  its own autotune lists at ``[2, 4, 8, 16]`` with the note "Maca can't work with nw up
  to 32" (``vllm_metax/patch/.../kda.py``).
* ``cuda``: ``num_warps`` <= 32 (1024 threads per block).
* ``cpu``: no Triton launch; the values are kept for the record only.
* Everywhere: ``num_warps`` and every ``BLOCK*`` value must be a power of two
  (``tl.arange`` and Triton's layouts require it); other values raise ``ValueError``.
* ``max_block`` (optional, per call) caps every block value, e.g. for a register budget.

Clamping lowers a value to the largest allowed power of two. The returned dict holds
only launch keywords (it can be splatted into a Triton launch); every clamp is kept in
:func:`clamp_log` and :func:`describe` gives the rules, both for ``doctor``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm_platform_ext.ops.dispatch import PLATFORMS

_CLAMPS: list[str] = []


@dataclass(frozen=True)
class Limits:
    max_num_warps: int | None
    why: str


LIMITS: dict[str, Limits] = {
    "cuda": Limits(32, "CUDA: at most 1024 threads (32 warps) per block"),
    "maca": Limits(16, "MACA: MetaX Triton supports num_warps up to 16 (vLLM-metax caps autotune at 16)"),
    "cpu": Limits(None, "CPU: torch implementation, no Triton launch"),
}


def _is_pow2(n: int) -> bool:
    return isinstance(n, int) and not isinstance(n, bool) and n > 0 and (n & (n - 1)) == 0


def _floor_pow2(n: int) -> int:
    return 1 << (n.bit_length() - 1)


def _check_platform(platform: str) -> Limits:
    if platform not in PLATFORMS:
        raise ValueError(f"unknown platform {platform!r}; expected one of {PLATFORMS}")
    return LIMITS[platform]


def clamp_num_warps(platform: str, num_warps: int) -> int:
    """``num_warps`` lowered to what ``platform`` can launch (power of two required)."""
    limits = _check_platform(platform)
    if not _is_pow2(num_warps):
        raise ValueError(f"num_warps must be a power of two, got {num_warps!r}")
    if limits.max_num_warps is not None and num_warps > limits.max_num_warps:
        return limits.max_num_warps
    return num_warps


def launch_config(
    platform: str,
    *,
    num_warps: int,
    num_stages: int | None = None,
    max_block: int | None = None,
    **blocks: int,
) -> dict[str, Any]:
    """The launch configuration for ``platform``: ``num_warps`` (and ``num_stages``, block
    sizes passed as keywords, e.g. ``BLOCK_K=64``) checked and clamped.

    Example: ``launch_config("maca", num_warps=32, BLOCK_N=128)`` gives
    ``{"num_warps": 16, "BLOCK_N": 128}`` and logs the clamp in :func:`clamp_log`.
    """
    limits = _check_platform(platform)
    clamped: dict[str, str] = {}
    warps = clamp_num_warps(platform, num_warps)
    if warps != num_warps:
        clamped["num_warps"] = f"{num_warps} -> {warps} ({limits.why})"
    cfg: dict[str, Any] = {"num_warps": warps}
    if num_stages is not None:
        if not isinstance(num_stages, int) or num_stages < 1:
            raise ValueError(f"num_stages must be a positive int, got {num_stages!r}")
        cfg["num_stages"] = num_stages
    if max_block is not None and not _is_pow2(max_block):
        raise ValueError(f"max_block must be a power of two, got {max_block!r}")
    for name, value in blocks.items():
        if not _is_pow2(value):
            raise ValueError(f"{name} must be a power of two, got {value!r}")
        if max_block is not None and value > max_block:
            clamped[name] = f"{value} -> {max_block} (max_block)"
            value = _floor_pow2(max_block)
        cfg[name] = value
    for name, note in clamped.items():
        entry = f"{platform}: {name} {note}"
        if entry not in _CLAMPS:
            _CLAMPS.append(entry)
    return cfg


def clamp_log() -> list[str]:
    """Every clamp :func:`launch_config` applied in this process (for ``doctor``)."""
    return list(_CLAMPS)


def per_platform(**request: Any) -> dict[str, dict[str, Any]]:
    """``launch_config`` of one request for every platform key, e.g. to build OpImpls."""
    return {p: launch_config(p, **request) for p in PLATFORMS}


def describe() -> list[tuple[str, str]]:
    """``(platform, rule)`` lines for ``doctor``."""
    return [(p, LIMITS[p].why) for p in PLATFORMS]
