"""Scratch of the TurboQuant K+1 verify: the split-KV partials, allocated before CUDA-graph capture
and seen with more splits when a call has fewer rows than it was sized for."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from vllm_platform_ext.ops.turboquant.launch_policy import DEFAULT_MAX_KV_SPLITS, SMALL_BATCH_MAX_SPLITS


@dataclass
class VerifyWorkspace:
    """Split-KV partials ``float32[rows, Hq, splits, D+1]``; rows = max_num_seqs x (K+1).

    Allocate it before CUDA-graph capture and pass it on every call: the captured graph then
    keeps pointing at the same memory.
    """

    mid: torch.Tensor

    @classmethod
    def allocate(
        cls,
        max_num_seqs: int,
        max_query_len: int,
        num_q_heads: int,
        head_dim: int,
        max_kv_splits: int | None = None,
        device: torch.device | str = "cuda",
    ) -> "VerifyWorkspace":
        """``max_kv_splits`` None: DEFAULT_MAX_KV_SPLITS, or more when ``max_num_seqs`` is so small
        that one request's rows would not hold SMALL_BATCH_MAX_SPLITS partials (the split plan of
        single requests, :func:`gluon_split_plan`; fewer rows than allocated may use more splits)."""
        from vllm_platform_ext.ops.turboquant.routing import workspace_rows

        rows = workspace_rows(max_num_seqs, max_query_len - 1)
        if max_kv_splits is None:
            per_seq = triton.cdiv(SMALL_BATCH_MAX_SPLITS, max(1, max_num_seqs))
            max_kv_splits = max(DEFAULT_MAX_KV_SPLITS, per_seq)
        with torch.inference_mode(False):  # a plain tensor: the op writes it in and outside inference mode
            mid = torch.empty(rows, num_q_heads, max_kv_splits, head_dim + 1, dtype=torch.float32, device=device)
        return cls(mid)

    @property
    def rows(self) -> int:
        return self.mid.shape[0]

    @property
    def max_kv_splits(self) -> int:
        return self.mid.shape[2]


def workspace_splits(mid: torch.Tensor, rows: int, num_q_heads: int, head_dim: int) -> int:
    """Split partials the workspace ``mid`` holds for a call of ``rows`` query rows: its split
    dimension, or more when it is contiguous and fewer rows leave room (:func:`_workspace_view`)."""
    if mid.is_contiguous() and rows > 0:
        return max(mid.shape[2], mid.numel() // (rows * num_q_heads * (head_dim + 1)))
    return mid.shape[2]


def _workspace_view(mid: torch.Tensor, rows: int, num_q_heads: int, splits: int, head_dim: int) -> torch.Tensor:
    """The workspace as ``[rows, num_q_heads, splits, head_dim + 1]``: itself when it is that large
    in every dimension, else (more splits than it was sized for, fewer rows) the front of its
    contiguous memory seen with those dimensions; a clear error when it cannot hold them."""
    if mid.shape[0] >= rows and mid.shape[1] >= num_q_heads and mid.shape[2] >= splits and mid.shape[3] >= head_dim + 1:
        return mid
    need = rows * num_q_heads * splits * (head_dim + 1)
    if mid.is_contiguous() and mid.shape[0] >= rows and mid.numel() >= need:
        return mid.view(-1)[:need].view(rows, num_q_heads, splits, head_dim + 1)
    raise ValueError(
        f"workspace {tuple(mid.shape)} too small for {rows} rows x {num_q_heads} heads x {splits} splits x "
        f"{head_dim + 1}: size it max_num_seqs x (K+1) rows (routing.workspace_rows)")
