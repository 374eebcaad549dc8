"""``quant.mtp_layer_config`` and ``moe.wna16_kernel_call`` on each vLLM line's REAL quantization code.

Per line (its CUDA wheel's Python, ``ci/tools/vllm_lines.py extract``, on this venv's torch), one
child process (``mtp_layer_child.py``) builds the line's own ``AutoGPTQConfig`` / ``MoeWNA16Config``
from a GPTQ dict (sym, group 128, desc_act off; with the releases' ``"-:.*mtp.*"`` dynamic rule, and
without it, the checkpoint's quantized-module list read by the line's ``maybe_update_config`` from a
real safetensors file whose MTP tensors are bf16) and asks ``get_quant_method`` for the MTP layer's
and the target's fused-MoE and linear layers: first with the groups off, then on.

Found on 0.22-0.26 and 0.32 (run here, 2026-12-06; 0.32/0.33 share these files byte for byte):
off, the MTP experts get int4 methods on every path (AutoGPTQ's moe_wna16 fallback ignores the
dynamic rule, AutoGPTQ's Marlin path the shipped-module list, explicit moe_wna16 both); with
AutoRound's block-relative module list the MTP's bf16 linears are quantized too (#47828); explicit
moe_wna16 leaves the target's linears unquantized on 0.22-0.31 and quantizes the MTP's bf16 linears
on 0.32+ (0.32's ``is_layer_gptq_quantized`` reads an empty module list as "all quantized"). 0.27-0.31 and
0.34 run here too (2026-12-06). On, every MTP layer is unquantized and every target layer quantized. Where a line's probe
says "not needed" (upstream fixed it), the off half must already be right instead.

The same child also asks the line's ``INCConfig`` (AutoRound's native format, ``inc_layer_child.py``), through
the line's ``configure_quant_config`` and Qwen3.5 classes (target first, then the draft on the same object, as
in the engine). Found on 0.22-0.26 and 0.33 (0.32 shares those files):
- off, a target layer whose ``extra_config`` entry has no ``bits`` (AutoRound writes ``{"group_size": 128}``)
  is built unquantized on every line; ``quant.inc_extra_config`` on, quantized (the checkpoint ships it packed);
- the MTP layer is resolved as the checkpoint ships it on every line, group on or off: ``mtp.layers`` in the
  block list -> its linears quantized, ``mtp.fc`` bf16; ``ignore_layers="mtp"`` -> all bf16. The draft's
  prefixes are the checkpoint's (``mtp.layers.N``) and no line's mapper drops ``mtp.layers`` before the draft
  reads it (0.32/0.33's ``"mtp.": None`` is left out by ``get_rename_mapper``): vLLM #49552 does not show here;
- INC aggregates per-expert ``extra_config`` entries only for a class named ``*fusedmoe*``: on 0.22/0.23
  (``FusedMoE``) experts at 8 bits resolve to 8, from 0.24 (``RoutedExperts``) to the checkpoint's 4 (recorded,
  not fixed: AutoRound's MTP exports write no per-expert entries for the MTP layer).
"""
from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from conftest import line_id, run_line_child, table_wheel
from vllm_platform_ext.compat import lines

LINES = [k for k in lines.LINES if k != (0, 32)]  # 0.32 shares 0.33's files (test_0_32_shares_the_files_with_0_33)
CHILD = Path(__file__).with_name("mtp_layer_child.py")
GROUP, KERNEL_GROUP, INC_GROUP = "quant.mtp_layer_config", "moe.wna16_kernel_call", "quant.inc_extra_config"
UNQ_MOE, UNQ_LIN = "UnquantizedFusedMoEMethod", "UnquantizedLinearMethod"
QUANT_MOE = {"gptq_dynamic_fallback": "MoeWNA16Method", "gptq_shipped_marlin": "AutoGPTQMoEMethod",
             "gptq_relative_list": "AutoGPTQMoEMethod", "gptq_mapped_names": "AutoGPTQMoEMethod",
             "gptq_autoround_rules": "AutoGPTQMoEMethod",
             "moe_wna16_dynamic": "MoeWNA16Method", "moe_wna16_shipped": "MoeWNA16Method"}


@pytest.fixture(scope="module", params=LINES, ids=line_id)
def line(request):
    # the groups off first; the child applies them after
    return request.param, run_line_child(request.param, [str(CHILD)], deps=True,
                                         extra_env={"VLLM_PLATFORM_EXT_DISABLE": f"{GROUP},{KERNEL_GROUP},{INC_GROUP}"})


