"""`vllm-platform-ext doctor` beside vLLM-metax's real Python, per branch, on the CPU stand-in of
``tests/fixtures/metax_standin.py`` (the branch's vLLM line minus its compiled libraries, vLLM-metax
from ``../shared/vllm-metax/<branch>/``, its compiled MetaX parts stubbed, a fake MXSML), both
plugins found through entry points, vLLM-metax's first. What docs/metax.md shows as a healthy
doctor was recorded with:

    python ci/tools/readme_tables.py record -o results/cpu/<date>-doctor-beside-vllm-metax/<date>-doctor-beside-vllm-metax.md -- \
        python ci/tools/metax_doctor.py [BRANCH ...]

Needs what ``ci/setup.sh test`` fetches (the lines' wheels, their Python deps) and gcc.
"""
from __future__ import annotations

import importlib.util
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _load(name: str, path: pathlib.Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main(argv: list[str]) -> int:
    standin = _load("metax_standin", ROOT / "tests" / "fixtures" / "metax_standin.py")
    lines = _load("vllm_lines", ROOT / "ci" / "tools" / "vllm_lines.py")
    tables = _load("compat_tables", ROOT / "ci" / "tools" / "compat_tables.py")
    if standin.metax_source() is None:
        print("../shared/vllm-metax (vLLM-metax's source) is absent", file=sys.stderr)
        return 2
    branches = argv or list(standin.BRANCHES)
    unknown = [b for b in branches if b not in standin.BRANCHES]
    if unknown:
        print(f"unknown branch(es) {unknown}; valid: {list(standin.BRANCHES)}", file=sys.stderr)
        return 2
    rc = 0
    with tempfile.TemporaryDirectory(prefix="vpe-metax-doctor-") as tmp:
        tmp = pathlib.Path(tmp)
        mxsml = tmp / "mxsml"
        standin.build_fake_mxsml(mxsml)
        for branch in branches:
            version = standin.BRANCHES[branch][0]
            wheel = tables.find_wheel(version)
            if wheel is None:
                print(f"no vllm-{version} wheel: run `python ci/tools/compat_tables.py fetch`", file=sys.stderr)
                return 2
            env = standin.standin_env(tmp / branch, branch, lines.extract(wheel, version), lines.DEPS_DIR,
                                      True, mxsml)
            proc = subprocess.run([sys.executable, "-m", "vllm_platform_ext.cli", "doctor"], env=env,
                                  capture_output=True, text=True, timeout=600, cwd=tmp)
            print(f"### {branch} (vLLM {version}): doctor exit {proc.returncode}\n")
            print("```")
            print(proc.stdout.rstrip())
            if proc.returncode:
                print(proc.stderr[-3000:].rstrip())
            print("```\n", flush=True)
            rc = rc or proc.returncode
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
