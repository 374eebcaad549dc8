"""The Triton GDN ops on the GPU (bf16, fp16, fp32) against the float64 reference, the bad-input
table, the multi-step spec-decode check, and a CUDA graph captured once and replayed while the
accepted counts and the batch composition change. Runs only where torch sees a CUDA device
(CPU CI deselects it with ``-m "not gpu"``)."""
from __future__ import annotations

import pytest
import torch

from vllm_platform_ext.testing import gdn_cases as GC
from vllm_platform_ext.testing import gdn_harness as GH
from vllm_platform_ext.ops.gdn import reference as R

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
CASES = GC.standard_cases(large=True)


@pytest.fixture(scope="module")
def X():
    from vllm_platform_ext.ops.gdn import triton_ops

    return triton_ops


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("name", sorted(CASES))
def test_gpu_matches_reference(X, name, dtype):
    res = GH.run_and_compare(X, CASES[name], dtype, "cuda")
    GH.assert_close(res, dtype)


@pytest.mark.parametrize("ssm_dtype", [torch.bfloat16, torch.float16], ids=["ssm_bf16", "ssm_fp16"])
@pytest.mark.parametrize("name", sorted(n for n, c in CASES.items() if c["op"] == "recurrent_gated_delta_rule"))
def test_gpu_recurrence_keeps_a_16bit_ssm_cache(X, name, ssm_dtype):
    GH.assert_close(GH.run_and_compare(X, CASES[name], torch.bfloat16, "cuda", ssm_dtype=ssm_dtype), torch.bfloat16)


@pytest.mark.parametrize("seed", range(3))
def test_gpu_spec_sequence_with_bf16_ssm_cache(X, seed):
    err = GH.spec_sequence_check(X, seed, torch.bfloat16, "cuda", ssm_dtype=torch.bfloat16)
    assert err["conv"] <= 3e-2 and err["rec"] <= 3e-2, err


@pytest.mark.parametrize("name", sorted(n for n, c in CASES.items() if c["op"] == "recurrent_gated_delta_rule"))
def test_gpu_recurrence_other_launch_shapes(X, name):
    """Launch shapes other than the default (wide V blocks, 4 warps; the small-grid switch)."""
    import functools
    import types

    big = types.SimpleNamespace(recurrent_gated_delta_rule=functools.partial(
        X.recurrent_gated_delta_rule, config={"BLOCK_V": 32, "num_warps": 4}))
    GH.assert_close(GH.run_and_compare(big, CASES[name], torch.bfloat16, "cuda"), torch.bfloat16)
    small = types.SimpleNamespace(recurrent_gated_delta_rule=functools.partial(
        X.recurrent_gated_delta_rule, config={"SMALL_GRID": 1 << 20, "SMALL_BLOCK_V": 16, "SMALL_NUM_WARPS": 2}))
    GH.assert_close(GH.run_and_compare(small, CASES[name], torch.bfloat16, "cuda"), torch.bfloat16)


@pytest.mark.parametrize("name", sorted(GC.bad_input_cases()))
def test_gpu_rejects_bad_input(X, name):
    case, word = GC.bad_input_cases()[name]
    kind, msg = GH.expect_error(X, case, torch.bfloat16, "cuda")
    assert kind == "raised" and word.lower() in msg.lower(), (kind, msg)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("seed", range(3))
def test_gpu_spec_sequence_equals_plain_pass(X, seed, dtype):
    err = GH.spec_sequence_check(X, seed, dtype, "cuda")
    tol = {torch.float32: 2e-5, torch.float16: 3e-3, torch.bfloat16: 3e-2}[dtype]
    assert err["conv"] <= tol and err["rec"] <= tol, err


@pytest.mark.parametrize("name", ["rec-spec-random-0", "rec-mixed-q", "rec-null-read-slot", "large-rec-spec-128"])
def test_gpu_fused_gating_recurrence(X, name):
    res = GH.fused_gating_compare(X.fused_gating_recurrent_gated_delta_rule, CASES[name], torch.bfloat16, "cuda")
    GH.assert_close(res, torch.bfloat16)


