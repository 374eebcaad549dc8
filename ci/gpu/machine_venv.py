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
print(json.dumps(out))
"""


def check(path: Path, site_dirs: list[str], need_triton: bool) -> dict:
    """torch (and Triton where the machine has it) in the run venv, from the machine's site-packages."""
    proc = subprocess.run([str(venv_python(path)), "-c", CHECK], capture_output=True, text=True,
                          env={**os.environ, "VPE_MACHINE_SITE": json.dumps(site_dirs)})
    if proc.returncode != 0:
        raise SystemExit(f"machine_venv: the run venv cannot run its check:\n{proc.stderr[-2000:]}")
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    for name in ("torch",) + (("triton",) if need_triton else ()):
        got = found[name]
        if "error" in got:
            raise SystemExit(f"machine_venv: the run venv {path} cannot import {name} ({got['error']}); "
                             f"the machine's site-packages: {site_dirs}")
        if not got["machine"]:
            raise SystemExit(f"machine_venv: {name} {got['version']} in the run venv is {got['file']}, not the "
                             f"machine's own (under {site_dirs}): a carried wheel shadows it")
    return found


def build(path: Path, wheels: Path) -> dict:
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        raise SystemExit(f"machine_venv: {sys.executable} has no torch: run it with the interpreter that holds torch")
    site_dirs = machine_site_dirs()
    need_triton = importlib.util.find_spec("triton") is not None
    stamp = path / STAMP
    if not (stamp.is_file() and stamp.read_text() == stamp_text()):
        shutil.rmtree(path, ignore_errors=True)
        venv.EnvBuilder(system_site_packages=True, with_pip=True, symlinks=True).create(str(path))
        files = sorted(str(p) for p in Path(wheels).glob("*.whl"))
        if not files:
            raise SystemExit(f"machine_venv: no wheels in {wheels}")
        subprocess.run([str(venv_python(path)), "-m", "pip", "install", "-q", "--no-index", "--no-deps", *files],
                       check=True)
        # a venv of a venv sees the base interpreter's site-packages only: name the parent's
        (venv_site(path) / PTH).write_text("".join(d + "\n" for d in site_dirs))
        stamp.write_text(stamp_text())
    found = check(path, site_dirs, need_triton)
    print("machine_venv: " + "; ".join(f"{n} {v['version']} from {v['file']}" for n, v in found.items()
                                      if "error" not in v))
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
