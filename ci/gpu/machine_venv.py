"""Build the GPU machine's run venv on the machine's own torch (run by ``ci/gpu/run.sh``).

Run with the interpreter that holds torch (``run.sh`` finds it)::

    python3 ci/gpu/machine_venv.py VENV WHEELS_DIR

The venv is made with ``--system-site-packages`` and the carried wheels are installed into it
with ``--no-index --no-deps``. A venv made *from a venv* sees the base interpreter's
site-packages, not its parent's: on the GPU machine ``python3`` is ``/opt/torch/.venv/bin/python3``
and torch lives in that venv, so the run venv's ``import torch`` failed (issue 32). After the
install this writes ``_vpe_machine_site.pth`` into the run venv naming the creating
interpreter's own site-packages (after the venv's own, so carried wheels win, as with
``--system-site-packages``), then checks in the new venv that torch (and Triton, where the machine
has it) import from the machine's site-packages and not from a carried wheel. The stamp
``VENV/.installed`` records the interpreter; another interpreter rebuilds the venv.

A bundle that carries its own torch (a vLLM line pinning another torch, ``ci/gpu/bundle.py``)
has ``WHEELS/bundle-pins.json``. Then the carried torch and Triton are the run venv's (its
site-packages come before the machine's), the machine's ``nvidia/`` tree is linked file by file
into the run venv's where no carried wheel put that file (torch finds its CUDA libraries through
``$ORIGIN/../../nvidia/*/lib``: the machine serves those ``cuda_libs.py`` decided it can), and the
check fails unless torch, its CUDA and Triton are the pinned versions from the run venv.
"""
from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

PTH = "_vpe_machine_site.pth"
STAMP = ".installed"
PINS = "bundle-pins.json"  # written by ci/gpu/bundle.py build where the bundle carries torch


def machine_site_dirs() -> list[str]:
    """This interpreter's site-packages (purelib, platlib, then site's list), existing ones, once."""
    dirs = [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *site.getsitepackages()]
    return [d for d in dict.fromkeys(os.path.realpath(d) for d in dirs) if os.path.isdir(d)]


def stamp_text() -> str:
    return json.dumps({"python": os.path.realpath(sys.executable), "prefix": sys.prefix}, sort_keys=True)


def venv_python(path: Path) -> Path:
    return path / "bin" / "python"


