"""``moe_wna16`` hardening with vLLM's real config, quantization registry and MoE method, on a
``FusedMoEConfig`` with and without ``disable_inplace``.

Nothing of the plugin's is registered: the registry serves vLLM's own ``MoeWNA16Config`` (or a vendor
plugin's), and ``moe.wna16_kernel_call`` patches vLLM's ``MoeWNA16Method`` itself. The kernel cases below
apply the group through ``patching.apply_group``, so ``VLLM_PLATFORM_EXT_DISABLE=moe.wna16_kernel_call``
leaves it off: they fail then (the kernel is called bare, an older API never gets ``inplace``)."""
from __future__ import annotations

import dataclasses
import inspect
from types import SimpleNamespace

import pytest
import torch

import vllm.model_executor.layers.fused_moe.experts.triton_moe as triton_moe
import vllm.model_executor.layers.fused_moe.oracle.int_wna16 as int_wna16
from vllm.model_executor.layers.fused_moe import RoutedExperts
from vllm.model_executor.layers.fused_moe.activation import MoEActivation
from vllm.model_executor.layers.fused_moe.config import (
    FusedMoEConfig,
    FusedMoEParallelConfig,
    RoutingMethodType,
)
from vllm.model_executor.layers.fused_moe.modular_kernel import FusedMoEKernel
from vllm.model_executor.layers.quantization import get_quantization_config
from vllm.model_executor.layers.quantization.moe_wna16 import MoeWNA16Config, MoeWNA16Method
from conftest import group_off
from vllm_platform_ext import patching, quant
from vllm_platform_ext.platform import MacaPlatform
from vllm_platform_ext.quant import moe_wna16
from vllm_platform_ext.report import Report

GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": True, "desc_act": False}


@dataclasses.dataclass
class LegacyFusedMoEConfig(FusedMoEConfig):
    """vLLM's FusedMoEConfig plus the field older vLLM had."""

    disable_inplace: bool = False


def _moe_config(cls=FusedMoEConfig, **extra) -> FusedMoEConfig:
    parallel = FusedMoEParallelConfig(tp_size=1, pcp_size=1, dp_size=1, ep_size=1, tp_rank=0, pcp_rank=0,
                                      dp_rank=0, ep_rank=0, sp_size=1, use_ep=False, all2all_backend="naive",
                                      enable_eplb=False)
    return cls(num_experts=4, experts_per_token=2, hidden_dim=128, intermediate_size=128, num_local_experts=4,
               num_logical_experts=4, activation=MoEActivation.SILU, device="cpu",
               routing_method=RoutingMethodType.Renormalize, moe_parallel_config=parallel,
               in_dtype=torch.bfloat16, **extra)


CONFIGS = {
    "current (no field)": (lambda: _moe_config(), True),
    "legacy disable_inplace=True": (lambda: _moe_config(LegacyFusedMoEConfig, disable_inplace=True), False),
    "legacy disable_inplace=False": (lambda: _moe_config(LegacyFusedMoEConfig, disable_inplace=False), True),
}


@pytest.fixture
def maca_oracle(monkeypatch):
    """vLLM's WNA16 backend oracle and Triton experts seeing MacaPlatform (as on MetaX)."""
    p = MacaPlatform()
    monkeypatch.setattr(int_wna16, "current_platform", p)
    monkeypatch.setattr(triton_moe, "current_platform", p)


@pytest.fixture
def kernel_group():
    """``moe.wna16_kernel_call`` applied as the bootstrap applies it (honouring VLLM_PLATFORM_EXT_DISABLE);
    the session's state put back after. Yields the group's report entry."""
    (group,) = [g for g in quant.groups() if g.name == moe_wna16.KERNEL_CALL_GROUP]
    with group_off(group):
        report = Report()
        patching.apply_group(group, report)
        try:
            yield report.find("patch", group.name)
        finally:
            patching.restore(group.name)


