"""Numerics of every torch fallback against float64 references written here (not by calling
the implementation), through ``torch.ops._C`` after bootstrap, plus input checks and
``torch.compile``/fake-tensor behaviour."""
import math

import pytest
import torch

from conftest import in_process_bootstrap
from vllm_platform_ext.compat import fallbacks, nvfp4

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
FP8_MIN_SCALE = 1.0 / (448.0 * 512.0)
E2M1_GRID = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)


@pytest.fixture(scope="module", autouse=True)
def compat_applied():
    with in_process_bootstrap() as report:
        assert report is not None
        yield


def C(name):
    return getattr(torch.ops._C, name)


# ---- float64 references -----------------------------------------------------------------


def ref_rms(x, weight, eps, residual=None):
    """Returns (normed as float64 rounded like the kernel: to x.dtype after norm and after
    the weight product; the new residual or None)."""
    dt = x.dtype
    z = x.double()
    new_res = None
    if residual is not None:
        new_res = (z + residual.double()).to(dt)
        z = new_res.double()
    n = (z / torch.sqrt((z * z).mean(-1, keepdim=True) + eps)).to(dt).double()
    if weight is not None:
        n = (n * weight.double()).to(dt).double()
    return n, new_res


def ref_silu_mul(x):
    z = x.double()
    d = z.shape[-1] // 2
    a, b = z[..., :d], z[..., d:]
    return a / (1.0 + torch.exp(-a)) * b


def assert_fp8_close(q, scale, ref, qmax=FP8_MAX):
    """q (fp8) * scale must equal ref within half an fp8 step (3 mantissa bits) after
    saturation at +-qmax * scale."""
    scale = scale.double()
    scaled_ref = (ref / scale).clamp(-qmax, qmax)
    got = q.double()
    tol = scaled_ref.abs() * 2.0**-4 * (1 + 1e-4) + 2.0**-10
    bad = (got - scaled_ref).abs() > tol
    assert not bad.any(), f"{int(bad.sum())} values off: got {got[bad][:5]} want {scaled_ref[bad][:5]}"


def assert_int8_close(q, scale, ref):
    scaled_ref = (ref / scale.double()).clamp(-128, 127)
    assert ((q.double() - scaled_ref).abs() <= 0.5 + 1e-3).all()


def ref_dynamic_scale(amax, qmax=FP8_MAX, ub=None, min_scale=FP8_MIN_SCALE):
    if ub is not None:
        amax = torch.minimum(amax, torch.tensor(float(ub), dtype=torch.float64))
    return torch.clamp(amax / qmax, min=min_scale)


# ---- RMSNorm + fp8 -----------------------------------------------------------------------


def test_rms_norm_static_fp8_quant_exact_values():
    x = torch.tensor([[1.0, -1.0, 1.0, -1.0]], dtype=torch.bfloat16)  # rms = 1
    w = torch.tensor([1.0, 2.0, 0.5, 4.0], dtype=torch.bfloat16)
    out = torch.empty(1, 4, dtype=FP8)
    C("rms_norm_static_fp8_quant")(out, x, w, torch.tensor([0.5]), 0.0)
    assert out.float().tolist() == [[2.0, -4.0, 1.0, -8.0]]
    C("rms_norm_static_fp8_quant")(out, x, w, torch.tensor([1e-3]), 0.0)  # saturates
    assert out.float().tolist() == [[448.0, -448.0, 448.0, -448.0]]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_rms_norm_static_fp8_quant_random(dtype):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(7, 256, generator=g).to(dtype)
    w = (torch.rand(256, generator=g) + 0.5).to(dtype)
    scale = torch.tensor([0.02])
    out = torch.empty(7, 256, dtype=FP8)
    C("rms_norm_static_fp8_quant")(out, x, w, scale, 1e-6)
    ref, _ = ref_rms(x, w, 1e-6)
    assert_fp8_close(out, scale, ref)


def test_fused_add_rms_norm_static_fp8_quant_updates_residual():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(5, 128, generator=g).to(torch.bfloat16)
    r = torch.randn(5, 128, generator=g).to(torch.bfloat16)
    r0 = r.clone()
    w = torch.randn(128, generator=g).to(torch.bfloat16)
    out = torch.empty(5, 128, dtype=FP8)
    scale = torch.tensor([0.01])
    C("fused_add_rms_norm_static_fp8_quant")(out, x, r, w, scale, 1e-5)
    ref, new_res = ref_rms(x, w, 1e-5, residual=r0)
    assert torch.equal(r, new_res)
    assert_fp8_close(out, scale, ref)


