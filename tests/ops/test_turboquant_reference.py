"""The torch TurboQuant reference against vLLM 0.32's own code.

Layout sizes and the codebook against vLLM's config/centroids modules; the store bytes and the
decode attention against vLLM's Triton kernels run under the Triton interpreter (in a
subprocess, so TRITON_INTERPRET does not leak into the rest of the suite).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from vllm_platform_ext.ops.turboquant import layout as L
from vllm_platform_ext.ops.turboquant import reference as R

HERE = os.path.abspath(__file__)


def test_slot_sizes_match_vllm_config():
    import vllm.model_executor.layers.quantization.turboquant.config as cfgmod
    for preset in L.PRESETS:
        for d in (64, 128, 256):
            ours = L.layout_for(preset, d)
            theirs = cfgmod.TurboQuantConfig.from_cache_dtype(preset, d)
            assert ours.key_packed_size == theirs.key_packed_size
            assert ours.value_packed_size == theirs.value_packed_size
            assert ours.slot_size_aligned == theirs.slot_size_aligned
            assert ours.key_fp8 == theirs.key_fp8 and ours.key_bits == theirs.key_mse_bits
            assert ours.centroid_bits == theirs.centroid_bits and ours.norm_correction == theirs.norm_correction
    # the numbers vLLM's own tests expect at D=128
    assert [L.layout_for(p, 128).slot_size_aligned for p in L.PRESETS] == [196, 134, 118, 102]


def test_codebook_matches_vllm_centroids():
    import vllm.model_executor.layers.quantization.turboquant.centroids as cmod
    for d, bits in ((128, 3), (128, 4), (256, 3), (256, 4)):
        assert torch.allclose(L.lloyd_max_centroids(d, bits), cmod.get_centroids(d, bits), rtol=0, atol=1e-7)


def test_hadamard_is_orthonormal_symmetric():
    h = L.hadamard(64).double()
    assert torch.allclose(h, h.T)
    assert torch.allclose(h @ h.T, torch.eye(64, dtype=torch.float64), atol=1e-6)


@pytest.mark.parametrize("bits", [3, 4])
def test_pack_unpack_roundtrip_and_bit_order(bits):
    idx = torch.randint(0, 2**bits, (5, 64))
    p = L.pack_indices(idx, bits)
    assert p.shape == (5, 64 * bits // 8)
    assert torch.equal(L.unpack_indices(p, bits, 64), idx)
    one = torch.zeros(1, 16, dtype=torch.long)
    one[0, 1] = 1  # element 1: bit `bits` of the little-endian stream
    assert L.pack_indices(one, bits)[0, 0].item() == 1 << bits


def test_fp8_codec_against_torch_float8():
    b = torch.arange(256, dtype=torch.uint8)
    ours = L.fp8_to_float(b)
    theirs = b.view(torch.float8_e4m3fn).float()
    same = torch.isnan(ours) == torch.isnan(theirs)
    assert same.all() and torch.equal(ours[~torch.isnan(ours)], theirs[~torch.isnan(theirs)])
    # e4b15 = e4m3 bit pattern scaled by 2^-8, no NaN
    e = L.fp8_to_float(b, e4b15=True)
    fin = ~torch.isnan(theirs)
    assert torch.equal(e[fin], theirs[fin] / 256) and torch.isfinite(e).all()
    x = torch.randn(1000)
    assert torch.equal(L.fp8_to_float(L.float_to_fp8(x)), x.to(torch.float8_e4m3fn).float())


def test_layout_rejects_bad_input():
    with pytest.raises(L.TurboQuantLayoutError, match="unknown TurboQuant preset"):
        L.layout_for("turboquant_2bit", 128)
    with pytest.raises(L.TurboQuantLayoutError, match="head dim 96"):
        L.layout_for("turboquant_k8v4", 96)
    with pytest.raises(ValueError, match="kv_cache"):
        R.tq_attention_reference_varlen(
            torch.zeros(1, 2, 64), torch.zeros(2, 16, 1, 10, dtype=torch.uint8), torch.zeros(1, 1, dtype=torch.int32),
            torch.ones(1, dtype=torch.int32), torch.tensor([0, 1]), preset="turboquant_k8v4", scale=1.0)


def test_reference_attention_against_plain_float_attention():
    """With the stored bytes decoded by hand, the reference is ordinary causal attention."""
    preset, d, hk, g = "turboquant_4bit_nc", 64, 2, 3
    lay = L.layout_for(preset, d)
    c, H = L.lloyd_max_centroids(d, 4), L.hadamard(d)
    cache = torch.zeros(3, hk, 16, lay.slot_size_aligned, dtype=torch.uint8).transpose(1, 2)
    k, v = torch.randn(40, hk, d), torch.randn(40, hk, d)
    R.tq_store_reference(k, v, cache, torch.arange(40), preset, PiT=H, centroids=c)
    kd, vd = R.dequantize_slots(cache.reshape(48, hk, -1)[:40], lay, H, c)
    assert (kd.float() - k).norm() / k.norm() < 0.15 and (vd.float() - v).norm() / v.norm() < 0.15  # 4-bit quantization
    q = torch.randn(2 * 3, hk * g, d)
    sl = torch.tensor([40, 17], dtype=torch.int32)
    bt = torch.tensor([[0, 1, 2], [0, 1, 2]], dtype=torch.int32)
    out = R.turboquant_verify_attention_reference(q, cache, bt, sl, 3, preset=preset, scale=0.1, centroids=c, PiT=H)
    for r, s in enumerate((40, 17)):
        for t in range(3):
            vis = s - 3 + 1 + t
            kk = kd[:vis].repeat_interleave(g, 1)
            vv = vd[:vis].repeat_interleave(g, 1)
            p = torch.softmax(torch.einsum("hd,lhd->hl", q[r * 3 + t].double(), kk) * 0.1, -1)
            exp = torch.einsum("hl,lhd->hd", p, vv)
            assert torch.allclose(out[r * 3 + t].double(), exp, atol=1e-5)


# ---------------------------------------------------------------------------------------
# against vLLM's Triton kernels, under the interpreter (subprocess)
# ---------------------------------------------------------------------------------------
def _interp_check() -> dict:
    from vllm_platform_ext.testing import turboquant_upstream

    up = turboquant_upstream.load()
    torch.manual_seed(0)
    d, hk, bs, nb, n = 64, 2, 16, 4, 40
    res = {}
    for preset in L.PRESETS:
        lay = L.layout_for(preset, d)
        c, H = L.lloyd_max_centroids(d, lay.centroid_bits), L.hadamard(d)
        k = torch.randn(n, hk, d) * 0.5
        v = torch.randn(n, hk, d)
        slots = torch.randperm(nb * bs)[:n].int()
        a = torch.zeros(nb, hk, bs, lay.slot_size_aligned, dtype=torch.uint8)
        b = torch.zeros_like(a)
        up.store.triton_turboquant_store(k, v, a.transpose(1, 2), slots, H, L.midpoints(c), mse_bits=lay.key_bits,
                                         key_packed_size=lay.key_packed_size, value_quant_bits=lay.value_bits,
                                         key_fp8=lay.key_fp8)
        R.tq_store_reference(k, v, b.transpose(1, 2), slots, preset, PiT=H, centroids=c)
        kps = lay.key_packed_size
        entry = {"value_bytes_differ": int((a[..., kps:] != b[..., kps:]).sum()),
                 "key_bytes_differ": int((a[..., :kps] != b[..., :kps]).sum())}
        if lay.key_fp8:
            # The interpreter's fp32->fp8 cast mis-rounds when rounding carries into the next
            # binade (x just below a power of two) and truncates subnormals (|x| < 2^-6).
            # vLLM's bytes may differ only there; the GPU test checks key bytes exactly.
            ka = a.transpose(1, 2)[..., :kps].reshape(nb * bs, hk, d)[slots.long()]
            kb = b.transpose(1, 2)[..., :kps].reshape(nb * bs, hk, d)[slots.long()]
            vb = L.fp8_to_float(kb).abs()
            carry = ((torch.log2(vb.clamp_min(2**-9)).frac() == 0) & (vb > k.abs())) | (k.abs() < 2**-6)
            entry["key_bytes_differ"] = int(((ka != kb) & ~carry).sum())
            entry["key_bytes_differ_at_carry"] = int(((ka != kb) & carry).sum())
        # attention: vLLM's decode kernel on the reference-written cache, K+1 rows routed as
        # decode rows with synthetic lengths, vs the reference
        view = b.transpose(1, 2)
        k1 = 3
        sl = torch.tensor([7, 50, 3], dtype=torch.int32)
        bt = torch.tensor([[0, 1, 2, 3], [3, 2, 1, 0], [1, 0, 2, 3]], dtype=torch.int32)
        q = torch.randn(3 * k1, hk * 2, d)
        synth = (sl[:, None] - k1 + 1 + torch.arange(k1)[None, :]).reshape(-1).int()
        out = up.decode.triton_turboquant_decode_attention(
            q, view, bt.repeat_interleave(k1, 0), synth.clamp_min(0), H, c, 0.125, mse_bits=lay.key_bits,
            key_packed_size=kps, value_quant_bits=lay.value_bits, key_fp8=lay.key_fp8,
            norm_correction=lay.norm_correction, PiT=H, max_num_kv_splits=4)
        ref = R.turboquant_verify_attention_reference(q, view, bt, sl, k1, preset=preset, scale=0.125, centroids=c, PiT=H)
        entry["attn_max_abs_diff"] = float((out - ref).abs().max())
        res[preset] = entry
    return res


def test_reference_matches_vllm_store_and_decode_kernels_under_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, HERE, "--interp"], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    for preset, e in res.items():
        assert e["key_bytes_differ"] == 0 and e["value_bytes_differ"] == 0, (preset, e)
        assert e["attn_max_abs_diff"] < 1e-5, (preset, e)


if __name__ == "__main__" and "--interp" in sys.argv:
    print(json.dumps(_interp_check()))