def _routed_experts(moe_config) -> RoutedExperts:
    layer = object.__new__(RoutedExperts)  # a real RoutedExperts, without building weights
    layer.__dict__["moe_config"] = moe_config
    return layer


class _Recorder:
    is_monolithic = False

    def __init__(self):
        self.calls = []

    def _record(self, **kwargs):
        self.calls.append(kwargs)
        return kwargs["hidden_states"] * 2


class CurrentKernel(_Recorder):
    """Same ``apply`` signature as vLLM 0.32's FusedMoEKernel (no ``inplace``)."""

    def apply(self, hidden_states, w1, w2, topk_weights, topk_ids, activation, global_num_experts,
              expert_map, apply_router_weight_on_input, shared_experts=None, shared_experts_input=None):
        return self._record(**{k: v for k, v in locals().items() if k != "self"})


class LegacyKernel(_Recorder):
    """An older fused-experts API that takes ``inplace``."""

    def apply(self, hidden_states, w1, w2, topk_weights, topk_ids, activation, global_num_experts,
              expert_map, apply_router_weight_on_input, shared_experts=None, shared_experts_input=None,
              inplace="not passed"):
        return self._record(**{k: v for k, v in locals().items() if k != "self"})


def test_current_kernel_stub_matches_vllm():
    # The stub stands in for vLLM's kernel (hardware-specific); it takes the real arguments.
    assert list(inspect.signature(CurrentKernel.apply).parameters) == list(
        inspect.signature(FusedMoEKernel.apply).parameters)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_moe_inplace(name):
    make, expected = CONFIGS[name]
    assert moe_wna16.moe_inplace(make()) is expected


def test_vllms_own_config_is_served(kernel_group):
    """The registry is vLLM's: the plugin registers no moe_wna16 config, and its bootstrap reports no
    quantization-registry step; the group lands on vLLM's own MoeWNA16Method."""
    import vllm_platform_ext

    assert get_quantization_config("moe_wna16") is MoeWNA16Config
    assert kernel_group.status.value == "applied", kernel_group
    assert {f"{MoeWNA16Method.__module__}:MoeWNA16Method.{a}" for a in moe_wna16.KERNEL_METHODS} \
        <= set(patching.applied_targets(moe_wna16.KERNEL_CALL_GROUP))
    report = vllm_platform_ext.bootstrap.report()
    assert report is None or not [e for e in report.entries if e.step == "quant"], report.as_list()


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("kernel_cls", [CurrentKernel, LegacyKernel])
def test_apply_with_and_without_disable_inplace(kernel_group, maca_oracle, name, kernel_cls):
    make, expected_inplace = CONFIGS[name]
    moe_config = make()
    qconfig = get_quantization_config("moe_wna16").from_config(GPTQ)
    method = qconfig.get_quant_method(_routed_experts(moe_config), "model.layers.0.mlp.experts")
    # vLLM's own config and method; its oracle chose the backend MetaX runs (Triton)
    assert type(qconfig) is MoeWNA16Config and type(method) is MoeWNA16Method
    assert method.wna16_backend == int_wna16.WNA16MoEBackend.TRITON

    kernel = kernel_cls()
    method.moe_kernel = kernel
    layer = SimpleNamespace(w13_weight=torch.zeros(1), w2_weight=torch.zeros(1), activation=MoEActivation.SILU,
                            global_num_experts=4, expert_map=None, apply_router_weight_on_input=False)
    x = torch.ones(2, 128)
    out = method.apply(layer, x, torch.ones(2, 2), torch.zeros(2, 2, dtype=torch.int32), None, None)
    assert torch.equal(out, x * 2)
    (call,) = kernel.calls
    if kernel_cls is LegacyKernel:
        assert call["inplace"] is expected_inplace, call["inplace"]
    else:
        assert "inplace" not in call
    assert isinstance(method.moe_kernel, moe_wna16.KernelCallAdapter), type(method.moe_kernel)
    assert method.moe_kernel.wrapped is kernel  # adapter forwards; second call reuses it
    method.apply(layer, x, torch.ones(2, 2), torch.zeros(2, 2, dtype=torch.int32), None, None)
    assert len(kernel.calls) == 2


