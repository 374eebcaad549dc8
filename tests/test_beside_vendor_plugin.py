"""Beside an out-of-tree platform plugin that registers its own classes, the way vLLM-metax does
(issue 23): a small plugin written here (``vendor_oot``), found by vLLM through entry points
like any installed plugin, whose platform (a CpuPlatform subclass, so it runs on this host) is
the active one and whose general plugin registers

* its own ``moe_wna16`` quantization config (vLLM-metax: ``MacaMoeWNA16Config``) whose MoE
  method reads ``self.moe.disable_inplace`` (vLLM-metax's v0.23/v0.24 lines), and
* its own TurboQuant attention backend under ``AttentionBackendEnum.TURBOQUANT`` (a copy with
  its own builder and impl methods).

In a fresh process, vLLM resolves the platform and loads every general plugin (ours and the
vendor's, in whatever order the entry points come). Then: our platform probe stood aside, the
vendor's config is the one registered, its MoE method runs (our ``disable_inplace`` default),
and resolving the TurboQuant backend as vLLM's selector does lands our verify routing on the
vendor's classes; doctor lists each fix with its target class. Runs with the plugins loaded in
both orders.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

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
    backend = selector.resolve_obj_by_qualname(AttentionBackendEnum.TURBOQUANT.get_path())
    out["turboquant_backend"] = f"{backend.__module__}.{backend.__qualname__}"
    out["vendor_forward_patched"] = patching.is_patched("vendor_oot.attn:VendorTurboQuantImpl.forward")
    info = cli.collect()
    out["entries"] = {e["name"]: [e["status"], e["detail"]] for e in info["bootstrap"]["entries"]
                      if e["step"] in ("patch", "quant")}
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
    e = out["entries"]
    assert e["moe.disable_inplace_default"][0] == "applied"
    assert e["turboquant_spec_verify -> vendor_oot.attn.VendorTurboQuantBackend"][0] == "applied"
    assert "vendor_oot.attn:VendorTurboQuantImpl.forward" in e["turboquant_spec_verify -> "
                                                               "vendor_oot.attn.VendorTurboQuantBackend"][1]
    if vendor_first:  # the vendor registered before our bootstrap: kept, and said so
        assert e["moe_wna16"][0] == "skipped" and "kept vendor_oot.quant.VendorMoeWNA16Config" in e["moe_wna16"][1]
    assert out["compat_table"]["table"] == "0.32" and not out["compat_table"]["note"]
    # doctor's live view names the vendor's classes whichever order the plugins ran in
    assert ["moe_wna16", "vendor_oot.quant.VendorMoeWNA16Config", "kept as registered"] in out["fix_targets"]
    assert ["turboquant_spec_verify", "vendor_oot.attn.VendorTurboQuantBackend", "patched"] in out["fix_targets"]
