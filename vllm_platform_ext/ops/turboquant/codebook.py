"""Codebook tables of the Gluon MSE kernels: the fp16 centroids as byte tables, the symmetric-codebook
check (4-bit keys then look up the positive half), cached per codebook tensor and version."""
from __future__ import annotations

import weakref

import torch

_CODEBOOKS: dict = {}  # id(codebook) -> (weakref to it, its version, symmetric?, {fold: byte tables})


def _codebook_entry(centroids: torch.Tensor):
    """Cache entry of one codebook tensor (checked once per tensor and version: a host sync; the
    entry dies with the tensor), or None while a CUDA graph is being captured and the tensor has
    no entry yet."""
    key = id(centroids)
    hit = _CODEBOOKS.get(key)
    if hit is not None and hit[0]() is centroids and hit[1] == centroids._version:
        return hit
    if centroids.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return None
    c16 = centroids.detach().to("cpu", torch.float16)
    entry = (weakref.ref(centroids, lambda _ref, k=key: _CODEBOOKS.pop(k, None)), centroids._version,
             bool(torch.equal(c16, -c16.flip(0))), {})
    _CODEBOOKS[key] = entry
    return entry


def _symmetric_codebook(centroids: torch.Tensor) -> bool:
    """True when the fp16 codebook is exactly symmetric (c[n-1-i] == -c[i]), so 4-bit keys can be
    looked up in its 8 positive entries (ptx.LUT8SW). An unchecked codebook during CUDA-graph
    capture counts as not symmetric (the general 16-entry lookup)."""
    entry = _codebook_entry(centroids)
    return bool(entry and entry[2])


def _codebook_tables(centroids: torch.Tensor, key_bits: int, allow_fold: bool) -> tuple[torch.Tensor, bool]:
    """(byte tables for the Gluon kernel, fold?): 4-bit keys of a symmetric codebook use its positive
    half. Built once per codebook tensor and version; during capture without an entry, per call."""
    entry = _codebook_entry(centroids)
    fold = bool(key_bits == 4 and allow_fold and entry and entry[2])
    if entry is not None and fold in entry[3]:
        return entry[3][fold], fold
    lut = codebook_bytes(centroids[centroids.numel() // 2:] if fold else centroids)
    if entry is not None:
        entry[3][fold] = lut
    return lut, fold


def codebook_bytes(centroids: torch.Tensor) -> torch.Tensor:
    """The fp16 codebook as the Gluon kernel's byte tables: int32[2 * n / 4], first the low bytes
    of entries 0..n-1 (four per word, entry i at byte i % 4), then the high bytes."""
    b = centroids.to(torch.float16).contiguous().view(torch.uint8).view(-1, 2)
    return torch.cat([b[:, 0], b[:, 1]]).contiguous().view(torch.int32)
