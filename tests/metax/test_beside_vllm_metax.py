"""Beside vLLM-metax's real Python package, on each of its five branches (issue 33, item 1).

A CPU stand-in per branch (``tests/fixtures/metax_standin.py`` says what is real and what is
stubbed, and why): the branch's vLLM line without its kernel library, vLLM-metax's package of
that branch from ``../shared/vllm-metax/<branch>/``, both plugins found through entry points
and loaded by vLLM's own loader, with vLLM-metax's entry points first and ours first. Per
branch and order a fresh process shows:

* vLLM resolves vLLM-metax's platform; our ``register()`` returns None;
* our compat ran before vLLM-metax's general plugin imported its patches / registry and before
  the MTP imports of the seeds (``act_quant_fusion``, the quantization package), which then
  import -- in the process and (metax-first order) in a spawned child, as a spawned EngineCore;
* each fix lands on the class the branch uses: its TurboQuant backend (still ours after
  vLLM-metax's ``register_attention_backends()`` runs again, as its ``get_attn_backend_cls``
  does on every call), its ``moe_wna16`` (its registration untouched; its MoE method's ``apply`` runs on the
  line's ``FusedMoEConfig`` where it reads ``disable_inplace``; "not needed" where it does not), GDN
  (master: its ``ChunkGatedDeltaRule`` OOT op kept, no second ``register_oot``; our layer fix
  applied); doctor names the branch and each target.

Skipped, with the reason, where ``../shared/vllm-metax`` is absent; the tests' own vendor-style
plugin (``test_beside_vendor_plugin.py``) runs either way.
"""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from conftest import REPO, load_tool

_spec = importlib.util.spec_from_file_location("metax_standin", Path(__file__).resolve().parents[1] / "fixtures" / "metax_standin.py")
standin = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(standin)

SRC = standin.metax_source()
pytestmark = pytest.mark.skipif(SRC is None, reason="../shared/vllm-metax (vLLM-metax's source) is absent: "
                                                    "set VLLM_METAX_SRC to run these")

