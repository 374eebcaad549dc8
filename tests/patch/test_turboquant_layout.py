"""The verify route's contract with the tensors vLLM hands it (issue 29 item 1): the cache layout is
probed from the line's backend, an unknown layout skips the route with the reason, and a cache or
metadata tensor that does not match what the op documents keeps vLLM's own path (reported once as a
failure), never a wrong view."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import vllm_platform_ext.report
from vllm_platform_ext.report import Report, Status
from vllm_platform_ext.patch.turboquant import spec_verify as wiring
from vllm_platform_ext.patch.turboquant import cache_view as TL


def _backend(shape_fn):
    cls = type("FakeTQBackend", (), {"__module__": "fake_line"})
    if shape_fn is not None:
        cls.get_kv_cache_shape = staticmethod(shape_fn)
    return cls


@pytest.mark.parametrize("order,axes", [
    ("bnhc", ("blocks", "tokens", "heads", "slot")),  # 0.22-0.25
    ("bhnc", ("blocks", "heads", "tokens", "slot")),  # 0.26-0.28
])
def test_probe_reads_the_order_the_backend_answers(order, axes):
    def shape(nb, bs, h, d, cache_dtype_str=None):
        return {"bnhc": (nb, bs, h, 100), "bhnc": (nb, h, bs, 100)}[order]

    lay = TL.probe(_backend(shape))
    assert lay.axes == axes
    cache = torch.zeros(*shape(5, 16, 2, 64), dtype=torch.uint8)
    view = lay.op_view(cache)
    assert tuple(view.shape) == (5, 16, 2, 100) and view.data_ptr() == cache.data_ptr()  # a view, no copy
    assert lay.check(view, 2, 100) is None


@pytest.mark.parametrize("answer,match", [
    (lambda *a, **k: (7, 16, 3, 2, 100), "not 4 dims"),
    (lambda *a, **k: (7, 16, 16, 100), "no \\(blocks, tokens, heads\\) order"),
    (lambda *a, **k: (7, 3, 16, 3), "no \\(blocks, tokens, heads\\) order"),  # slot equal to a probe size
])
def test_unknown_answers_raise_layout_unknown(answer, match):
    with pytest.raises(TL.LayoutUnknown, match=match):
        TL.probe(_backend(answer))


def test_a_raising_backend_is_an_unknown_contract():
    def boom(*a, **k):
        raise TypeError("unexpected keyword argument 'cache_dtype_str'")

    with pytest.raises(TL.LayoutUnknown, match="get_kv_cache_shape raised TypeError"):
        TL.probe(_backend(boom))


def test_no_shape_and_no_logical_layout_module_is_unknown(monkeypatch):
    monkeypatch.setattr(TL, "_logical_axes_of_line", lambda: None)
    with pytest.raises(TL.LayoutUnknown, match="cache layout unknown"):
        TL.probe(_backend(None))


def test_logical_layout_of_this_line():
    """vLLM 0.32 (this venv): no get_kv_cache_shape, the logical [B, H, N, C] of kv_cache_layout."""
    from vllm.v1.attention.backends.turboquant_attn import TurboQuantAttentionBackend

    lay = TL.probe(TurboQuantAttentionBackend)
    assert lay.axes == ("blocks", "heads", "tokens", "slot") and "kv_cache_layout" in lay.source


def test_group_skips_with_the_reason_where_the_layout_is_unknown(monkeypatch):
    def unknown(backend):
        raise TL.LayoutUnknown("no layout here")

    monkeypatch.setattr(TL, "probe", unknown)
    group = next(g for g in wiring.GROUPS if g.name == wiring.NAME)
    reason = group.skip_if()
    assert reason and "cache layout unknown" in reason and "no layout here" in reason


@pytest.mark.parametrize("shape,heads,slot,match", [
    ((5, 16, 2, 100), 4, 100, "has 2 heads and 100-byte slots, the impl 4 heads"),
    ((5, 16, 2, 96), 2, 100, "96-byte slots"),
    ((5, 16, 200), 2, 100, "3 dims"),
])
def test_check_names_the_mismatch(shape, heads, slot, match):
    lay = TL.CacheLayout(("blocks", "tokens", "heads", "slot"), "test")
    assert match in lay.check(torch.zeros(shape, dtype=torch.uint8), heads, slot)
    assert "byte cache" in lay.check(torch.zeros(5, 16, heads, slot, dtype=torch.bfloat16), heads, slot)


@pytest.fixture
def report(monkeypatch):
    rep = Report()
    monkeypatch.setattr(vllm_platform_ext.report, "current", lambda: rep)
    monkeypatch.setattr(wiring, "_REPORTED", set())
    return rep


def _impl(layout):
    impl = type("FakeImpl", (), {})()
    impl.num_heads, impl.num_kv_heads, impl.head_size, impl.kv_cache_dtype = 4, 2, 64, "turboquant_k8v4"
    impl.scale = 0.125
    impl._ensure_on_device = lambda layer, device: None
    if layout is not None:
        TL._LAYOUTS[type(impl)] = layout
    return impl


def _metadata(b=2, k1=3):
    return SimpleNamespace(num_actual_tokens=b * k1, block_table=torch.zeros(b, 4, dtype=torch.int32),
                           seq_lens=torch.full((b,), 20, dtype=torch.int32), verify_rows=None)


def _layer(centroids=None, pit=None):
    return SimpleNamespace(_tq_centroids=torch.linspace(-1, 1, 16) if centroids is None else centroids,
                           _tq_PiT=torch.eye(64) if pit is None else pit)


def test_a_cache_not_in_the_probed_layout_keeps_vllms_path(report):
    """The 0.23 bug's shape: a (blocks, block_size, heads, slot) cache seen through a head-major
    layout would read 16 heads; the route declines and reports it once, never a wrong view."""
    from vllm_platform_ext.ops.turboquant.layout import layout_for

    slot = layout_for("turboquant_k8v4", 64).slot_size_aligned
    impl = _impl(TL.CacheLayout(("blocks", "heads", "tokens", "slot"), "test"))
    cache = torch.zeros(10, 16, 2, slot, dtype=torch.uint8)
    q = torch.zeros(6, 4 * 64)
    for _ in range(2):  # reported once per distinct reason, not per layer and step
        assert wiring.verify_forward(impl, _layer(), q, cache, _metadata(), None, 3) is None
    (entry,) = [e for e in report.entries if "engine tensors" in e.name]
    assert entry.status == Status.FAILED and "16 heads" in entry.detail and "keep vLLM's path" in entry.detail


def test_no_probed_layout_keeps_vllms_path(report):
    impl = _impl(None)
    cache = torch.zeros(10, 16, 2, 100, dtype=torch.uint8)
    assert wiring.verify_forward(impl, _layer(), torch.zeros(6, 256), cache, _metadata(), None, 3) is None
    assert any("no cache layout was probed" in e.detail for e in report.entries)


@pytest.mark.parametrize("what,tweak,match", [
    ("block_table", lambda md, layer: setattr(md, "block_table", torch.zeros(2, 4, dtype=torch.float32)), "block_table"),
    ("block_table rows", lambda md, layer: setattr(md, "block_table", torch.zeros(1, 4, dtype=torch.int32)), "block_table"),
    ("seq_lens", lambda md, layer: setattr(md, "seq_lens", torch.zeros(2, 1, dtype=torch.int32)), "seq_lens"),
    ("centroids", lambda md, layer: setattr(layer, "_tq_centroids", None), "_tq_centroids"),
    ("PiT", lambda md, layer: setattr(layer, "_tq_PiT", torch.eye(32)), "_tq_PiT"),
])
def test_metadata_or_layer_tensors_not_as_documented_keep_vllms_path(report, what, tweak, match):
    from vllm_platform_ext.ops.turboquant.layout import layout_for

    slot = layout_for("turboquant_k8v4", 64).slot_size_aligned
    impl = _impl(TL.CacheLayout(("blocks", "tokens", "heads", "slot"), "test"))
    md, layer = _metadata(), _layer()
    tweak(md, layer)
    cache = torch.zeros(10, 16, 2, slot, dtype=torch.uint8)
    assert wiring.verify_forward(impl, layer, torch.zeros(6, 256), cache, md, None, 3) is None, what
    (entry,) = [e for e in report.entries if "engine tensors" in e.name]
    assert entry.status == Status.FAILED and match in entry.detail, entry.detail


def test_tensor_contract_accepts_what_the_lines_hand_over():
    assert wiring.tensor_contract(torch.zeros(3, 8, dtype=torch.int32), torch.zeros(3, dtype=torch.int32), 3,
                                  torch.zeros(8), torch.eye(128), 128) is None


def test_gpu_tests_hand_vllm_store_only_the_line_layout():
    """vLLM's store writes the line's own cache layout (0.23: ``(num_blocks, block_size, heads, slot)``
    contiguous; it takes ``kv_cache.view(-1)``). A GPU test that hands it our head-major view fails
    inside vLLM's kernel (seen on the H200, 0.23.0, 2026-11-27: the forced-e4b15 test). This checks,
    on the CPU, that every ``make_cache`` of ``tests/ops/test_turboquant_gpu.py`` that stores with a
    given ``store`` asks for ``layout="line"``."""
    import ast
    from pathlib import Path

    from conftest import REPO

    src = Path(REPO) / "tests" / "ops" / "test_turboquant_gpu.py"
    calls = [n for n in ast.walk(ast.parse(src.read_text())) if isinstance(n, ast.Call)
             and getattr(n.func, "id", None) == "make_cache" and any(k.arg == "store" for k in n.keywords)]
    assert len(calls) >= 2, "the GPU tests no longer store with vLLM's kernel: update this check"
    for c in calls:
        layout = next((k.value for k in c.keywords if k.arg == "layout"), None)
        assert isinstance(layout, ast.Constant) and layout.value == "line", (
            f"test_turboquant_gpu.py:{c.lineno}: make_cache(store=...) without layout='line'")