def test_with_the_group_mtp_layers_unquantized_target_layers_quantized(line):
    key, got = line
    assert got["groups"][GROUP][0] == "applied", got["groups"]
    for case, layers in got["on"].items():
        assert layers["mtp_moe"] == UNQ_MOE, (key, case, layers)
        assert layers["target_moe"] == QUANT_MOE[case], (key, case, layers)
        if "mtp_linear" in layers:
            assert layers["mtp_linear"] == UNQ_LIN, (key, case, layers)
            assert layers["target_linear"] == "AutoGPTQLinearMethod", (key, case, layers)


def test_without_the_group_the_lines_code_quantizes_the_mtp_layer(line):
    """The bug, shown on the line's own code (fails once upstream fixes it: the probe must skip then)."""
    key, got = line
    off = got["off"]
    for case, quant in QUANT_MOE.items():
        assert off[case]["mtp_moe"] == quant, (key, case, off[case])  # int4 experts for bf16 weights
        assert off[case]["target_moe"] == quant, (key, case, off[case])
    assert off["gptq_shipped_marlin"]["mtp_linear"] == UNQ_LIN  # the list read from the dtypes: linears right
    # AutoRound's own export lists block-relative names, which match the MTP layer: its bf16 linears
    # quantized too (vLLM #47828), the dtypes never read
    assert off["gptq_relative_list"]["mtp_linear"] == "AutoGPTQLinearMethod", off["gptq_relative_list"]
    # explicit moe_wna16: its linears get a GPTQ config with an empty module list
    explicit = off["moe_wna16_shipped"]
    if key <= (0, 31):  # is_layer_gptq_quantized([]) is False (0.32 added "empty: True"): the target's int4 linears unquantized
        assert explicit["target_linear"] == UNQ_LIN and explicit["mtp_linear"] == UNQ_LIN, explicit
    else:  # True from 0.32: the MTP's bf16 linears quantized
        assert explicit["target_linear"] == "AutoGPTQLinearMethod" and explicit["mtp_linear"] == "AutoGPTQLinearMethod"


def test_kernel_call_group_reaches_vllms_own_method(line):
    """``moe.wna16_kernel_call`` on vLLM's ``MoeWNA16Method`` (what the registry name -- vLLM's own config,
    nothing of ours registered --, AutoGPTQ's fallback, INC and a plugin's config build): a kernel whose
    ``apply`` / ``apply_monolithic`` takes ``inplace`` gets it, the line's own ``FusedMoEKernel`` gets it
    exactly when its signature takes it. Where the line's ``apply`` calls ``fused_experts`` itself (0.22-0.26)
    the group is skipped as not applicable, and the class never holds a kernel object (nothing for an adapter
    to wrap: the retired registry subclass did nothing there either)."""
    key, got = line
    status, detail = got["groups"][KERNEL_GROUP]
    off, on = got["kernel_off"], got["kernel_on"]
    assert off["served_vllms_own"] and on["served_vllms_own"], (off, on)  # the registry is left alone
    if not off["applicable"]:
        assert status == "skipped" and "not applicable" in detail, (status, detail)
        assert key <= (0, 26)
        assert not on["class_mentions_moe_kernel"] and not on["own_select_gemm_impl"], on
        return
    assert status == "applied", (status, detail)
    assert off["adapted"] == {"legacy": False, "legacy_monolithic": False, "real": False}, off
    assert off["inplace"] == {"legacy": "not passed", "legacy_monolithic": "not passed", "real": "not passed"}, off
    assert on["adapted"] == {"legacy": True, "legacy_monolithic": True, "real": True}, on
    real = True if on["real_takes_inplace"] else "not passed"  # no field on 0.27+: in place
    assert on["inplace"] == {"legacy": True, "legacy_monolithic": True, "real": real}, on


def test_0_32_shares_the_files_with_0_33():
    """0.32 (the CPU engine's line) is not run above: its files that decide are 0.33's, byte for byte (INC's
    ``configure_quant_config``: its function's source; the rest of that file differs)."""
    import ast

    files = ("vllm/model_executor/layers/quantization/auto_gptq.py",
             "vllm/model_executor/layers/quantization/moe_wna16.py",
             "vllm/model_executor/layers/quantization/utils/gptq_utils.py",
             "vllm/model_executor/layers/quantization/inc/inc.py",
             "vllm/model_executor/layers/quantization/inc/config_parser.py",
             "vllm/model_executor/models/qwen3_5.py", "vllm/model_executor/models/qwen3_5_mtp.py",
             "vllm/model_executor/models/qwen3_vl.py")

    def configure(z):
        src = z.read("vllm/model_executor/model_loader/utils.py").decode()
        return next(ast.get_source_segment(src, n) for n in ast.parse(src).body
                    if isinstance(n, ast.FunctionDef) and n.name == "configure_quant_config")

    with zipfile.ZipFile(table_wheel((0, 32))) as a, zipfile.ZipFile(table_wheel((0, 33))) as b:
        for f in files:
            assert a.read(f) == b.read(f), f
        assert configure(a) == configure(b)


