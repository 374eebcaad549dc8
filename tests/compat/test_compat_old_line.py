"""The compat step on an old vLLM line with its kernel library absent (issue 23): vLLM 0.23.0's
CUDA wheel in ``.venv-old`` on this CPU host cannot load ``vllm._C`` (no libcuda), the stand-in
for a MetaX kernel library that lacks ops.

The plugin is not installed there: the child processes see this checkout on ``PYTHONPATH`` and
our two entry points through a ``.dist-info`` folder written beside it, so vLLM's own plugin
loader (``load_general_plugins``, what every vLLM process runs first) calls ``bootstrap()``.
Without the plugin most fusion modules fail to import (a fact recorded, not asserted per
module); with it every non-ROCm fusion module and the MTP/quantization import path import, in
the process and in a spawned child (as a spawned EngineCore), and compat uses the line's own
table. ``OLD_VLLM_PYTHON`` points the tests at another old-line venv (e.g. one made with
``OLD_VLLM_VERSION=0.26.0 OLD_VLLM_VENV=.venv-old26 bash ci/old_vllm_venv.sh``).
"""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from conftest import REPO, old_vllm_python

CHILD = r"""
import importlib, json, os, sys, pkgutil

# qwen3_5_mtp is left out: it imports the Qwen2-VL image processor and with it torchvision,
# which the old venv cannot load on a CPU torch (a stand-in limit, not a compat one).
MTP_PATH = ("vllm._custom_ops", "vllm.model_executor.layers.quantization",
            "vllm.model_executor.layers.quantization.moe_wna16", "vllm.v1.spec_decode.eagle",
            "vllm.model_executor.models.qwen3_next_mtp")


def fusion_modules():
    import vllm.compilation.passes.fusion as f
    return sorted(m.name for m in pkgutil.iter_modules(f.__path__))


def try_imports():
    out = {}
    for name in ["vllm.compilation.passes.fusion." + m for m in fusion_modules()] + list(MTP_PATH):
        if importlib.util.find_spec(name) is None:
            out[name] = "absent in this line"
            continue
        try:
            importlib.import_module(name)
            out[name] = "ok"
        except Exception as e:
            out[name] = f"{type(e).__name__}: {str(e)[:160]}"
    return out


def state():
    from vllm.plugins import load_general_plugins
    load_general_plugins()
    info = {"imports": try_imports()}
    try:
        import vllm._C  # noqa: F401
        info["kernel_library"] = "loaded"
    except ImportError as e:
        info["kernel_library"] = f"absent: {str(e)[:80]}"
    if "vllm_platform_ext" in sys.modules:
        import vllm_platform_ext as v
        from vllm_platform_ext import compat
        info["bootstrap"] = v.bootstrap.info()["summary"]
        info["runs"] = v.bootstrap.info()["runs"]
        info["table"] = compat.table_info()
        info["compat_failed"] = [e for e in v.bootstrap.info()["entries"] if e["status"] == "failed"]
    return info


def child(q):
    q.put(state())


if __name__ == "__main__":
    import multiprocessing as mp
    res = {"vllm": importlib.import_module("vllm").__version__, "main": state()}
    if sys.argv[1:] == ["--spawn"]:
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        p = ctx.Process(target=child, args=(q,))
        p.start()
        res["spawned"] = q.get(timeout=600)
        p.join(60)
    print("JSON" + json.dumps(res))
"""

ENTRY_POINTS = """[vllm.general_plugins]
vllm_platform_ext = vllm_platform_ext.general_plugin:bootstrap

[vllm.platform_plugins]
vllm_platform_ext = vllm_platform_ext:register
"""




def _run(tmp_path, plugin: bool, spawn: bool) -> dict:
    py = old_vllm_python()
    if not os.path.exists(py):
        pytest.fail(f"old-vLLM venv missing ({py}): run `bash ci/old_vllm_venv.sh` (setup step)")
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    path = [str(tmp_path / "script_dir_only")]
    if plugin:  # our entry points, as an install would provide them
        dist = tmp_path / "eps" / "vllm_platform_ext-0.1.0.dist-info"
        dist.mkdir(parents=True)
        (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm-platform-ext\nVersion: 0.1.0\n")
        (dist / "entry_points.txt").write_text(ENTRY_POINTS)
        path = [REPO, str(tmp_path / "eps")]
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_PLATFORM_EXT_")}
    env.update(PYTHONPATH=os.pathsep.join(path), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    proc = subprocess.run([py, str(script)] + (["--spawn"] if spawn else []), cwd=str(tmp_path), env=env,
                          capture_output=True, text=True, timeout=900)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("JSON")]
    assert proc.returncode == 0 and lines, f"rc={proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return json.loads(lines[-1][4:])


def _is_rocm(name: str) -> bool:
    return "rocm" in name or "aiter" in name


@pytest.fixture(scope="module")
def with_plugin(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("on"), plugin=True, spawn=True)


def test_without_the_plugin_fusion_modules_fail(tmp_path):
    out = _run(tmp_path, plugin=False, spawn=False)["main"]
    assert out["kernel_library"].startswith("absent"), "the stand-in needs vllm._C to be unloadable"
    fusion = {k: v for k, v in out["imports"].items() if ".fusion." in k}
    failed = sorted(k for k, v in fusion.items() if v != "ok")
    print(f"\nwithout the plugin {len(failed)} of {len(fusion)} fusion modules fail: {failed}")
    assert len(failed) >= 2, fusion  # what the plugin has to fix (0.23.0: 10 of 12)


@pytest.mark.parametrize("where", ["main", "spawned"])
def test_with_the_plugin_every_non_rocm_module_imports(with_plugin, where):
    out = with_plugin[where]
    version = with_plugin["vllm"]
    assert out["kernel_library"].startswith("absent")
    assert out["runs"] == 1 and " 0 failed" in out["bootstrap"], (out["bootstrap"], out["compat_failed"])
    want = ".".join(version.split("+")[0].split(".")[:2])
    assert out["table"]["table"] == want and not out["table"]["note"], out["table"]
    bad = {k: v for k, v in out["imports"].items() if v not in ("ok", "absent in this line") and not _is_rocm(k)}
    assert not bad, f"vLLM {version} ({where}): still failing after bootstrap: {bad}"
    assert out["imports"]["vllm.compilation.passes.fusion.act_quant_fusion"] == "ok"
    assert sum(v == "ok" for k, v in out["imports"].items() if ".fusion." in k) >= 10
