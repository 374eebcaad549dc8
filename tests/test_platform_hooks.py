"""Every ``MacaPlatform`` hook against vLLM 0.32's interfaces, plus a tiny Qwen3.5 + MTP
config built by vLLM itself (``EngineArgs.create_engine_config``) under ``MacaPlatform``."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from vllm.platforms.interface import DeviceCapability, Platform, PlatformEnum
from vllm.utils.import_utils import resolve_obj_by_qualname
from vllm.v1.attention.backends.registry import AttentionBackendEnum
from vllm.v1.attention.selector import AttentionSelectorConfig
from vllm_platform_ext import detect, platform as maca
from vllm_platform_ext.ops.launch import clamp_num_warps, launch_config
from vllm_platform_ext.platform import MacaPlatform

_spec = importlib.util.spec_from_file_location("mxsml_build", Path(__file__).parent / "fixtures" / "mxsml_build.py")
mxsml_build = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mxsml_build)


@pytest.fixture(scope="module")
def fake_lib(tmp_path_factory) -> Path:
    return mxsml_build.build_fake_mxsml(tmp_path_factory.mktemp("mxsml"))


@pytest.fixture
def with_mxsml(fake_lib, monkeypatch):
    for var in ("FAKE_MXSML_COUNT", "FAKE_MXSML_INIT_RC", detect.PLATFORM_ENV, "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv(detect.MXSML_LIB_ENV, str(fake_lib))
    monkeypatch.setenv("FAKE_MXSML_COUNT", "2")
    monkeypatch.setenv("FAKE_MXSML_MEM_GIB", "48")
    detect.clear_cache()
    MacaPlatform.get_device_capability.cache_clear()
    yield fake_lib
    detect.clear_cache()
    MacaPlatform.get_device_capability.cache_clear()


def test_identity():
    p = MacaPlatform()
    assert isinstance(p, Platform) and p.is_out_of_tree() and p._enum == PlatformEnum.OOT
    assert (p.device_name, p.device_type, p.dispatch_key, p.dist_backend) == ("maca", "cuda", "CUDA", "nccl")
    assert p.is_cuda_alike() and not p.is_cuda()
    assert p.device_control_env_var == "CUDA_VISIBLE_DEVICES"
    assert p.support_hybrid_kv_cache() and p.support_static_graph_mode()
    assert not p.use_custom_allreduce() and p.opaque_attention_op()
    assert "moe_wna16" in p.supported_quantization


def test_import_has_no_side_effects():
    code = textwrap.dedent("""
        import os, json
        before = dict(os.environ)
        import torch
        sdp = torch.backends.cuda.cudnn_sdp_enabled()
        import vllm_platform_ext.platform as m
        print(json.dumps({"env_changed": sorted(k for k in os.environ if before.get(k) != os.environ[k]),
                          "sdp_same": sdp == torch.backends.cuda.cudnn_sdp_enabled(),
                          "applied": m.applied_env_defaults()}))
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    data = json.loads(out.stdout.strip().splitlines()[-1])
    assert data == {"env_changed": [], "sdp_same": True, "applied": []}


@pytest.mark.parametrize("path", [
    MacaPlatform.get_device_communicator_cls(),
    MacaPlatform.get_static_graph_wrapper_cls(),
    MacaPlatform.get_punica_wrapper(),
    "vllm.v1.worker.gpu_worker.Worker",
])
def test_runtime_classes_resolve(path):
    assert isinstance(resolve_obj_by_qualname(path), type)


def test_device_queries_use_mxsml(with_mxsml):
    assert MacaPlatform.device_count() == 2
    assert MacaPlatform.get_device_name(1) == "MetaX C500"
    assert MacaPlatform.get_device_total_memory(0) == 48 << 30
    assert MacaPlatform.get_device_capability() == DeviceCapability(8, 0)
    assert MacaPlatform.has_device_capability(80) and not MacaPlatform.has_device_capability(90)
    assert MacaPlatform.get_device_uuid(1).endswith("000000000001")
    import ctypes

    assert ctypes.CDLL(str(with_mxsml)).fakeMxSmlInitDepth() == 0


def test_visible_devices_map_to_physical(with_mxsml, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert MacaPlatform.device_count() == 1
    assert MacaPlatform.get_device_uuid(0).endswith("000000000001")


def test_without_mxsml_falls_back_to_torch_cuda(monkeypatch):
    monkeypatch.setenv(detect.PLATFORM_ENV, "maca")  # forced: no library known
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    detect.clear_cache()
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: f"torch-device-{i}")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    try:
        assert MacaPlatform.get_device_name(2) == "torch-device-2"
        assert MacaPlatform.device_count() == 3
    finally:
        detect.clear_cache()