CHILD = r'''
import importlib, inspect, json, os, sys, types

# which watched modules were first imported before our compat step had run
WATCH = ("vllm_metax.patch", "vllm_metax.registry", "vllm_metax.customized", "vllm_metax.quant_config",
         "vllm.compilation.passes.fusion.act_quant_fusion", "vllm.model_executor.layers.quantization",
         "vllm.v1.spec_decode.eagle")
FIRST_IMPORT = {}


class _Watch:
    """First on sys.meta_path: sees every first import of a module by any route (an import
    statement, importlib.import_module, __import__), records whether compat had run, finds nothing."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        if name in WATCH and name not in FIRST_IMPORT:
            ours = sys.modules.get("vllm_platform_ext")
            FIRST_IMPORT[name] = bool(ours is not None and ours.bootstrap.compat_done())
        return None


sys.meta_path.insert(0, _Watch)
MTP_PATH = ("vllm.compilation.passes.fusion.act_quant_fusion", "vllm._custom_ops",
            "vllm.model_executor.layers.quantization", "vllm.model_executor.layers.quantization.moe_wna16",
            "vllm.v1.spec_decode.eagle", "vllm.model_executor.models.qwen3_next_mtp")


def qual(obj):
    return f"{obj.__module__}.{obj.__qualname__}"


def imports():
    out = {}
    for name in MTP_PATH:
        try:
            __import__(name)  # the import statement's path (raises the audit hook's "import" event)
            out[name] = "ok"
        except Exception as e:
            out[name] = f"{type(e).__name__}: {str(e)[:200]}"
    return out


def turboquant():
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    import vllm.v1.attention.selector as selector
    from vllm_platform_ext import patching
    from vllm_platform_ext.patch.turboquant import spec_verify as tq
    import vllm_metax.platform as mp

    out = {}
    # vLLM-metax's get_attn_backend_cls() (and pre_register_and_update) runs
    # register_attention_backends() on every call, then returns TURBOQUANT's path for vLLM's
    # selector to resolve: that, twice
    for when in ("first", "after register_attention_backends()"):
        mp.register_attention_backends()
        backend = selector.resolve_obj_by_qualname(AttentionBackendEnum.TURBOQUANT.get_path())
        impl, builder = backend.get_impl_cls(), backend.get_builder_cls()
        out[when] = {"backend": qual(backend),
                     "patched": [a for k, a, _ in tq._FACTORIES if patching.carries(impl if k == "impl" else builder, a, tq.NAME)],
                     "forward_is_ours": patching.is_patched(f"{impl.__module__}:{impl.__qualname__}.forward"),
                     "shape_is_ours": patching.carries(backend, "get_kv_cache_shape", "turboquant.v1_runner_cache_dtype")}
    cg = getattr(builder, "_cudagraph_support", None)
    out["declared_cudagraph_support"] = getattr(cg, "name", str(cg))
    return out


def moe():
    from vllm.model_executor.layers.quantization import get_quantization_config
    from vllm.model_executor.layers.fused_moe.config import FusedMoEConfig

    cfg = get_quantization_config("moe_wna16")
    mod = sys.modules[cfg.__module__]
    out = {"config": qual(cfg), "field_on_line": "disable_inplace" in getattr(FusedMoEConfig, "__dataclass_fields__", {}),
           "class_default": getattr(FusedMoEConfig, "disable_inplace", "absent")}
    method_cls = getattr(mod, "MoeWNA16Method", None)
    if method_cls is None or method_cls.__module__ != mod.__name__:
        out["apply"] = "no MoE method of its own"
        return out
    src = inspect.getsource(method_cls.apply)
    out["reads_disable_inplace"] = "disable_inplace" in src
    seen = {}
    if hasattr(mod, "get_fused_experts_fn"):  # the kernel launcher (Triton, MetaX): record its arguments
        mod.get_fused_experts_fn = lambda *a, **k: (lambda *a, **k: seen.update(k) or "kernel")
    method = object.__new__(method_cls)
    method.moe = object.__new__(FusedMoEConfig)  # the line's config (fields unset: what apply reads)
    method.moe_quant_config = None
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation
    layer = types.SimpleNamespace(activation=MoEActivation.SILU, w13_qweight=None, w2_qweight=None,
                                  apply_router_weight_on_input=False, global_num_experts=4, expert_map=None)
    params = list(inspect.signature(method_cls.apply).parameters)[1:]
    args = [layer] + [None] * (len(params) - 1)
    try:
        method.apply(*args)
        out["apply"] = {"inplace": seen.get("inplace")}
    except Exception as e:
        out["apply"] = f"{type(e).__name__}: {str(e)[:200]}"
    return out


def mtp_quant():
    """vLLM-metax's GPTQ config (registered as gptq) on the MTP layer's experts: quant.mtp_layer_config
    lands on its class (at bootstrap where vLLM-metax's plugin ran first, else at model init through
    vLLM's configure_quant_config); on, then off."""
    import pathlib
    import torch
    import vllm_platform_ext
    from vllm_platform_ext import patching, quant
    from vllm_platform_ext.quant import mtp_layer
    from vllm.model_executor.layers.quantization import get_quantization_config
    import vllm.model_executor.model_loader.utils as loader_utils

    sys.path.insert(0, str(pathlib.Path(vllm_platform_ext.__file__).parents[1] / "tests" / "quant"))
    import mtp_layer_child as kit

    cls = get_quantization_config("gptq")
    out = {"config": qual(cls), "at_bootstrap": patching.carries(cls, "get_quant_method", mtp_layer.NAME)}
    cfg = cls.from_config(dict(kit.DYN))
    loader_utils.configure_quant_config(cfg, type("Model", (torch.nn.Module,), {}))  # what model init runs
    out["at_model_init"] = patching.carries(cls, "get_quant_method", mtp_layer.NAME)
    layer = kit.moe_layer(128)
    out["on"] = {"mtp_moe": kit.choice(cfg, layer, kit.MTP_MOE), "target_moe": kit.choice(cfg, layer, kit.TGT_MOE)}
    patching.restore(mtp_layer.NAME)
    out["off"] = {"mtp_moe": kit.choice(cfg, layer, kit.MTP_MOE), "target_moe": kit.choice(cfg, layer, kit.TGT_MOE)}
    (group,) = [g for g in quant.groups() if g.name == mtp_layer.NAME]
    patching.apply(group.name, list(group.build()))
    return out


def gdn():
    from vllm.model_executor import custom_op
    oot = custom_op.op_registry_oot.get("ChunkGatedDeltaRule")  # vLLM's out-of-tree op registry
    return {"chunk_op_oot": qual(oot) if oot else None}


def state(spawned=False):
    from vllm.platforms import current_platform
    from importlib.metadata import entry_points
    import vllm_platform_ext as v
    from vllm.plugins import load_general_plugins

    out = {"general_plugins": [ep.value for ep in entry_points(group="vllm.general_plugins")],
           "platform": qual(type(current_platform)), "our_register": v.register()}
    from vllm_platform_ext import detect
    out["probe_reason"] = detect.probe().reason
    load_general_plugins()
    out["first_import_after_compat"] = dict(FIRST_IMPORT)
    out["imports"] = imports()
    out["first_import_after_compat"] = dict(FIRST_IMPORT)
    out["watched_loaded"] = sorted(m for m in WATCH if m in sys.modules)
    out["bootstrap"] = v.bootstrap.info()["summary"]
    out["runs"] = v.bootstrap.info()["runs"]
    out["entries"] = {e["name"]: [e["status"], e["detail"][:300]] for e in v.bootstrap.info()["entries"]
                      if e["step"] != "compat" or e["status"] == "failed"}
    out["steps"] = sorted({e["step"] for e in v.bootstrap.info()["entries"]})
    if spawned:
        return out
    from vllm_platform_ext import cli
    out["turboquant"] = turboquant()
    out["moe"] = moe()
    out["mtp_quant"] = mtp_quant()
    out["gdn"] = gdn()
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    out["may_reorder_batch"] = GPUModelRunner._may_reorder_batch.__module__
    info = cli.collect()
    out["doctor"] = {k: info.get(k) for k in ("vllm_metax", "fix_targets", "compat_table")}
    out["doctor"]["versions"] = info["versions"]
    return out


def child(q):
    q.put(state(spawned=True))


if __name__ == "__main__":
    import multiprocessing as mp
    res = {"main": state()}
    if "--spawn" in sys.argv:
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        p = ctx.Process(target=child, args=(q,))
        p.start()
        res["spawned"] = q.get(timeout=600)
        p.join(60)
    print("JSON" + json.dumps(res, default=str))
'''