@pytest.mark.parametrize("qdtype", [FP8, torch.int8])
@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize("with_ub", [False, True])
def test_rms_norm_dynamic_per_token_quant(qdtype, with_residual, with_ub):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(6, 192, generator=g).to(torch.bfloat16)
    x[2] = 0  # all-zero row: the scale floor applies
    w = (torch.randn(192, generator=g) * 2).to(torch.bfloat16)
    r = torch.randn(6, 192, generator=g).to(torch.bfloat16) if with_residual else None
    r0 = r.clone() if r is not None else None
    ub = torch.tensor(1.5) if with_ub and qdtype == FP8 else None
    out = torch.empty(6, 192, dtype=qdtype)
    scale = torch.empty(6, 1)
    C("rms_norm_dynamic_per_token_quant")(out, x, w, scale, 1e-6, ub, r)
    ref, new_res = ref_rms(x, w, 1e-6, residual=r0)
    if with_residual:
        assert torch.equal(r, new_res)
    if qdtype == FP8:
        want = ref_dynamic_scale(ref.abs().amax(-1, keepdim=True), ub=None if ub is None else ub.item())
        torch.testing.assert_close(scale.double(), want, rtol=1e-6, atol=0)
        assert_fp8_close(out, scale, ref)
    else:
        want = ref_dynamic_scale(ref.abs().amax(-1, keepdim=True), qmax=127.0, min_scale=torch.finfo(torch.float32).eps)
        torch.testing.assert_close(scale.double(), want, rtol=1e-6, atol=0)
        assert_int8_close(out, scale, ref)


