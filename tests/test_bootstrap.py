"""bootstrap(): once per process, steps in order, failures reported, strict mode, register() contract."""
import json

import pytest

REPORT = "import json, vllm_platform_ext as v; print('JSON' + json.dumps(v.bootstrap.info()))"


def _info(proc):
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [l for l in proc.stdout.splitlines() if l.startswith("JSON")][-1]
    return json.loads(line[4:])


def test_bootstrap_is_idempotent_and_ordered(python):
    info = _info(python("import vllm_platform_ext as v\nv.bootstrap.run(); v.bootstrap.run(); v.bootstrap.run()\n" + REPORT))
    assert info["runs"] == 1
    steps = [e["step"] for e in info["entries"]]
    # compat first, then ops, patches (the quantization groups among them): each step's entries form one contiguous run
    order = [s for i, s in enumerate(steps) if i == 0 or steps[i - 1] != s]
    assert order == ["compat", "ops", "patch"], order
    assert not [e for e in info["entries"] if e["status"] == "failed"], info["entries"]


def test_vllm_plugin_loader_runs_bootstrap_once(python):
    info = _info(python("from vllm.plugins import load_general_plugins as l\nl(); l()\n"
                        "import vllm_platform_ext as v; v.bootstrap.run()\n" + REPORT))
    assert info["runs"] == 1 and info["summary"]


FAILING_GROUP = """
import vllm_platform_ext.patch as w
from vllm_platform_ext.patching import Patch, PatchGroup
def broken():
    raise RuntimeError("boom in build")
w.groups = lambda: [PatchGroup("test.broken", "test", broken),
                    PatchGroup("test.missing", "test", lambda: [Patch("vllm:__no_such_attr__", lambda o: o)])]
import vllm_platform_ext as v
"""


def test_failure_is_reported_not_raised(python):
    info = _info(python(FAILING_GROUP + "v.bootstrap.run()\n" + REPORT))
    got = {e["name"]: e for e in info["entries"]}
    assert got["test.broken"]["status"] == "failed" and "boom in build" in got["test.broken"]["detail"]
    # no probe says "not needed", so the fix is needed and its missing target fails the health line
    assert got["test.missing"]["status"] == "failed" and "__no_such_attr__" in got["test.missing"]["detail"]
    assert "failed" in info["summary"] and " 0 failed" not in info["summary"]


def test_strict_mode_raises(python):
    proc = python(FAILING_GROUP + "v.bootstrap.run()\n", env={"VLLM_PLATFORM_EXT_STRICT": "1"})
    assert proc.returncode != 0 and "boom in build" in proc.stderr


@pytest.mark.parametrize("override,expected", [("", None), ("auto", None), ("none", None),
                                               ("maca", "vllm_platform_ext.platform.MacaPlatform")])
def test_register_contract_and_no_heavy_imports(python, override, expected):
    code = ("import sys, json, vllm_platform_ext as v\nr = v.register()\n"
            "heavy = sorted(m for m in sys.modules if m.startswith('vllm.') or m == 'vllm')\n"
            "print('JSON' + json.dumps({'r': r, 'heavy': heavy}))")
    proc = python(code, env={"VLLM_PLATFORM_EXT_PLATFORM": override})
    out = _info(proc)
    assert out["r"] == expected
    assert out["heavy"] == [], f"register() imported vLLM modules: {out['heavy'][:10]}"