def test_adapter_drops_inplace_for_kernels_without_it():
    kernel = CurrentKernel()
    adapter = moe_wna16.KernelCallAdapter(kernel, _moe_config(LegacyFusedMoEConfig, disable_inplace=True))
    x = torch.ones(1, 4)
    adapter.apply(x, None, None, None, None, None, 1, None, False, inplace=True)
    assert "inplace" not in kernel.calls[0]


def test_non_moe_layers_untouched(kernel_group):
    qconfig = get_quantization_config("moe_wna16").from_config(GPTQ)
    assert qconfig.get_quant_method(torch.nn.Identity(), "x") is None


# ---- beside a vendor plugin (vLLM-metax registers its own moe_wna16 config) -------------------


class VendorMoeWNA16Method(MoeWNA16Method):
    """What vLLM-metax's v0.23/v0.24 lines do: read ``self.moe.disable_inplace`` in ``apply``."""

    def apply(self, layer, x, *args, **kwargs):
        return {"inplace": not self.moe.disable_inplace}


class VendorMoeWNA16Config(MoeWNA16Config):
    """A vendor config as vLLM-metax registers it (``use_marlin`` off, its own MoE method)."""

    def get_quant_method(self, layer, prefix):
        method = super().get_quant_method(layer, prefix)
        if type(method) is MoeWNA16Method:
            method.__class__ = VendorMoeWNA16Method
        return method


VendorMoeWNA16Config.__module__ = VendorMoeWNA16Method.__module__ = "vendor_plugin.quant_config"


@pytest.fixture
def vendor_registered():
    from vllm.model_executor.layers import quantization as q
    from vllm.model_executor.layers.quantization import register_quantization_config

    before = dict(q._CUSTOMIZED_METHOD_TO_QUANT_CONFIG)
    register_quantization_config("moe_wna16")(VendorMoeWNA16Config)
    yield
    q._CUSTOMIZED_METHOD_TO_QUANT_CONFIG.clear()
    q._CUSTOMIZED_METHOD_TO_QUANT_CONFIG.update(before)


def test_vendor_registration_is_left_alone(vendor_registered, kernel_group):
    """The moe_wna16 groups applied beside a vendor's registration: the registry still serves the
    vendor's config; doctor names it and says which group its method's inplace reading is."""
    assert get_quantization_config("moe_wna16") is VendorMoeWNA16Config
    name, config, state = moe_wna16.doctor_row()
    assert (name, config) == ("moe_wna16", "vendor_plugin.quant_config.VendorMoeWNA16Config")
    # its own apply calls no kernel object (the disable_inplace group's); the apply_monolithic it inherits
    # is vLLM's, covered
    assert state == ("registered by a plugin, kept; vendor_plugin.quant_config.VendorMoeWNA16Method: apply_monolithic "
                     "covered by moe.wna16_kernel_call; apply call no kernel object "
                     "(moe.wna16_kernel_call not applicable; an inplace reading there is moe.disable_inplace_default's)"), state


def test_doctor_row_for_vllms_own_config(kernel_group):
    """With the group applied vLLM's own method is covered; with it off (the bootstrap's state under
    VLLM_PLATFORM_EXT_DISABLE) doctor says its kernel is called bare."""
    row = moe_wna16.doctor_row()
    own = "vllm.model_executor.layers.quantization.moe_wna16.MoeWNA16Method"
    assert row == ["moe_wna16", "vllm.model_executor.layers.quantization.moe_wna16.MoeWNA16Config",
                   f"vLLM's own; {own}: apply, apply_monolithic covered by moe.wna16_kernel_call"], row
    patching.restore(moe_wna16.KERNEL_CALL_GROUP)
    assert "apply, apply_monolithic call the kernel bare, not through KernelCallAdapter" in moe_wna16.doctor_row()[2]