@pytest.mark.parametrize("group_size", [64, 128])
@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("qdtype", [FP8, torch.int8])
def test_rms_norm_per_block_quant(group_size, transposed, qdtype):
    g = torch.Generator().manual_seed(4)
    t, h = 5, 256
    x = torch.randn(t, h, generator=g).to(torch.bfloat16)
    r = torch.randn(t, h, generator=g).to(torch.bfloat16)
    r0 = r.clone()
    w = torch.randn(h, generator=g).to(torch.bfloat16)
    out = torch.empty(t, h, dtype=qdtype)
    scale = torch.empty(h // group_size, t).t() if transposed else torch.empty(t, h // group_size)
    ub = torch.tensor(2.0) if qdtype == FP8 else None
    C("rms_norm_per_block_quant")(out, x, w, scale, 1e-6, ub, r, group_size, transposed)
    ref, new_res = ref_rms(x, w, 1e-6, residual=r0)
    assert torch.equal(r, new_res)
    groups = ref.reshape(t, h // group_size, group_size)
    qmax, floor = (FP8_MAX, FP8_MIN_SCALE) if qdtype == FP8 else (127.0, torch.finfo(torch.float32).eps)
    want = ref_dynamic_scale(groups.abs().amax(-1), qmax=qmax, ub=None if ub is None else 2.0, min_scale=floor)
    torch.testing.assert_close(scale.double(), want, rtol=1e-6, atol=0)
    full_scale = scale.repeat_interleave(group_size, dim=1)
    (assert_fp8_close if qdtype == FP8 else assert_int8_close)(out, full_scale, ref)


def test_fused_add_rms_norm_and_optional_weight():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(3, 64, generator=g).to(torch.bfloat16)
    r = torch.randn(3, 64, generator=g).to(torch.bfloat16)
    x0, r0 = x.clone(), r.clone()
    fallbacks.fused_add_rms_norm(x, r, None, 1e-6)
    ref, new_res = ref_rms(x0, None, 1e-6, residual=r0)
    assert torch.equal(r, new_res)
    torch.testing.assert_close(x.double(), ref, rtol=0, atol=0)


# ---- SiLU-and-mul ------------------------------------------------------------------------


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("qdtype", [FP8, torch.int8])
def test_silu_and_mul_per_block_quant(transposed, qdtype):
    g = torch.Generator().manual_seed(6)
    t, h, gs = 4, 256, 128
    x = (torch.randn(t, 2 * h, generator=g) * 3).to(torch.bfloat16)
    out = torch.empty(t, h, dtype=qdtype)
    scales = torch.empty(h // gs, t).t() if transposed else torch.empty(t, h // gs)
    ub = torch.tensor(3.0) if qdtype == FP8 else None
    C("silu_and_mul_per_block_quant")(out, x, scales, gs, ub, transposed)
    ref = ref_silu_mul(x)
    qmax, floor = (FP8_MAX, FP8_MIN_SCALE) if qdtype == FP8 else (127.0, torch.finfo(torch.float32).eps)
    want = ref_dynamic_scale(ref.reshape(t, h // gs, gs).abs().amax(-1), qmax=qmax,
                             ub=None if ub is None else 3.0, min_scale=floor)
    torch.testing.assert_close(scales.double(), want, rtol=1e-5, atol=0)
    (assert_fp8_close if qdtype == FP8 else assert_int8_close)(out, scales.repeat_interleave(gs, 1), ref)


def test_silu_and_mul_and_static_quant():
    g = torch.Generator().manual_seed(7)
    x = torch.randn(3, 2, 64, generator=g).to(torch.float16)
    out = torch.empty(3, 2, 32, dtype=torch.float16)
    fallbacks.silu_and_mul(out, x)
    torch.testing.assert_close(out.double(), ref_silu_mul(x), rtol=2**-10, atol=1e-4)
    q = torch.empty(3, 2, 32, dtype=FP8)
    C("silu_and_mul_quant")(q, x, torch.tensor([0.01]))
    assert_fp8_close(q, torch.tensor(0.01), ref_silu_mul(x))


# ---- plain fp8 quant ops -----------------------------------------------------------------


def test_static_scaled_fp8_quant_per_tensor_and_grouped():
    g = torch.Generator().manual_seed(8)
    x = torch.randn(8, 256, generator=g).to(torch.bfloat16)
    q = torch.empty_like(x, dtype=FP8)
    fallbacks.static_scaled_fp8_quant(q, x, torch.tensor([0.05]))
    assert_fp8_close(q, torch.tensor(0.05), x.double())
    s = torch.rand(8, 2, generator=g) * 0.05 + 0.001  # (1, 128) groups
    fallbacks.static_scaled_fp8_quant(q, x, s, [1, 128])
    assert_fp8_close(q, s.repeat_interleave(128, 1), x.double())
    per_channel = torch.rand(256, generator=g) * 0.05 + 0.001
    fallbacks.static_scaled_fp8_quant(q, x, per_channel, [-1, 1])
    assert_fp8_close(q, per_channel.expand(8, 256), x.double())
    with pytest.raises(ValueError, match="static_scaled_fp8_quant.*group_shape"):
        fallbacks.static_scaled_fp8_quant(q, x, per_channel)


def test_dynamic_fp8_quants():
    g = torch.Generator().manual_seed(9)
    x = torch.randn(6, 64, generator=g).to(torch.bfloat16)
    q = torch.empty_like(x, dtype=FP8)
    s = torch.empty(1)
    fallbacks.dynamic_scaled_fp8_quant(q, x, s)
    torch.testing.assert_close(s.double(), x.double().abs().amax().reshape(1) / FP8_MAX, rtol=1e-6, atol=0)
    assert_fp8_close(q, s, x.double())
    st = torch.empty(6, 1)
    fallbacks.dynamic_per_token_scaled_fp8_quant(q, x, st, torch.tensor(1.0))
    want = ref_dynamic_scale(x.double().abs().amax(-1, keepdim=True), ub=1.0)
    torch.testing.assert_close(st.double(), want, rtol=1e-6, atol=0)
    assert_fp8_close(q, st, x.double())


@pytest.mark.parametrize("ue8m0", [False, True])
def test_per_token_group_fp8_quant(ue8m0):
    g = torch.Generator().manual_seed(10)
    x = torch.randn(4, 256, generator=g).to(torch.bfloat16)
    q = torch.empty_like(x, dtype=FP8)
    s = torch.empty(2, 4).t()  # column-major scales
    C("per_token_group_fp8_quant")(x, q, s, 128, 1e-10, -FP8_MAX, FP8_MAX, ue8m0, True, False)
    amax = x.double().reshape(4, 2, 128).abs().amax(-1).clamp(min=1e-10)
    want = amax / FP8_MAX
    if ue8m0:
        want = torch.tensor([[2.0 ** math.ceil(math.log2(v)) for v in row] for row in want.tolist()], dtype=torch.float64)
    torch.testing.assert_close(s.double(), want, rtol=1e-6, atol=0)
    assert_fp8_close(q, s.repeat_interleave(128, 1), x.double())


# ---- NVFP4 -------------------------------------------------------------------------------


def decode_e2m1(packed):
    """uint8 [m, n/2] -> float64 [m, n]; low nibble first."""
    lo, hi = packed & 0xF, packed >> 4
    codes = torch.stack([lo, hi], dim=-1).reshape(packed.shape[0], -1).long()
    mag = E2M1_GRID[codes & 7]
    return torch.where((codes & 8) != 0, -mag, mag)


def unswizzle(sf_int32, m, k):
    """Independent reading of the 128x4 tiled layout: byte offset of (row, col) is
    tile(row//128, col//4) * 512 + (row % 32) * 16 + ((row % 128) // 32) * 4 + col % 4."""
    raw = sf_int32.contiguous().view(torch.uint8).reshape(-1)
    k_tiles = (k + 3) // 4
    out = torch.empty(m, k, dtype=torch.uint8)
    for r in range(m):
        for c in range(k):
            off = ((r // 128) * k_tiles + c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4
            out[r, c] = raw[off]
    return out


def check_nvfp4(x64, global_scale, packed, sf_bytes):
    """Block scales are e4m3(g * amax / 6); each value is a nearest E2M1 point of x * g / sf."""
    m, n = x64.shape
    g = float(global_scale)
    blocks = x64.reshape(m, n // 16, 16)
    want_sf = (g * blocks.abs().amax(-1) / 6.0).clamp(max=448.0).to(FP8)
    got_sf = sf_bytes.view(FP8)
    assert torch.equal(got_sf.view(torch.uint8), want_sf.view(torch.uint8))
    sf = got_sf.double()
    target = (blocks * torch.where(sf == 0, 0.0, g / sf).unsqueeze(-1)).clamp(-6, 6).reshape(m, n)
    dec = decode_e2m1(packed)
    best = (target.abs().unsqueeze(-1) - E2M1_GRID).abs().amin(-1)
    assert torch.allclose((dec - target).abs(), best, atol=1e-6), "not a nearest E2M1 value"
    assert (torch.sign(dec) * torch.sign(target) >= 0).all()
    # dequantized error is bounded by half the widest E2M1 gap at the block scale
    deq = dec.reshape(m, n // 16, 16) * (sf / g).unsqueeze(-1)
    assert ((deq - blocks).abs() <= (sf / g).unsqueeze(-1) * 1.0 + 1e-9).all()


@pytest.mark.parametrize("m", [3, 130])
@pytest.mark.parametrize("swizzled", [True, False])
def test_scaled_fp4_quant(m, swizzled):
    g = torch.Generator().manual_seed(11)
    n = 80  # 5 blocks: scale columns padded to 8 when swizzled
    x = (torch.randn(m, n, generator=g) * torch.rand(m, 1, generator=g) * 4).to(torch.bfloat16)
    x[0, :16] = 0  # an all-zero block: scale 0, values 0
    gs = torch.tensor([448.0 * 6.0 / x.float().abs().amax().item()])
    out, sf = C("scaled_fp4_quant")(x, gs, swizzled)
    assert out.shape == (m, n // 2) and out.dtype == torch.uint8
    if swizzled:
        assert sf.shape == ((m + 127) // 128 * 128, 2) and sf.dtype == torch.int32
        sf_bytes = unswizzle(sf, m, n // 16)
        full = unswizzle(sf, (m + 127) // 128 * 128, 8)
        pad = torch.ones_like(full, dtype=torch.bool)
        pad[:m, : n // 16] = False
        assert (full[pad] == 0).all(), "padding scales must be zero"
    else:
        assert sf.shape == (m, n // 16)
        sf_bytes = sf
    check_nvfp4(x.double(), gs, out, sf_bytes)
    # the .out overload writes the same bytes
    out2 = torch.empty_like(out)
    sf2 = torch.empty_like(sf)
    C("scaled_fp4_quant").out(x, gs, swizzled, output=out2, output_scale=sf2)
    assert torch.equal(out2, out) and torch.equal(sf2, sf)


def test_scaled_fp4_quant_padded_output_and_vllm_wrapper():
    from vllm import _custom_ops as ops

    g = torch.Generator().manual_seed(12)
    x = torch.randn(4, 32, generator=g).to(torch.float16)
    gs = torch.tensor([100.0])
    out, sf = ops.scaled_fp4_quant(x, gs, is_sf_swizzled_layout=False, padded_n=64)
    assert out.shape == (4, 32) and sf.shape == (4, 4)
    check_nvfp4(x.double(), gs, out[:, :16], sf[:, :2].view(torch.uint8))
    assert (out[:, 16:] == 0).all() and (sf[:, 2:].view(torch.uint8) == 0).all()


def test_silu_and_mul_nvfp4_quant():
    g = torch.Generator().manual_seed(13)
    x = (torch.randn(5, 128, generator=g) * 2).to(torch.bfloat16)
    act = ref_silu_mul(x).to(torch.bfloat16).double()  # the kernel rounds the activation to bf16
    gs = torch.tensor([448.0 * 6.0 / act.abs().amax().item()])
    out = torch.empty(5, 32, dtype=torch.uint8)
    sf = torch.empty(128, 1, dtype=torch.int32)
    C("silu_and_mul_nvfp4_quant")(out, sf, x, gs)
    check_nvfp4(act, gs, out, unswizzle(sf, 5, 4))


def test_e2m1_rounding_ties_to_even():
    v = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.1, 6.0, 0.26])
    codes = nvfp4.e2m1_codes(v)
    want = [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, -0.0, 6.0, 0.5]
    assert E2M1_GRID[codes.long() & 7].tolist() == [abs(w) for w in want]
    assert ((codes & 8) != 0).tolist() == [False] * 7 + [True, False, False]


# ---- errors, fakes, torch.compile --------------------------------------------------------


@pytest.mark.parametrize(
    "call, exc, match",
    [
        (lambda: C("rms_norm_static_fp8_quant")(torch.empty(2, 8, dtype=FP8), torch.randn(2, 8), torch.ones(4),
                                                 torch.tensor([1.0]), 1e-6), ValueError, "weight shape"),
        (lambda: C("rms_norm_static_fp8_quant")(torch.empty(2, 8), torch.randn(2, 8), torch.ones(8),
                                                 torch.tensor([1.0]), 1e-6), TypeError, "result must have dtype"),
        (lambda: C("rms_norm_per_block_quant")(torch.empty(2, 96, dtype=FP8), torch.randn(2, 96), torch.ones(96),
                                                torch.empty(2, 1), 1e-6, None, None, 64, False),
         ValueError, "not a multiple of group_size"),
        (lambda: C("silu_and_mul_per_block_quant")(torch.empty(2, 128, dtype=FP8), torch.randn(2, 255),
                                                    torch.empty(2, 1), 128, None, False), ValueError, "even"),
        (lambda: C("scaled_fp4_quant")(torch.randn(2, 30).half(), torch.tensor([1.0]), True),
         ValueError, "multiple of 16"),
        (lambda: C("scaled_fp4_quant")(torch.randn(2, 32), torch.tensor([1.0]), True), TypeError, "float16 or bfloat16"),
        (lambda: C("fused_qk_norm_rope")(torch.empty(2, 8), 1, 1, 1, 2, 1e-6, torch.ones(2), torch.ones(2),
                                          torch.ones(4, 2), True, torch.zeros(2, dtype=torch.long)),
         NotImplementedError, "no kernel"),
    ],
)
def test_bad_input_raises_clear_errors(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_fakes_give_shapes_and_check_inputs():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(300, 64, dtype=torch.bfloat16)
        out, sf = C("scaled_fp4_quant")(x, torch.empty(1), True)
        assert out.shape == (300, 32) and sf.shape == (384, 1) and sf.dtype == torch.int32
        res = torch.empty(300, 64, dtype=FP8)
        C("rms_norm_per_block_quant")(res, x, torch.empty(64, dtype=torch.bfloat16), torch.empty(300, 1), 1e-6,
                                       None, None, 64, False)
        with pytest.raises(ValueError, match="scale shape"):
            C("rms_norm_per_block_quant")(res, x, torch.empty(64, dtype=torch.bfloat16), torch.empty(300, 2), 1e-6,
                                           None, None, 64, False)


def test_torch_compile_matches_eager():
    def f(x, w, r):
        res = torch.empty(x.shape, dtype=FP8, device=x.device)
        scale = torch.empty(x.shape[0], x.shape[1] // 64, dtype=torch.float32, device=x.device)
        torch.ops._C.rms_norm_per_block_quant(res, x, w, scale, 1e-6, None, r, 64, False)
        out, sf = torch.ops._C.scaled_fp4_quant(r, torch.tensor([50.0]), True)
        act = torch.empty(x.shape[0], x.shape[1] // 2, dtype=FP8)
        s2 = torch.empty(x.shape[0], 1)
        torch.ops._C.silu_and_mul_per_block_quant(act, x, s2, 64, None, False)
        return res.float() * scale.repeat_interleave(64, 1), out, sf, act.float(), s2

    g = torch.Generator().manual_seed(14)
    x = torch.randn(4, 128, generator=g).to(torch.bfloat16)
    w = torch.randn(128, generator=g).to(torch.bfloat16)
    r = torch.randn(4, 128, generator=g).to(torch.bfloat16)
    r_eager, r_comp = r.clone(), r.clone()
    eager = f(x, w, r_eager)
    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)(x, w, r_comp)
    assert torch.equal(r_eager, r_comp) and not torch.equal(r_eager, r)
    for a, b in zip(eager, compiled):
        assert torch.equal(a, b)