def test_fp8_dtype_rejected_with_clear_error():
    MacaPlatform.check_if_supports_dtype(torch.bfloat16)
    with pytest.raises(ValueError, match="not supported on MetaX"):
        MacaPlatform.check_if_supports_dtype(torch.float8_e4m3fn)


# ---- environment defaults -----------------------------------------------------------


def test_env_defaults_are_vllm_variables():
    from vllm import envs

    names = [n for n, _, _ in maca.env_defaults()]
    assert "VLLM_GDN_DECODE_KERNEL" in names
    assert all(n in envs.environment_variables for n in names)
    assert all(reason for _, _, reason in maca.env_defaults())


def test_apply_env_defaults_keeps_user_values(monkeypatch):
    for name, _, _ in maca.env_defaults():
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    monkeypatch.setattr(maca, "_set_by_us", set())
    monkeypatch.setattr(maca, "_applied", {})
    done = {n: (v, what) for n, v, what in maca.apply_env_defaults()}
    assert os.environ["VLLM_GDN_DECODE_KERNEL"] == "triton" and done["VLLM_GDN_DECODE_KERNEL"][1].startswith("set")
    assert os.environ["VLLM_USE_V2_MODEL_RUNNER"] == "1" and "user value kept" in done["VLLM_USE_V2_MODEL_RUNNER"][1]
    from vllm import envs

    assert envs.VLLM_GDN_DECODE_KERNEL == "triton"  # vLLM reads what the hook set
    assert maca.apply_env_defaults() == list((n, v, w) for n, (v, w) in done.items())  # idempotent
    assert [n for n, _, _ in maca.applied_env_defaults()] == list(done)


def test_validate_environ_accepts_own_variables(monkeypatch):
    monkeypatch.setenv(detect.PLATFORM_ENV, "auto")
    MacaPlatform.validate_environ(hard_fail=True)
    monkeypatch.setenv("VLLM_NOT_A_THING", "1")
    with pytest.raises(ValueError, match="VLLM_NOT_A_THING"):
        MacaPlatform.validate_environ(hard_fail=True)


# ---- attention selection ------------------------------------------------------------


def _sel(kv: str | None, **kw) -> AttentionSelectorConfig:
    return AttentionSelectorConfig(head_size=128, dtype=torch.bfloat16, kv_cache_dtype=kv, block_size=None, **kw)


@pytest.mark.parametrize("kv,expected", [
    ("auto", "TritonAttentionBackend"),
    ("fp8", "TritonAttentionBackend"),
    ("turboquant_k8v4", "TurboQuantAttentionBackend"),
    ("turboquant_3bit_nc", "TurboQuantAttentionBackend"),
])
def test_attention_priority(with_mxsml, kv, expected):
    path = MacaPlatform.get_attn_backend_cls(None, _sel(kv))
    assert path.endswith(expected)
    assert resolve_obj_by_qualname(path).__name__ == expected


def test_attention_explicit_choice_is_validated(with_mxsml):
    path = MacaPlatform.get_attn_backend_cls(AttentionBackendEnum.FLEX_ATTENTION, _sel("auto"))
    assert path.endswith("FlexAttentionBackend")
    with pytest.raises(ValueError, match="TURBOQUANT is not valid on MetaX"):
        MacaPlatform.get_attn_backend_cls(AttentionBackendEnum.TURBOQUANT, _sel("auto"))


def test_no_backend_raises_clear_error(with_mxsml):
    with pytest.raises(ValueError, match="No valid attention backend on MetaX"):
        MacaPlatform.get_attn_backend_cls(None, _sel("auto", use_mla=True))


# ---- launch policy --------------------------------------------------------------------


def test_launch_policy():
    assert launch_config("maca", num_warps=32, BLOCK_K=64) == {"num_warps": 16, "BLOCK_K": 64}
    assert launch_config("cuda", num_warps=32, BLOCK_K=64) == {"num_warps": 32, "BLOCK_K": 64}
    assert clamp_num_warps("maca", 8) == 8
    with pytest.raises(ValueError, match="power of two"):
        launch_config("maca", num_warps=4, BLOCK_K=48)
    with pytest.raises(ValueError, match="unknown platform"):
        launch_config("npu", num_warps=4)


