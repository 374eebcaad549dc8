"""The TurboQuant KV-cache layout a vLLM line hands its backend's ``forward``, probed from that
line's own code -- never assumed per project.

The verify op reads ``uint8[num_blocks, block_size, num_kv_heads, slot]`` (any strides). What a
vLLM line passes as ``kv_cache`` differs (read from each release's wheel):

=============  =========================================================  ==================
releases       how the line declares it                                   per-layer tensor
=============  =========================================================  ==================
0.22 - 0.25    ``get_kv_cache_shape -> (blocks, block_size, heads, slot)``  (B, N, H, C)
0.26 - 0.28    ``get_kv_cache_shape -> (blocks, heads, block_size, slot)``  (B, H, N, C)
0.29 -         no ``get_kv_cache_shape``; ``create_kv_cache_views`` gives   (B, H, N, C) view
               the logical ``[B, H, N, C]`` of ``vllm.v1.kv_cache_layout``  of LBNHC memory
=============  =========================================================  ==================

:func:`probe` asks the backend (its ``get_kv_cache_shape`` with distinct sizes, or the line's
logical-axis constants) and returns a :class:`CacheLayout`; a line that answers neither raises
:class:`LayoutUnknown`, and the verify route is then skipped with that reason. At run time
:meth:`CacheLayout.check` compares the tensor vLLM hands over with the impl's head count and the
preset's slot size (host-side shape reads only: graph-safe); a mismatch keeps vLLM's own path.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

import torch

OP_AXES = ("blocks", "tokens", "heads", "slot")  # what the op reads
_PROBE = {"blocks": 7, "tokens": 16, "heads": 3}  # distinct sizes: each found once in the answer
_PROBE_HEAD = 128


class LayoutUnknown(LookupError):
    """The line declares a cache layout this wiring cannot map to the op's."""


@dataclass(frozen=True)
class CacheLayout:
    axes: tuple[str, ...]  # what vLLM's per-layer tensor holds, dim by dim
    source: str  # how the line declared it

    @property
    def perm(self) -> tuple[int, ...]:
        return tuple(self.axes.index(a) for a in OP_AXES)

    def op_view(self, kv_cache: torch.Tensor) -> torch.Tensor:
        """vLLM's tensor as the op's ``[blocks, block_size, heads, slot]`` (a view, no copy)."""
        perm = self.perm
        return kv_cache if perm == (0, 1, 2, 3) else kv_cache.permute(perm)

    def check(self, view: torch.Tensor, num_kv_heads: int, slot_bytes: int) -> str | None:
        """Why ``view`` (from :meth:`op_view`) is not the op's layout for this impl, or None."""
        if view.dim() != 4:
            return f"kv_cache has {view.dim()} dims, the probed layout {self.describe()} has 4"
        if view.dtype not in (torch.uint8, torch.int8):
            return f"kv_cache dtype {view.dtype} is not a byte cache"
        if view.shape[2] != num_kv_heads or view.shape[3] != slot_bytes:
            return (f"kv_cache {tuple(view.shape)} seen through {self.describe()} has {view.shape[2]} heads and "
                    f"{view.shape[3]}-byte slots, the impl {num_kv_heads} heads and {slot_bytes}-byte slots")
        return None

    def describe(self) -> str:
        perm = self.perm
        how = "as is" if perm == (0, 1, 2, 3) else f"permute{perm}"
        return f"({', '.join(self.axes)}) from {self.source}; op view {how}"


def _from_shape(shape: tuple[int, ...], source: str) -> CacheLayout:
    sizes = {v: k for k, v in _PROBE.items()}
    if len(shape) != 4:
        raise LayoutUnknown(f"{source} answered {shape}: not 4 dims (blocks, tokens, heads, slot)")
    axes = [sizes.get(int(n)) for n in shape[:3]]
    if sorted(a for a in axes if a) != sorted(_PROBE) or int(shape[3]) in sizes:
        raise LayoutUnknown(f"{source} answered {shape} for blocks={_PROBE['blocks']}, block_size="
                            f"{_PROBE['tokens']}, heads={_PROBE['heads']}: no (blocks, tokens, heads) order in it")
    return CacheLayout((*axes, "slot"), source)


def _logical_axes_of_line() -> CacheLayout | None:
    """vLLM >= 0.29: the per-layer view ``create_kv_cache_views`` builds is the logical
    ``[B, H, N, C]`` whose axis numbers ``vllm.v1.kv_cache_layout`` defines (``_DIM_*`` of the
    5-D ``[L, B, H, N, C]``)."""
    try:
        kl = importlib.import_module("vllm.v1.kv_cache_layout")
        importlib.import_module("vllm.v1.kv_cache_interface").create_kv_cache_views  # noqa: B018
    except (ImportError, AttributeError):
        return None
    try:
        dims = {"blocks": kl._DIM_B, "heads": kl._DIM_H, "tokens": kl._DIM_N, "slot": kl._DIM_C, "layers": kl._DIM_L}
    except AttributeError:
        return None
    if dims["layers"] != 0 or sorted(dims.values()) != [0, 1, 2, 3, 4]:
        return None
    axes = tuple(sorted(("blocks", "heads", "tokens", "slot"), key=lambda a: dims[a]))
    return CacheLayout(axes, "vllm.v1.kv_cache_layout logical [L, B, H, N, C]")


def probe(backend: type) -> CacheLayout:
    """The per-layer layout ``backend``'s forward receives on this vLLM line."""
    name = f"{backend.__module__}.{backend.__qualname__}"
    shape_fn = getattr(backend, "get_kv_cache_shape", None)
    if callable(shape_fn):
        try:
            shape = tuple(shape_fn(_PROBE["blocks"], _PROBE["tokens"], _PROBE["heads"], _PROBE_HEAD,
                                   cache_dtype_str="turboquant_k8v4"))
        except NotImplementedError:
            shape = None
        except Exception as exc:  # a contract we do not know
            raise LayoutUnknown(f"{name}.get_kv_cache_shape raised {type(exc).__name__}: {exc}") from exc
        if shape is not None:
            return _from_shape(shape, f"{backend.__qualname__}.get_kv_cache_shape")
    layout = _logical_axes_of_line()
    if layout is None:
        raise LayoutUnknown(f"{name} has no get_kv_cache_shape and this vLLM has no logical KV-cache "
                            "layout module (vllm.v1.kv_cache_layout): cache layout unknown")
    return layout


_LAYOUTS: dict[type, CacheLayout] = {}  # impl class -> layout its backend declared


def remember(backend: type, layout: CacheLayout) -> None:
    _LAYOUTS[backend.get_impl_cls()] = layout


def layout_of(impl: Any) -> CacheLayout | None:
    """The layout probed for ``impl``'s backend (looked up along its class's MRO)."""
    for cls in type(impl).__mro__:
        hit = _LAYOUTS.get(cls)
        if hit is not None:
            return hit
    return None


def known() -> list[tuple[str, str]]:
    """``(impl class, layout)`` for every backend probed in this process (doctor)."""
    return [(f"{c.__module__}.{c.__qualname__}", lay.describe()) for c, lay in _LAYOUTS.items()]