BRANCHES = list(standin.BRANCHES)


@pytest.fixture(scope="session")
def line_dirs():
    lines = load_tool("ci/tools/vllm_lines.py")
    missing = lines.deps_missing()
    if missing:
        pytest.fail(missing)
    tables = load_tool("ci/tools/compat_tables.py")
    out = {}
    for branch, (vllm_version, _) in standin.BRANCHES.items():
        wheel = tables.find_wheel(vllm_version)
        if wheel is None:
            pytest.fail(f"no vllm-{vllm_version} wheel in {tables.WHEEL_DIR}: run `python ci/tools/compat_tables.py fetch`")
        out[branch] = lines.extract(wheel, vllm_version)
    return out, lines.DEPS_DIR


@pytest.fixture(scope="session")
def mxsml_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("mxsml")
    standin.build_fake_mxsml(d)
    return d


_RESULTS: dict = {}


def run_branch(branch, metax_first, line_dirs, mxsml_dir, tmp_path_factory):
    key = (branch, metax_first)
    if key not in _RESULTS:
        dirs, deps = line_dirs
        root = tmp_path_factory.mktemp(f"{branch}-{'metax' if metax_first else 'ours'}-first")
        env = standin.standin_env(root, branch, dirs[branch], deps, metax_first, mxsml_dir)
        script = root / "child.py"
        script.write_text(CHILD)
        proc = standin.run_child(script, env, ["--spawn"] if metax_first else [])
        lines = [line for line in proc.stdout.splitlines() if line.startswith("JSON")]
        assert proc.returncode == 0 and lines, f"rc={proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-8000:]}"
        _RESULTS[key] = json.loads(lines[-1][4:])
    return _RESULTS[key]


ORDERS = [pytest.param(True, id="metax-first"), pytest.param(False, id="ours-first")]