INC_CASES = ("text/quantized", "text/bf16", "multimodal/quantized", "multimodal/bf16")


def test_with_the_inc_group_a_partial_entry_is_built_quantized(line):
    key, got = line
    assert got["groups"][INC_GROUP][0] == "applied", got["groups"]
    for case in INC_CASES:
        row = got["inc_on"][case]
        assert row["target_partial"] == row["target_plain"] == "quantized", (key, case, row)
        assert row["target_bf16"] == "unquantized", (key, case, row)


def test_without_the_inc_group_a_partial_entry_is_built_unquantized(line):
    """The bug, on the line's own INC code (fails once upstream fixes it: the probe must skip then)."""
    key, got = line
    for case in INC_CASES:
        row = got["inc_off"][case]
        assert row["target_partial"] == "unquantized" and row["target_plain"] == "quantized", (key, case, row)


@pytest.mark.parametrize("half", ["inc_off", "inc_on"])
def test_the_native_mtp_layer_is_resolved_as_the_checkpoint_ships_it(line, half):
    """#49552's question on these lines: the draft reads the checkpoint's block names for ``mtp.layers.N``."""
    key, got = line
    for case in INC_CASES:
        row = got[half][case]
        quantized = case.endswith("/quantized")
        assert ("mtp.layers" in row["blocks"]) == quantized, (key, case, row)
        assert row["mtp_linear"] == ("quantized" if quantized else "unquantized"), (key, case, row)
        assert row["mtp_fc"] == "unquantized", (key, case, row)
        assert row["mtp_moe_bits"] == (4 if quantized else 16), (key, case, row)


def test_inc_reads_expert_entries_only_where_the_moe_class_is_named_fusedmoe(line):
    key, got = line
    moe = got["inc_off"]["moe_expert_entries"]
    assert moe["bits"] == (8 if "fusedmoe" in moe["class"].lower() else 4), (key, moe)
    assert ("fusedmoe" in moe["class"].lower()) == (key <= (0, 23)), (key, moe)


def test_inc_probe_by_feature():
    from vllm_platform_ext.quant import inc_layer

    assert inc_layer.needs('if self.extra_config[layer_name].get("bits", 16) >= 16:')
    assert not inc_layer.needs('if self.extra_config[layer_name].get("bits", self.weight_bits) >= 16:')


def test_bad_extra_config_names_the_problem():
    from vllm_platform_ext.quant import inc_layer

    class Config:
        extra_config = ["model.layers.0.mlp.down_proj"]

    with pytest.raises(ValueError, match="quantization_config.extra_config must be a mapping"):
        inc_layer.partial_entries(Config(), "model.layers.0.mlp.down_proj")


def test_probe_by_feature():
    from vllm_platform_ext.quant import mtp_layer

    fixed = "meta = get_safetensors_params_metadata(model_name)\nif not self.modules_in_block_to_quantize: return"
    assert mtp_layer.needs("dynamic modules_in_block_to_quantize", "modules_in_block_to_quantize", fixed) == []
    today = "if self.modules_in_block_to_quantize: return\nmeta = get_safetensors_params_metadata(model_name)"
    assert len(mtp_layer.needs("", "", today)) == 4


def test_bad_dynamic_names_the_problem():
    from vllm_platform_ext.quant import mtp_layer

    class Config:
        dynamic = ["-:.*mtp.*"]

    with pytest.raises(ValueError, match="quantization_config.dynamic must be a mapping"):
        mtp_layer.dynamic_rules(Config())


def test_a_plugin_class_no_import_path_reaches_is_left_alone():
    """A GPTQ-family subclass made where no module path reaches it (a test's, a factory's) is no patch
    target: model init (``configure_quant_config``) must not fail on it."""
    from vllm.model_executor.layers.quantization.moe_wna16 import MoeWNA16Config

    from vllm_platform_ext.quant import mtp_layer

    class Vendor(MoeWNA16Config):
        def get_quant_method(self, layer, prefix):
            return None

    Vendor.__module__ = "vendor_plugin.quant_config"
    assert Vendor not in mtp_layer.vendor_classes()
    assert not any("vendor_plugin" in t for t in mtp_layer.land_on_vendors())