def venv_site(path: Path) -> Path:
    out = subprocess.run([str(venv_python(path)), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         check=True, capture_output=True, text=True).stdout.strip()
    return Path(out)


CHECK = """
import importlib, json, os, sys
site_dirs = json.loads(os.environ["VPE_MACHINE_SITE"])
out = {}
for name in ("torch", "triton"):
    try:
        mod = importlib.import_module(name)
    except ImportError as exc:
        out[name] = {"error": str(exc)}
        continue
    path = os.path.realpath(mod.__file__)
    out[name] = {"version": getattr(mod, "__version__", "?"), "file": path,
                 "machine": any(path.startswith(d + os.sep) for d in site_dirs)}
    if name == "torch":
        out[name]["cuda"] = getattr(getattr(mod, "version", None), "cuda", None)
        try:  # cuDNN left on the machine: torch raises at the first cuDNN call when runtime < build
            cudnn = mod._C._cudnn
            out[name]["cudnn"] = [list(cudnn.getRuntimeVersion()), list(cudnn.getCompileVersion())]
        except Exception:
            pass
libs = {}
with open("/proc/self/maps") as f:  # the CUDA libraries import torch loaded, and from where
    for line in f:
        p = line.split()[-1]
        if "/nvidia/" in p and ".so" in p:
            libs[os.path.basename(p)] = os.path.realpath(p)
out["cuda_libs"] = libs
print(json.dumps(out))
"""


def check(path: Path, site_dirs: list[str], need_triton: bool, pins: dict | None = None) -> dict:
    """torch (and Triton where the machine has it) in the run venv: the machine's own, or, where the
    bundle carries them (``pins``), the carried ones at the pinned versions and CUDA."""
    proc = subprocess.run([str(venv_python(path)), "-c", CHECK], capture_output=True, text=True,
                          env={**os.environ, "VPE_MACHINE_SITE": json.dumps(site_dirs)})
    if proc.returncode != 0:
        raise SystemExit(f"machine_venv: the run venv cannot run its check:\n{proc.stderr[-2000:]}")
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    for name in ("torch",) + (("triton",) if need_triton or pins else ()):
        got = found[name]
        if "error" in got:
            raise SystemExit(f"machine_venv: the run venv {path} cannot import {name} ({got['error']}); "
                             f"the machine's site-packages: {site_dirs}")
        if pins is None and not got["machine"]:
            raise SystemExit(f"machine_venv: {name} {got['version']} in the run venv is {got['file']}, not the "
                             f"machine's own (under {site_dirs}): a carried wheel shadows it")
        if pins is not None:
            want = pins[name]
            if got["machine"] or got["version"].split("+")[0] != want:
                raise SystemExit(f"machine_venv: the bundle carries {name} {want} but the run venv imports {name} "
                                 f"{got['version']} from {got['file']}")
    if pins is not None and found["torch"].get("cuda") != pins.get("torch_cuda"):
        raise SystemExit(f"machine_venv: the carried torch {found['torch']['version']} reports CUDA "
                         f"{found['torch'].get('cuda')}, the bundle pins {pins.get('torch_cuda')}")
    return found


def link_machine_cuda(path: Path, site_dirs: list[str]) -> int:
    """Link every file of the machine's ``nvidia/`` trees into the run venv's ``nvidia/`` where no
    carried wheel put one (carried CUDA libraries win); returns how many links were made."""
    dest, made = venv_site(path) / "nvidia", 0
    for d in site_dirs:
        root = Path(d) / "nvidia"
        if not root.is_dir():
            continue
        for f in sorted(root.rglob("*")):
            target = dest / f.relative_to(root)
            if f.is_dir() or "__pycache__" in f.parts or target.exists() or target.is_symlink():
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(f.resolve())
            made += 1
    return made


def build(path: Path, wheels: Path) -> dict:
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        raise SystemExit(f"machine_venv: {sys.executable} has no torch: run it with the interpreter that holds torch")
    site_dirs = machine_site_dirs()
    need_triton = importlib.util.find_spec("triton") is not None
    pins_file = Path(wheels) / PINS
    pins = json.loads(pins_file.read_text()) if pins_file.is_file() else None
    stamp = path / STAMP
    if not (stamp.is_file() and stamp.read_text() == stamp_text()):
        shutil.rmtree(path, ignore_errors=True)
        venv.EnvBuilder(system_site_packages=True, with_pip=True, symlinks=True).create(str(path))
        files = sorted(str(p) for p in Path(wheels).glob("*.whl"))
        if not files:
            raise SystemExit(f"machine_venv: no wheels in {wheels}")
        # --no-compile: byte-compiling every module of torch, vLLM, transformers ... costs more than the
        # install (transformers + sympy here, 2026-12-06: 15.8 s of CPU compiled, 1.1 s not); Python
        # compiles what the suite imports, once, on first import
        subprocess.run([str(venv_python(path)), "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                        *files],
                       check=True)
        # a venv of a venv sees the base interpreter's site-packages only: name the parent's
        (venv_site(path) / PTH).write_text("".join(d + "\n" for d in site_dirs))
        if pins is not None:
            print(f"machine_venv: linked {link_machine_cuda(path, site_dirs)} files of the machine's nvidia/ "
                  f"into the run venv")
        stamp.write_text(stamp_text())
    found = check(path, site_dirs, need_triton, pins)
    print("machine_venv: " + "; ".join(f"{n} {v['version']} from {v['file']}" for n, v in found.items()
                                      if n != "cuda_libs" and "error" not in v))
    if pins is not None:
        print(f"machine_venv: carried torch {found['torch']['version']} (CUDA {found['torch']['cuda']}), "
              f"triton {found['triton']['version']}: the pins of vLLM {pins.get('vllm')}")
    if found["torch"].get("cudnn"):
        run, build = (".".join(map(str, v)) for v in found["torch"]["cudnn"])
        print(f"machine_venv: cuDNN runtime {run}, torch built against {build}"
              + ("" if found["torch"]["cudnn"][0][:2] >= found["torch"]["cudnn"][1][:2] else
                 ": torch raises at the first cuDNN call (left on the machine: ci/gpu/bundle.py CUDA_LEFT_ON_MACHINE)"))
    for lib, where in sorted(found.get("cuda_libs", {}).items()):
        print(f"machine_venv: loaded {lib} from {where}")
    return found


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: machine_venv.py VENV WHEELS_DIR", file=sys.stderr)
        return 2
    build(Path(argv[0]), Path(argv[1]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
