"""Codebook tables of the Gluon MSE kernels: the fp16 centroids as byte tables, the symmetric-codebook
check (4-bit keys then look up the positive half), cached per codebook tensor.

vLLM builds each layer's codebook once, as an inference tensor (``torch.inference_mode()``): such a
tensor has no version counter, so a rewrite in place cannot be seen from the host. The tables of
an inference tensor are therefore refilled from it at every call, on the device, into buffers
made once (two copies, no host sync, no allocation: captured into a CUDA graph, every replay
re-reads the live codebook). A tensor that tracks versions (made outside inference mode) keeps
tables built once per version. The symmetric check (a host sync) runs once per tensor outside
capture, and again whenever its version changes; for an inference tensor it holds for the
codebook as first seen (vLLM's Lloyd-Max codebooks are symmetric and never rewritten).
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import torch

_CODEBOOKS: dict = {}  # id(codebook) -> _Entry


@dataclass
class _Entry:
    ref: weakref.ref
    version: int | None  # None: an inference tensor (no version counter)
    data_ptr: int
    symmetric: bool
    tables: dict = field(default_factory=dict)  # fold -> int32 byte tables
    staging: dict = field(default_factory=dict)  # fold -> fp16 buffer the tables are refilled through


def tensor_version(t: torch.Tensor) -> int | None:
    """``t._version``, or None for an inference tensor (reading it there raises)."""
    return None if t.is_inference() else t._version


def _codebook_entry(centroids: torch.Tensor) -> _Entry | None:
    """Cache entry of one codebook tensor (made with a host sync; the entry dies with the tensor), or
    None while a CUDA graph is being captured and the tensor has no valid entry yet."""
    key = id(centroids)
    hit = _CODEBOOKS.get(key)
    version = tensor_version(centroids)
    if (hit is not None and hit.ref() is centroids and hit.version == version
            and hit.data_ptr == centroids.data_ptr()):
        return hit
    if centroids.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return None
    c16 = centroids.detach().to("cpu", torch.float16)
    entry = _Entry(weakref.ref(centroids, lambda _ref, k=key: _CODEBOOKS.pop(k, None)), version,
                   centroids.data_ptr(), bool(torch.equal(c16, -c16.flip(0))))
    _CODEBOOKS[key] = entry
    return entry


def _symmetric_codebook(centroids: torch.Tensor) -> bool:
    """True when the fp16 codebook is exactly symmetric (c[n-1-i] == -c[i]), so 4-bit keys can be
    looked up in its 8 positive entries (ptx.LUT8SW). An unchecked codebook during CUDA-graph
    capture counts as not symmetric (the general 16-entry lookup)."""
    entry = _codebook_entry(centroids)
    return bool(entry and entry.symmetric)


def _fill(table: torch.Tensor, staging: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """Write ``codebook_bytes(src)`` into ``table`` through the fp16 ``staging`` buffer (device copies)."""
    staging.copy_(src)
    n = staging.numel()
    table.view(torch.uint8).view(2, n).copy_(staging.view(torch.uint8).view(n, 2).t())
    return table


def _codebook_tables(centroids: torch.Tensor, key_bits: int, allow_fold: bool) -> tuple[torch.Tensor, bool]:
    """(byte tables for the Gluon kernel, fold?): 4-bit keys of a symmetric codebook use its positive
    half. See the module docstring for when the tables are rebuilt."""
    entry = _codebook_entry(centroids)
    fold = bool(key_bits == 4 and allow_fold and entry and entry.symmetric)
    src = centroids[centroids.numel() // 2:] if fold else centroids
    if entry is None:  # capture without an entry: built in the call
        return codebook_bytes(src), fold
    table = entry.tables.get(fold)
    if table is None:
        with torch.inference_mode(False):  # plain tensors: writable in and outside inference mode
            entry.staging[fold] = torch.empty(src.numel(), dtype=torch.float16, device=src.device)
            table = torch.empty(src.numel() // 2, dtype=torch.int32, device=src.device)
        table = entry.tables[fold] = _fill(table, entry.staging[fold], src)
    elif entry.version is None:  # an inference tensor: no version to trust, refill from the live codebook
        _fill(table, entry.staging[fold], src)
    return table, fold


def codebook_bytes(centroids: torch.Tensor) -> torch.Tensor:
    """The fp16 codebook as the Gluon kernel's byte tables: int32[2 * n / 4], first the low bytes
    of entries 0..n-1 (four per word, entry i at byte i % 4), then the high bytes."""
    b = centroids.to(torch.float16).contiguous().view(torch.uint8).view(-1, 2)
    return torch.cat([b[:, 0], b[:, 1]]).contiguous().view(torch.int32)
