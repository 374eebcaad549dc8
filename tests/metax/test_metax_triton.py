"""The Triton kernels this plugin launches on MetaX compile with the Triton each vLLM-metax branch
pins (issue 33, item 3): 3.0.0 on v0.23.0-dev, 3.6.0 on releases/v0.22.0, v0.24.0-dev,
v0.25.0-dev and master.

``ci/tools/aot_metax.py`` runs the ops' own host code with MetaX's op configuration (platform
``maca``: ``num_warps`` <= 16, TurboQuant with ``gluon=False, inline_ptx=False``) over the GDN
standard cases and every TurboQuant preset, both TurboQuant kernels (v2 word loads, v1 byte
loads), and compiles each launch for a CUDA SM 8.0 target (Triton's bundled ptxas; no GPU) with
that Triton release on ``PYTHONPATH``. Before this test the v0.23 pin rejected three constructs
of the TurboQuant kernels that 3.6 accepts (``uint16 << 8`` widening to int32 before a 16-bit
bitcast; a chained ``A and B and C``; ``fp16 - float literal`` promoting to fp32 in a ``tl.dot``).
The Gluon kernel needs a newer Triton (and NVIDIA hardware): MetaX's config never routes to it,
and doctor says why.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from conftest import REPO, load_tool

LINES = load_tool("ci/tools/vllm_lines.py")
KERNELS = {"_conv_prefill_kernel", "_conv_update_kernel", "_gating_kernel", "_recurrent_kernel",
           "_tq_verify_stage1", "_tq_verify_stage2", "_tq_verify_v2"}


def _aot(version: str) -> dict:
    missing = LINES.triton_missing(version)
    if missing:
        pytest.fail(missing)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_PLATFORM_EXT_", "TRITON_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(LINES.triton_dir(version)), REPO])
    env["TRITON_CACHE_DIR"] = os.path.join(str(LINES.triton_dir(version)), ".triton-cache")
    proc = subprocess.run([sys.executable, os.path.join(REPO, "ci", "tools", "aot_metax.py"), "--arch", "80"],
                          capture_output=True, text=True, env=env, timeout=900, cwd=REPO)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("JSON")]
    assert proc.returncode == 0 and lines, f"rc={proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-6000:]}"
    return json.loads(lines[-1][4:])


@pytest.mark.parametrize("version", LINES.TRITONS)
def test_metax_kernels_compile_with_the_pinned_triton(version):
    out = _aot(version)
    assert out["triton"] == version
    failed = [k for k in out["kernels"] if not k["ok"]]
    assert not failed, f"Triton {version}: " + "\n".join(f"{k['kernel']}: {k['error']}" for k in failed)
    assert not out["host_errors"], out["host_errors"]
    assert {k["kernel"] for k in out["kernels"]} == KERNELS
    assert max(k["num_warps"] for k in out["kernels"]) <= 16  # MACA's limit
    print(f"\nTriton {version}: {len(out['kernels'])} specializations of {len(KERNELS)} kernels compiled "
          f"from {out['calls']} op calls")


def test_branch_pins_are_the_versions_tested():
    """Each vLLM-metax branch's ``requirements/maca_private.txt`` pins one of the Triton versions
    above (what doctor prints for the branch comes from the same table)."""
    import importlib.util
    from pathlib import Path

    from vllm_platform_ext import metax_peer

    spec = importlib.util.spec_from_file_location("metax_standin", Path(__file__).resolve().parents[1] / "fixtures" / "metax_standin.py")
    standin = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(standin)
    src = standin.metax_source()
    if src is None:
        pytest.skip("../shared/vllm-metax (vLLM-metax's source) is absent")
    for folder in standin.BRANCHES:
        text = (src / folder / "requirements" / "maca_private.txt").read_text()
        pin = re.search(r"^triton==(\d+\.\d+)\.\d+\+metax", text, re.M).group(1)
        branch = metax_peer.branch_for(standin.BRANCHES[folder][1])
        assert metax_peer.TRITON[branch] == pin, (folder, pin)
        assert f"{pin}.0" in LINES.TRITONS


def test_doctor_says_why_metax_takes_no_gluon(python):
    proc = python("from vllm_platform_ext.ops.turboquant import triton_verify as tv\n"
                  "import json; print('JSON' + json.dumps(tv.describe_kernels()))",
                  env={"VLLM_PLATFORM_EXT_PLATFORM": "maca", "PYTHONPATH": REPO})
    rows = json.loads([ln for ln in proc.stdout.splitlines() if ln.startswith("JSON")][-1][4:])
    assert rows and all("gluon" not in kernel and "no Gluon" in why and "no PTX" in why for _, kernel, why in rows)
