"""The V1 runner of vLLM 0.25-0.28 reshapes a TurboQuant layer's cache for dtype ``"auto"``
(``patch/turboquant/cache_dtype.py``). Found on the GPU (H200, vLLM 0.26.0, 2026-11-27): every
TurboQuant engine died at start-up with ``Unknown TurboQuant cache dtype: 'auto'``, plugin on and
off; no CPU test ran the runner's own ``_reshape_kv_cache_tensors``.

Here each kept GPU line's own Python (its wheel, kernel libraries absent, on this venv's torch)
runs its real ``GPUModelRunner._reshape_kv_cache_tensors`` on a TurboQuant group (its real
backend, a real ``TQFullAttentionSpec`` where the line has one) in a child process, as vLLM's
own method (the original the patch keeps) and as patched. The original must fail on the lines
whose runner passes ``"auto"`` as the engine did (so the test sees the bug); patched, every line
must give the layer the backend's own shape for the configured preset, and the group must be
applied exactly where the probe says it is needed. 0.22-0.24 share 0.24's runner code here.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO, line_source

# The lines whose runner has _reshape_kv_cache_tensors (0.29+ build layer views in create_kv_cache_views: the
# group's probe says "not needed" there, checked in test_compat_lines_import's GROUP_VERDICTS). 0.27/0.28's runner
# has the same '"auto" if kv_cache_spec.kv_quant_mode == KVQuantMode.NONE', but TurboQuant is a KVQuantMode there
# and the layer's spec carries it (the child builds the spec as the line's Attention layer does): not needed.
LINES = [(0, 24), (0, 25), (0, 26), (0, 27), (0, 28)]
NEEDED = {(0, 25), (0, 26)}

CHILD = r"""
import json, sys, types
import torch
from vllm.plugins import load_general_plugins
load_general_plugins()
from vllm.v1.worker.gpu_model_runner import GPUModelRunner
from vllm.v1.attention.backends.turboquant_attn import TurboQuantAttentionBackend as B
import vllm.v1.kv_cache_interface as K
preset, blocks, bs, heads, d = "turboquant_k8v4", 3, 16, 2, 128
want = tuple(B.get_kv_cache_shape(blocks, bs, heads, d, cache_dtype_str=preset))
spec_cls = getattr(K, "TQFullAttentionSpec", None)
kw = dict(block_size=bs, num_kv_heads=heads, head_size=d, dtype=torch.uint8)
if hasattr(K, "get_kv_quant_mode"):  # the line's Attention.get_kv_cache_spec: kv_quant_mode=get_kv_quant_mode(dtype)
    kw["kv_quant_mode"] = K.get_kv_quant_mode(preset)
spec = spec_cls(**kw, tq_slot_size=want[-1]) if spec_cls else K.FullAttentionSpec(**kw)
if hasattr(B, "customize_spec"):  # 0.28: the backend sizes its own slot (no TQFullAttentionSpec)
    spec = B.customize_spec(spec)
nbytes = blocks * bs * heads * want[-1]
group = types.SimpleNamespace(kv_cache_spec=spec, backend=B, layer_names=["model.layers.3.attn"],
                              kv_cache_group_id=0)
runner = types.SimpleNamespace(
    kv_cache_config=types.SimpleNamespace(kv_cache_tensors=[]), runner_only_attn_layers=set(),
    cache_config=types.SimpleNamespace(cache_dtype=preset), _kv_cache_spec_attn_group_iterator=lambda: [group],
    _has_mixed_attention_kv_layout=lambda sizes: False, kernel_block_size_for=None)
from vllm_platform_ext import patching
target = "vllm.v1.worker.gpu_model_runner:GPUModelRunner._reshape_kv_cache_tensors"
vllm_own = patching.original(target) if patching.is_patched(target) else GPUModelRunner._reshape_kv_cache_tensors
out = {"want": list(want)}
for key, fn in (("vllm", vllm_own), ("patched", GPUModelRunner._reshape_kv_cache_tensors)):
    try:
        caches = fn(runner, {"model.layers.3.attn": torch.zeros(nbytes, dtype=torch.int8)}, [bs])
        out[key] = list(caches["model.layers.3.attn"].shape)
    except Exception as e:
        out[key] = f"{type(e).__name__}: {e}"
# a vendor's copy of the backend (vLLM-metax's MacaTurboQuantAttentionBackend: upstream's file,
# renamed), selected after bootstrap: the fix must land on it too (the GPU stand-in, 2026-11-27)
shape_target = "vllm.v1.attention.backends.turboquant_attn:TurboQuantAttentionBackend.get_kv_cache_shape"
import inspect
raw = patching.original(shape_target) if patching.is_patched(shape_target) else inspect.getattr_static(B, "get_kv_cache_shape")
class MacaTurboQuantAttentionBackend(B):
    get_kv_cache_shape = staticmethod(raw.__func__)
from vllm_platform_ext.patch.turboquant import spec_verify as tq_wiring
tq_wiring.land_on(MacaTurboQuantAttentionBackend)
group.backend = MacaTurboQuantAttentionBackend
try:
    caches = GPUModelRunner._reshape_kv_cache_tensors(runner, {"model.layers.3.attn": torch.zeros(nbytes, dtype=torch.int8)}, [bs])
    out["copy"] = list(caches["model.layers.3.attn"].shape)
except Exception as e:
    out["copy"] = f"{type(e).__name__}: {e}"
try:
    import vllm_platform_ext as v
    out["report"] = [e for e in v.bootstrap.info()["entries"] if "v1_runner_cache_dtype" in e["name"]]
except Exception as e:
    out["report"] = str(e)
print("JSON" + json.dumps(out))
"""


def _run(key) -> dict:
    root = line_source(key)
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_PLATFORM_EXT_")}
    env.update(PYTHONPATH=os.pathsep.join([root, REPO]), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, cwd=root, timeout=600)
    out = [ln for ln in proc.stdout.splitlines() if ln.startswith("JSON")]
    assert proc.returncode == 0 and out, f"vLLM {key}: rc={proc.returncode}\n{proc.stderr[-4000:]}"
    return json.loads(out[-1][4:])


@pytest.mark.parametrize("key", LINES, ids=lambda k: f"vllm-{k[0]}.{k[1]}")
def test_runner_reshapes_turboquant_layers_for_their_preset(key):
    got = _run(key)
    if key in NEEDED:
        assert "Unknown TurboQuant cache dtype" in str(got["vllm"]), got  # the engine's start-up error
    else:
        assert got["vllm"] == got["want"], got
    assert got["patched"] == got["want"], got
    assert got["copy"] == got["want"], got  # a vendor's copy selected later gets the fix too
    status = {e["status"] for e in got["report"]} if isinstance(got["report"], list) else got["report"]
    assert status == ({"applied"} if key in NEEDED else {"skipped"}), got["report"]