def test_vendor_method_reads_disable_inplace_only_with_the_group(vendor_registered, maca_oracle):
    """vLLM 0.32's FusedMoEConfig has no disable_inplace (like 0.23-0.26): the vendor's method
    raises AttributeError on it; with moe.disable_inplace_default applied it runs, in place."""
    (group,) = [g for g in quant.groups() if g.name == moe_wna16.DISABLE_INPLACE_GROUP]
    with group_off(group):  # the session's bootstrap may hold it: off for the "before" half, back after
        try:
            assert group.skip_if() is None, "this vLLM's FusedMoEConfig should lack disable_inplace"
            qconfig = get_quantization_config("moe_wna16").from_config(GPTQ)
            method = qconfig.get_quant_method(_routed_experts(_moe_config()), "model.layers.0.mlp.experts")
            assert type(method) is VendorMoeWNA16Method
            with pytest.raises(AttributeError, match="disable_inplace"):
                method.apply(None, torch.ones(1, 4))
            report = Report()
            assert patching.apply_group(group, report)
            assert method.apply(None, torch.ones(1, 4)) == {"inplace": True}
            assert moe_wna16.moe_inplace(_moe_config()) is True  # the plugin's own reading agrees
            legacy = _moe_config(LegacyFusedMoEConfig, disable_inplace=True)  # a line that has the field
            assert legacy.disable_inplace is True
        finally:
            patching.restore(group.name)


def test_disable_inplace_group_not_needed_where_the_field_exists(monkeypatch):
    import vllm.model_executor.layers.fused_moe.config as cfg

    monkeypatch.setattr(cfg, "FusedMoEConfig", LegacyFusedMoEConfig)
    (group,) = [g for g in quant.groups() if g.name == moe_wna16.DISABLE_INPLACE_GROUP]
    assert group.skip_if() == "not needed: this vLLM's FusedMoEConfig has disable_inplace"


LATE_VENDOR = '''
from vllm.model_executor.layers.quantization.moe_wna16 import MoeWNA16Method


class LateVendorMethod(MoeWNA16Method):
    """A plugin's method calling its kernel object in its own apply."""

    def apply(self, layer, x, *args, **kwargs):
        return self.moe_kernel.apply(x, None, None, None, None, None, 4, None, False)
'''


def test_a_vendor_subclass_imported_after_the_group_gets_it_at_construction(kernel_group, maca_oracle, tmp_path,
                                                                             monkeypatch):
    """A plugin whose general plugin runs after our bootstrap: its kernel-calling subclass did not exist
    when the group was applied; vLLM's MoeWNA16Method.__init__ (which its construction runs) lands the
    group on it, so its first apply already calls the kernel through KernelCallAdapter."""
    import importlib
    import sys

    (tmp_path / "late_vendor_moe.py").write_text(LATE_VENDOR)
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = importlib.import_module("late_vendor_moe")
    try:
        assert not patching.carries(mod.LateVendorMethod, "apply", moe_wna16.KERNEL_CALL_GROUP)
        method = mod.LateVendorMethod(MoeWNA16Config.from_config(GPTQ), _moe_config())
        assert patching.carries(mod.LateVendorMethod, "apply", moe_wna16.KERNEL_CALL_GROUP)
        kernel = LegacyKernel()
        method.moe_kernel = kernel
        method.apply(None, torch.ones(2, 128))
        assert kernel.calls[0]["inplace"] is True  # no field on this line: in place
        assert moe_wna16.kernel_call_state(mod.LateVendorMethod) == \
            "late_vendor_moe.LateVendorMethod: apply, apply_monolithic covered by moe.wna16_kernel_call"
    finally:
        patching.restore(moe_wna16.KERNEL_CALL_GROUP)  # its patch with the group's, before the module goes
        sys.modules.pop("late_vendor_moe", None)