# ---- a tiny Qwen3.5 + MTP through vLLM's own config build ------------------------------

QWEN35 = {
    "architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5_text",
    "vocab_size": 1024, "hidden_size": 256, "intermediate_size": 512,
    "num_hidden_layers": 2, "layer_types": ["linear_attention", "full_attention"],
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 128,
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 128,
    "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "hidden_act": "silu",
    "rms_norm_eps": 1e-6, "max_position_embeddings": 4096,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25},
    "attn_output_gate": True, "output_gate_type": "swish", "mtp_num_hidden_layers": 1,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}

BUILD = textwrap.dedent("""
    import json, os, sys, torch
    from vllm.config import set_current_vllm_config
    from vllm.engine.arg_utils import EngineArgs
    from vllm.platforms import current_platform
    from vllm.v1.attention.selector import get_attn_backend
    from vllm_platform_ext import platform as maca
    out = {"platform": type(current_platform).__name__}
    for kv in ("auto", "turboquant_k8v4"):
        cfg = EngineArgs(model=sys.argv[1], load_format="dummy", skip_tokenizer_init=True, max_model_len=1024,
                         speculative_config={"method": "mtp", "num_speculative_tokens": 2},
                         kv_cache_dtype=kv).create_engine_config()
        with set_current_vllm_config(cfg):
            backend = get_attn_backend(head_size=128, dtype=torch.bfloat16, kv_cache_dtype=cfg.cache_config.cache_dtype)
            current_platform._align_hybrid_block_size(cfg, backend)
        out[kv] = {
            "worker_cls": cfg.parallel_config.worker_cls,
            "cudagraph_mode": cfg.compilation_config.cudagraph_mode.name,
            "hybrid_kv_cache_manager_disabled": cfg.scheduler_config.disable_hybrid_kv_cache_manager,
            "spec_method": cfg.speculative_config.method,
            "draft_arch": cfg.speculative_config.draft_model_config.hf_config.architectures,
            "is_hybrid": cfg.model_config.is_hybrid,
            "backend": backend.get_name(),
            "block_size": cfg.cache_config.block_size,
            "mamba_page_size_padded": cfg.cache_config.mamba_page_size_padded,
        }
    out["env"] = {n: os.environ.get(n) for n, _, _ in maca.env_defaults()}
    out["applied"] = maca.applied_env_defaults()
    print("RESULT=" + json.dumps(out))
""")


@pytest.fixture(scope="module")
def qwen35_mtp(fake_lib, tmp_path_factory):
    model = tmp_path_factory.mktemp("qwen35")
    (model / "config.json").write_text(json.dumps(QWEN35))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "FAKE_MXSML"))}
    env[detect.MXSML_LIB_ENV] = str(fake_lib)
    proc = subprocess.run([sys.executable, "-c", BUILD, str(model)], env=env, capture_output=True, text=True,
                          timeout=600)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT=")]
    assert proc.returncode == 0 and lines, proc.stderr[-5000:]
    return json.loads(lines[-1][len("RESULT="):])


def test_qwen35_mtp_resolves_maca(qwen35_mtp):
    assert qwen35_mtp["platform"] == "MacaPlatform"


def test_qwen35_mtp_config(qwen35_mtp):
    r = qwen35_mtp["auto"]
    assert r["worker_cls"] == "vllm.v1.worker.gpu_worker.Worker"
    assert r["hybrid_kv_cache_manager_disabled"] is False  # support_hybrid_kv_cache() honoured
    assert r["is_hybrid"] and r["spec_method"] == "mtp" and r["draft_arch"] == ["Qwen3_5MTP"]
    assert r["backend"] == "TRITON_ATTN"
    assert r["cudagraph_mode"] == "FULL_AND_PIECEWISE"  # static graphs on, full graphs allowed
    # hybrid alignment: the attention block grew from the default 16 to hold a GDN state page
    assert r["block_size"] > 16 and r["block_size"] % 16 == 0 and r["mamba_page_size_padded"]


def test_qwen35_mtp_turboquant(qwen35_mtp):
    r = qwen35_mtp["turboquant_k8v4"]
    assert r["backend"] == "TURBOQUANT"
    # vLLM loaded the plugin here, so the verify route serves the captured K+1 batches: FULL graphs
    # stay, as under the CUDA platform (without the route they are downgraded: the test below)
    assert r["cudagraph_mode"] == "FULL_AND_PIECEWISE"


