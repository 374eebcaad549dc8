"""conftest.in_process_bootstrap, the one way a test file bootstraps the plugin in its own process: inside, vLLM's
plugin loader has applied the patch groups; after, vLLM's functions are its own again (CI's xdist workers run
several files in one process: on d4f6aa1 a file's bootstrap left the GDN group applied and a later file's
"vLLM's own" function was the plugin's), while the bootstrap's report and compat's op schemas stay."""
import json

from conftest import REPO, run_python

CODE = f"""
import json, sys
sys.path.insert(0, {REPO + '/tests'!r})
import torch
from conftest import in_process_bootstrap
from vllm_platform_ext import patching
from vllm_platform_ext.patch import gdn_cpu
import vllm.model_executor.layers.mamba.ops.cpu.gdn_attention as m

with in_process_bootstrap() as report:
    inside = sorted(patching.applied_targets())
    inside_fn = m._cpu_gdn_attention_spec_aware.__module__
after = sorted(patching.applied_targets())
with in_process_bootstrap() as report2:  # a second file in the same process (xdist --dist loadfile)
    inside2 = sorted(patching.applied_targets())
    inside2_fn = m._cpu_gdn_attention_spec_aware.__module__
after2 = sorted(patching.applied_targets())
print("JSON" + json.dumps({{
    "inside": inside, "inside_fn": inside_fn, "after": after,
    "after_fn": m._cpu_gdn_attention_spec_aware.__module__, "target": gdn_cpu.TARGET,
    "inside2": inside2, "inside2_fn": inside2_fn, "after2": after2, "same_report": report2 is report,
    "report": report is not None and report.summary(),
    "compat_kept": hasattr(torch.ops._C, "rms_norm_static_fp8_quant")}}))
"""


def test_patch_groups_applied_inside_and_vllms_own_functions_after():
    """Twice in one process, as two files on one xdist worker: applied inside both times."""
    p = run_python(CODE)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.split("JSON", 1)[1])
    assert out["target"] in out["inside"] and out["inside_fn"] == "vllm_platform_ext.patch.gdn_cpu"
    assert out["after"] == [] and out["after_fn"] == "vllm.model_executor.layers.mamba.ops.cpu.gdn_attention"
    assert out["report"] and out["compat_kept"]
    # the second time in one process: vLLM's loader does nothing (plugins_loaded), the groups are put back
    assert out["inside2"] == out["inside"] and out["inside2_fn"] == "vllm_platform_ext.patch.gdn_cpu"
    assert out["after2"] == [] and out["same_report"]