@pytest.mark.parametrize("metax_first", ORDERS)
@pytest.mark.parametrize("branch", BRANCHES)
def test_platform_compat_order_and_fix_targets(branch, metax_first, line_dirs, mxsml_dir, tmp_path_factory):
    res = run_branch(branch, metax_first, line_dirs, mxsml_dir, tmp_path_factory)
    out = res["main"]
    vllm_line = standin.BRANCHES[branch][0]
    # the order vLLM's loader finds (and calls) the general plugins in
    ours = "vllm_platform_ext.general_plugin:bootstrap"
    gp = out["general_plugins"]
    assert ours in gp and (gp.index(ours) > 0) == metax_first, gp
    # platform: vLLM-metax's, ours steps aside with the reason
    # the fixture stubs pymxsml (tests/fixtures/metax_standin.py), so the MXSML platform resolves
    assert out["platform"] == "vllm_metax.platform.MxsmlMacaPlatform", out["platform"]
    assert out["our_register"] is None and "another" in out["probe_reason"], out["probe_reason"]
    # compat ran before vLLM-metax's plugins imported anything watched, and before the MTP imports
    early = out["first_import_after_compat"]
    assert early and all(early.values()), early
    # every watched module loaded by the end was seen at its first import (any route), after compat;
    # vLLM-metax's patch package (all branches) among them
    assert sorted(early) == out["watched_loaded"] and "vllm_metax.patch" in early, (early, out["watched_loaded"])
    print(f"\n[{branch} {'metax' if metax_first else 'ours'}-first] imported after compat: {sorted(early)}")
    assert {"vllm.compilation.passes.fusion.act_quant_fusion", "vllm.model_executor.layers.quantization"} <= set(early)
    assert out["imports"]["vllm.compilation.passes.fusion.act_quant_fusion"] == "ok", out["imports"]
    bad = {k: v for k, v in out["imports"].items() if v != "ok"}
    assert not bad, bad
    assert out["runs"] == 1 and " 0 failed" in out["bootstrap"], (out["bootstrap"], out["entries"])
    # TurboQuant: its backend, patched, and still patched after its re-registration
    tq = out["turboquant"]
    for when in ("first", "after register_attention_backends()"):
        assert tq[when]["backend"] == "vllm_metax.v1.attention.backends.turboquant_attn.MacaTurboQuantAttentionBackend"
        assert tq[when]["forward_is_ours"] and len(tq[when]["patched"]) == 4, tq
        # its V1 runner (0.25/0.26: v0.25.0-dev, master) reshapes TurboQuant layers for dtype "auto":
        # the fix lands on its copy's get_kv_cache_shape (missed there once: GPU stand-in, 2026-11-27)
        assert tq[when]["shape_is_ours"] is (branch in ("v0.25.0-dev", "master")), (branch, tq)
    assert tq["declared_cudagraph_support"] == "UNIFORM_BATCH", tq  # its class attribute; ours decides with spec
    # moe_wna16: its config; its apply runs on the line's FusedMoEConfig where it reads the field
    moe = out["moe"]
    assert moe["config"].startswith("vllm_metax.") and moe["config"].endswith("MoeWNA16Config"), moe
    if moe.get("reads_disable_inplace"):  # v0.22-v0.24: runs, on the line's field or on ours
        assert moe["apply"] == {"inplace": not moe["class_default"]}, moe
        if not moe["field_on_line"]:  # 0.23+ dropped the field: ours, in place as PR #294 reads it
            assert moe["class_default"] is False and out["entries"]["moe.disable_inplace_default"][0] == "applied"
    else:
        assert moe.get("reads_disable_inplace") is False or moe["apply"] == "no MoE method of its own", moe
        if moe.get("reads_disable_inplace") is False:  # v0.25/master: our field default is not needed
            entry = out["entries"]["moe.disable_inplace_default"]
            assert entry[0] == "skipped" and "not needed" in entry[1], entry
    # GDN: master registers its chunk op out of tree; we register none and our layer fix applies
    chunk = out["gdn"]["chunk_op_oot"]
    if branch == "master":
        assert chunk and chunk.startswith("vllm_metax."), out["gdn"]
    assert out["entries"]["gdn.cuda_zero_draft_spec_rows"][0] == "applied", out["entries"]
    # batch order: vLLM-metax's _may_reorder_batch (speculative_decode_perf) is the one in place
    assert out["may_reorder_batch"].startswith("vllm_metax.patch.performance.speculative_decode_perf")
    # doctor names the branch and each target
    doc = out["doctor"]
    peer = doc["vllm_metax"]
    assert peer["branch"] == {"releases-v0.22.0": "releases/v0.22.0"}.get(branch, branch), peer
    rows = {r[0]: r[1:] for r in peer["targets"]}
    assert rows["platform"][0] == out["platform"] and "ours returned None" in rows["platform"][1]
    assert rows["spec_decode.batch_reorder"][0].startswith("vllm_metax.patch.performance.")
    assert rows["gdn.cuda_zero_draft_spec_rows"][1] == "patched", rows
    if branch == "master":
        assert rows["gdn.chunk_op"][0] == chunk and "kept" in rows["gdn.chunk_op"][1]
    fix = {r[0]: r[1:] for r in doc["fix_targets"]}
    assert fix["moe_wna16"][0] == moe["config"] and fix["turboquant_spec_verify"][0] == tq["first"]["backend"]
    # vLLM-metax's registration is untouched (our bootstrap registers no quantization config) and its
    # method is covered: it calls no kernel object (the kernel-call group is not applicable on its lines),
    # its inplace reading is moe.disable_inplace_default's (asserted above)
    assert "quant" not in out["steps"] and "moe_wna16" not in out["entries"], out["steps"]
    if moe["apply"] != "no MoE method of its own":
        method = moe["config"].rsplit(".", 1)[0] + ".MoeWNA16Method"
        assert fix["moe_wna16"][1] == (
            f"registered by a plugin, kept; {method}: apply, apply_monolithic call no kernel object "
            "(moe.wna16_kernel_call not applicable; an inplace reading there is moe.disable_inplace_default's)"), fix
    # patched, with the cache layout probed from vLLM-metax's own backend (its get_kv_cache_shape on 0.22-0.25)
    state = fix["turboquant_spec_verify"][1]
    assert state.startswith("patched; cache (") and "MacaTurboQuantAttentionBackend" in state, state
    assert doc["compat_table"]["table"] == vllm_line.rsplit(".", 1)[0] and not doc["compat_table"]["note"]
    print(f"\n{branch} ({'metax' if metax_first else 'ours'} first): platform {out['platform']}; "
          f"compat before {sorted(early)}; TurboQuant {tq['first']['backend']} patched; moe {moe['config']} "
          f"apply {moe['apply']}; GDN chunk op {chunk}; bootstrap {out['bootstrap']}")