def test_gpu_cuda_graph_replay_with_changing_metadata(X):
    """One capture of a spec-decode step (conv update, gating, recurrence); each replay gets new
    accepted counts, row lengths 0..k+1 (zero-draft rows, empty rows) and padding rows."""
    torch.manual_seed(0)
    dev, dt = "cuda", torch.bfloat16
    N, k, W, dim, H, HV, K, V = 8, 3, 4, 48, 2, 4, 32, 32
    S, T = k + 1, 8 * (k + 1)
    slots = 1 + N * S
    st = dict(
        x=torch.zeros(T, dim, device=dev, dtype=dt), q=torch.zeros(T, H, K, device=dev, dtype=dt),
        k=torch.zeros(T, H, K, device=dev, dtype=dt), v=torch.zeros(T, HV, V, device=dev, dtype=dt),
        a=torch.zeros(T, HV, device=dev, dtype=dt), b=torch.zeros(T, HV, device=dev, dtype=dt),
        qsl=torch.zeros(N + 1, device=dev, dtype=torch.int32), acc=torch.ones(N, device=dev, dtype=torch.int32),
        table=torch.zeros(N, S, device=dev, dtype=torch.int32),
    )
    w = (torch.randn(dim, W, device=dev) * 0.5).to(dt)
    bias = torch.randn(dim, device=dev).to(dt)
    A_log, dt_bias = torch.randn(HV, device=dev).to(dt), torch.randn(HV, device=dev).to(dt)
    conv = torch.zeros(slots, W - 1 + k, dim, device=dev, dtype=dt).transpose(1, 2)  # vLLM's SD layout
    ssm = torch.zeros(slots, HV, V, K, device=dev, dtype=torch.float32)
    scale = K ** -0.5

    def step():
        conv_idx = st["table"][:, 0]
        y = X.causal_conv1d_update(st["x"], conv, w, bias, "silu", conv_idx, st["qsl"], st["acc"], 0)
        g, beta = X.gdn_gating(A_log, st["a"], st["b"], dt_bias)
        o = X.recurrent_gated_delta_rule(st["q"], st["k"], st["v"], g, beta, scale, ssm, st["qsl"], st["table"],
                                         st["acc"], None, True, 0)
        return y, o

    def fill(it):
        gen = torch.Generator().manual_seed(it)
        lens = torch.randint(0, S + 1, (N,), generator=gen)
        lens[0], lens[1], lens[2] = S, 0, 1  # all drafts, an empty row, a zero-draft row
        n_pad = int(torch.randint(0, 3, (1,), generator=gen))
        table = (torch.randperm(slots - 1, generator=gen)[: N * S] + 1).reshape(N, S).to(torch.int32)
        if n_pad:
            lens[N - n_pad:] = 0
            table[N - n_pad:] = 0  # padding rows point at the null block
        acc = torch.randint(1, S + 1, (N,), generator=gen).to(torch.int32)
        qsl = torch.cat([torch.zeros(1, dtype=torch.long), lens.cumsum(0)]).to(torch.int32)
        for name in ("x", "q", "k", "v", "a", "b"):
            st[name].copy_(torch.randn(st[name].shape, generator=gen).to(dt))
        st["qsl"].copy_(qsl)
        st["acc"].copy_(acc)
        st["table"].copy_(table)
        conv.copy_(torch.randn(conv.shape, generator=gen).to(dt))
        ssm.copy_(torch.randn(ssm.shape, generator=gen) * 0.5)
        return lens

    fill(100)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y_g, o_g = step()
    seen = set()
    for it in range(6):
        lens = fill(it)
        seen.update(lens.tolist())
        f64 = lambda t: t.detach().cpu().double()  # noqa: E731
        conv_ref, ssm_ref = f64(conv).clone(), f64(ssm).clone()
        cpu = {n: st[n].cpu() for n in st}
        y_ref = R.causal_conv1d_update(f64(st["x"]), conv_ref, f64(w), f64(bias), "silu", cpu["table"][:, 0],
                                       cpu["qsl"], cpu["acc"], 0)
        g, beta = R.gdn_gating(f64(A_log), f64(st["a"]), f64(st["b"]), f64(dt_bias))
        o_ref = R.recurrent_gated_delta_rule(f64(st["q"]), f64(st["k"]), f64(st["v"]), g, beta, scale, ssm_ref,
                                             cpu["qsl"], cpu["table"], cpu["acc"], None, True, 0)
        graph.replay()
        torch.cuda.synchronize()
        for got, want, tol in ((y_g, y_ref, 1.6e-2), (o_g, o_ref, 1.6e-2), (conv, conv_ref, 1e-6),
                               (ssm, ssm_ref, 5e-4)):
            err = float((f64(got) - want).abs().max())
            assert err <= tol * max(1.0, float(want.abs().max())), (it, lens.tolist(), err)
    assert {0, 1, S} <= seen, seen


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("name", sorted(GC.padded_row_cases()))
def test_gpu_ignores_padded_rows_with_garbage_indices(X, name, dtype):
    """Zero-token padded rows carrying state indices of -1 / 10**6 / the null block and accepted
    counts of 0 / -1 / 10**6 (what a padded batch or a bad draft's row may leave; issue 51) change
    nothing: outputs and the whole state pool equal the reference run without them. On the GPU an
    unmasked read of such an index is an out-of-bounds access (run under compute-sanitizer to see it);
    on the CPU the interpreter test can only see a wrong value."""
    GH.assert_close(GH.padded_compare(X, GC.padded_row_cases()[name], dtype, "cuda"), dtype)