def test_qwen35_mtp_env_defaults(qwen35_mtp):
    assert qwen35_mtp["env"] == {n: v for n, v, _ in maca.env_defaults()}
    assert {n for n, _, _ in qwen35_mtp["applied"]} == {n for n, _, _ in maca.env_defaults()}


def _graph_cfg(cache_dtype: str, spec: bool):
    from types import SimpleNamespace

    from vllm.config.compilation import CUDAGraphMode

    return SimpleNamespace(cache_config=SimpleNamespace(cache_dtype=cache_dtype),
                           speculative_config=SimpleNamespace(num_speculative_tokens=3) if spec else None,
                           compilation_config=SimpleNamespace(cudagraph_mode=CUDAGraphMode.FULL_AND_PIECEWISE))


def test_turboquant_spec_keeps_full_graphs_where_the_verify_route_is_applied():
    """Under MacaPlatform the patch groups apply as under the CUDA platform: with the
    ``turboquant_spec_verify`` group applied, TurboQuant + speculation keeps FULL graphs (the route
    serves the captured K+1 batches); without it (disabled, skipped) FULL is downgraded."""
    from vllm_platform_ext import patching
    from vllm_platform_ext.patch.turboquant import spec_verify as tq_wiring

    was_applied = bool(patching.applied_targets(tq_wiring.NAME))  # an in-process bootstrap earlier in the run
    patching.restore(tq_wiring.NAME)
    try:
        cfg = _graph_cfg("turboquant_k8v4", spec=True)
        MacaPlatform._no_full_cudagraph_for_turboquant_spec(cfg)
        assert cfg.compilation_config.cudagraph_mode.name == "PIECEWISE"
        patching.apply(tq_wiring.NAME, list(tq_wiring.GROUPS[0].build()))
        for kv, spec in (("turboquant_k8v4", True), ("auto", True), ("turboquant_k8v4", False)):
            cfg = _graph_cfg(kv, spec)
            MacaPlatform._no_full_cudagraph_for_turboquant_spec(cfg)
            assert cfg.compilation_config.cudagraph_mode.name == "FULL_AND_PIECEWISE", (kv, spec)
    finally:
        patching.restore(tq_wiring.NAME)
        if was_applied:
            patching.apply(tq_wiring.NAME, list(tq_wiring.GROUPS[0].build()))


def test_maca_moe_group_gives_oot_layers_the_triton_experts(monkeypatch):
    """vLLM hands an out-of-tree platform the OOT unquantized-MoE backend with no experts class;
    under the standalone MacaPlatform the group swaps in the Triton experts vLLM uses on CUDA
    (the 0.23 H100 stand-in cell died on 'is_monolithic' without it). Elsewhere: not needed."""
    from types import SimpleNamespace

    import vllm.model_executor.layers.fused_moe.oracle.unquantized as oracle
    import vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method as method_mod

    from vllm_platform_ext import patching
    from vllm_platform_ext.patch import maca_moe

    assert maca_moe.GROUPS[0].skip_if().startswith("not needed: the platform is CpuPlatform")
    oot = SimpleNamespace(is_cpu=lambda: False, is_tpu=lambda: False, is_out_of_tree=lambda: True)
    monkeypatch.setattr(oracle, "current_platform", oot)
    assert method_mod.select_unquantized_moe_backend(SimpleNamespace()) == (oracle.UnquantizedMoeBackend.OOT, None)
    patching.restore(maca_moe.NAME)  # never applied off MacaPlatform, but keep the test independent of order
    patching.apply(maca_moe.NAME, list(maca_moe.GROUPS[0].build()))
    try:
        backend, experts = method_mod.select_unquantized_moe_backend(SimpleNamespace())
        assert backend == oracle.UnquantizedMoeBackend.TRITON
        assert experts is oracle.backend_to_kernel_cls(oracle.UnquantizedMoeBackend.TRITON)[0]  # 0.32: a list
        assert experts.__name__ == "TritonExperts"
        tpu = SimpleNamespace(is_cpu=lambda: False, is_tpu=lambda: True, is_out_of_tree=lambda: False)
        monkeypatch.setattr(oracle, "current_platform", tpu)  # any other backend passes through unchanged
        assert method_mod.select_unquantized_moe_backend(SimpleNamespace()) == (oracle.UnquantizedMoeBackend.TPU, None)
    finally:
        patching.restore(maca_moe.NAME)