@pytest.mark.parametrize("metax_first", ORDERS)
@pytest.mark.parametrize("branch", BRANCHES)
def test_mtp_experts_unquantized_through_maca_gptq_config(branch, metax_first, line_dirs, mxsml_dir,
                                                          tmp_path_factory):
    """vLLM-metax's MacaAutoGPTQConfig sends every routed expert to MacaMoeWNA16Config, which ignores
    the releases' '-:.*mtp.*' rule: the MTP experts get int4 (vLLM-metax PR #294's C500 run, accepted=0).
    quant.mtp_layer_config lands on its class -- at bootstrap when vLLM-metax's plugin ran first, else at
    model init -- and builds them unquantized; the target's stay int4."""
    main = run_branch(branch, metax_first, line_dirs, mxsml_dir, tmp_path_factory)["main"]
    out = main["mtp_quant"]
    # the kernel-call adapter: vLLM's MoeWNA16Method of 0.22-0.26 and vLLM-metax's own call fused_experts
    # themselves (no kernel object); their inplace reading is moe.disable_inplace_default's
    kernel = main["entries"]["moe.wna16_kernel_call"]
    assert kernel[0] == "skipped" and "not applicable" in kernel[1], kernel
    assert out["config"].startswith("vllm_metax.") and out["config"].endswith("MacaAutoGPTQConfig"), out
    assert out["at_bootstrap"] is metax_first and out["at_model_init"], out
    assert out["on"] == {"mtp_moe": "UnquantizedFusedMoEMethod", "target_moe": "MoeWNA16Method"}, out
    assert out["off"] == {"mtp_moe": "MoeWNA16Method", "target_moe": "MoeWNA16Method"}, out  # the bug


@pytest.mark.parametrize("branch", BRANCHES)
def test_spawned_child_runs_compat_first_too(branch, line_dirs, mxsml_dir, tmp_path_factory):
    res = run_branch(branch, True, line_dirs, mxsml_dir, tmp_path_factory)
    out = res["spawned"]
    assert out["platform"] == res["main"]["platform"] and out["our_register"] is None
    early = out["first_import_after_compat"]
    assert early and all(early.values()), early
    assert not {k: v for k, v in out["imports"].items() if v != "ok"}, out["imports"]
    assert out["runs"] == 1 and " 0 failed" in out["bootstrap"], out["bootstrap"]
