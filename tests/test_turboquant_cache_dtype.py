"""The V1 runner of vLLM 0.25/0.26 reshapes a TurboQuant layer's cache for dtype ``"auto"``
(``wiring/turboquant_cache_dtype.py``). Found on the GPU (H200, vLLM 0.26.0, 2026-11-27): every
TurboQuant engine died at start-up with ``Unknown TurboQuant cache dtype: 'auto'``, plugin on and
off; no CPU test ran the runner's own ``_reshape_kv_cache_tensors``.

Here each kept GPU line's own Python (its wheel, kernel libraries absent, on this venv's torch)
runs its real ``GPUModelRunner._reshape_kv_cache_tensors`` on a TurboQuant group (its real
backend, a real ``TQFullAttentionSpec`` where the line has one) in a child process, plugin off
and on. Plugin off, the lines whose runner passes ``"auto"`` must fail as the engine did (so
the test sees the bug); plugin on, every line must give the layer the backend's own shape for
the configured preset, and the group must be applied exactly where the probe says it is needed.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO, line_source

LINES = [(0, 22), (0, 23), (0, 24), (0, 25), (0, 26)]
NEEDED = {(0, 25), (0, 26)}  # their runner: '"auto" if kv_cache_spec.kv_quant_mode == KVQuantMode.NONE'

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
spec = spec_cls(**kw, tq_slot_size=want[-1]) if spec_cls else K.FullAttentionSpec(**kw)
nbytes = blocks * bs * heads * want[-1]
group = types.SimpleNamespace(kv_cache_spec=spec, backend=B, layer_names=["model.layers.3.attn"],
                              kv_cache_group_id=0)
runner = types.SimpleNamespace(
    kv_cache_config=types.SimpleNamespace(kv_cache_tensors=[]), runner_only_attn_layers=set(),
    cache_config=types.SimpleNamespace(cache_dtype=preset), _kv_cache_spec_attn_group_iterator=lambda: [group],
    _has_mixed_attention_kv_layout=lambda sizes: False, kernel_block_size_for=None)
out = {"want": list(want)}
try:
    caches = GPUModelRunner._reshape_kv_cache_tensors(runner, {"model.layers.3.attn": torch.zeros(nbytes, dtype=torch.int8)}, [bs])
    t = caches["model.layers.3.attn"]
    out["got"] = list(t.shape)
except Exception as e:
    out["error"] = f"{type(e).__name__}: {e}"
try:
    import vllm_platform_ext as v
    out["report"] = [e for e in v.bootstrap_info()["entries"] if "v1_runner_cache_dtype" in e["name"]]
except Exception as e:
    out["report"] = str(e)
print("JSON" + json.dumps(out))
"""


def _run(key, plugin: bool) -> dict:
    root = line_source(key)
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_PLATFORM_EXT_")}
    env.update(PYTHONPATH=os.pathsep.join([root, REPO]), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    if not plugin:
        env["VLLM_PLUGINS"] = ""
    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, cwd=root, timeout=600)
    out = [ln for ln in proc.stdout.splitlines() if ln.startswith("JSON")]
    assert proc.returncode == 0 and out, f"vLLM {key}: rc={proc.returncode}\n{proc.stderr[-4000:]}"
    return json.loads(out[-1][4:])


@pytest.mark.parametrize("key", LINES, ids=lambda k: f"vllm-{k[0]}.{k[1]}")
def test_runner_reshapes_turboquant_layers_for_their_preset(key):
    off, on = _run(key, plugin=False), _run(key, plugin=True)
    if key in NEEDED:
        assert "Unknown TurboQuant cache dtype" in off.get("error", ""), off  # the engine's start-up error
    else:
        assert off.get("got") == off["want"], off
    assert on.get("got") == on["want"], on
    status = {e["status"] for e in on["report"]} if isinstance(on["report"], list) else on["report"]
    assert status == ({"applied"} if key in NEEDED else {"skipped"}), on["report"]
