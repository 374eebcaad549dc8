"""Carry a vLLM CUDA engine to the GPU machine: lock, build and check the bundle.

The GPU machine has torch 2.11.0 (CUDA 13) and Triton 3.6 but no network, and takes files
of at most 64 MiB a call. vLLM 0.20-0.26's CUDA wheels pin exactly that torch, so the engine
runs there once its wheel and its Python dependencies are carried over. On a networked
machine (this one)::

    python ci/gpu/bundle.py lock  --vllm 0.23.0 --python 3.12   # resolve, pin, hash -> lock.json
    python ci/gpu/bundle.py build --vllm 0.23.0 --python 3.12   # -> .carry/gpu-0.23.0-py3.12/

``build`` downloads exactly the locked files (sha256 checked), strips the vLLM wheel of what
the suite never loads (:data:`STRIP`), adds this project's committed tree (``git archive HEAD``,
as a wheel to install and as a tree for the tests and benchmarks),
packs everything into one tar.xz cut into parts of at most :data:`PART_MIB` MiB, and writes
``manifest.json`` + ``SHA256SUMS`` + ``unpack.sh`` beside them. Carry ``unpack.sh``,
``SHA256SUMS`` and the parts; ``bash unpack.sh`` there checks, joins and unpacks them and
prints the command that runs the suite (``ci/gpu/run.sh``, docs/gpu_harness.md).

What is not carried, and why, is declared in :data:`ON_MACHINE` (already on the GPU
machine) and :data:`NOT_CARRIED` (kernel packages vLLM imports lazily and the suite's
settings never reach). Resolution replaces both with empty stub wheels, so nothing that
depends on them pulls a second torch into the bundle.
"""
from __future__ import annotations

import argparse
import copy
import hashlib
import io
import json
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
LOCK = HERE / "lock.json"
WHEEL_CACHE = REPO / ".cache" / "vllm-wheels"  # shared with ci/tools/compat_tables.py
# One part a device call, carried beside the repository's tree (tracked files, about 20 MB since the recall kit's weights, 2026-12-02): a call carries at
# most 64 MiB in all, and 60 MiB parts stopped fitting on 2026-11-29 (tests/ci/test_gpu_harness.py checks the sum).
PART_MIB = 36
CARRY_LIMIT_MIB = 64

# On the GPU machine already, at these versions (the versions vLLM 0.20-0.26 pin).
ON_MACHINE = {"torch": "2.11.0", "triton": "3.6.0"}

# vLLM requirements left out of the bundle: imported lazily, and the suite's settings
# (VLLM_USE_FLASHINFER_SAMPLER=0, gdn_prefill_backend=triton, bf16/TurboQuant KV,
# no MLA, no video/audio input) never import them.
NOT_CARRIED = {
    "torchaudio": "audio input only",
    "torchcodec": "video/audio decoding only",
    "pynvvideocodec": "video decoding only",
    "flashinfer-python": "FlashInfer backends/sampler; the suite sets VLLM_USE_FLASHINFER_SAMPLER=0",
    "flashinfer-cubin": "FlashInfer kernels (see flashinfer-python)",
    "tilelang": "TileLang kernels (MLA/DeepSeek paths)",
    "tokenspeed-mla": "MLA kernels (DeepSeek paths)",
    "nvidia-cutlass-dsl": "CuTe DSL kernels (gdn_prefill_backend=cutedsl, FA4)",
    "quack-kernels": "CuTe DSL kernels (RMSNorm/GEMM alternatives)",
    "humming-kernels": "quantized GEMM kernels",
    "nvidia-cudnn-frontend": "cuDNN attention frontend",
    "fastsafetensors": "GPU-direct weight loading (load_format=fastsafetensors)",
    "nvtx": "profiling ranges",
}

# Carried beside vLLM's own closure: what run.sh needs that vLLM does not (the suite is pytest).
EXTRA = ("pytest",)

# Paths inside the vLLM wheel the suite never loads (prefixes), with the reason.
STRIP = {
    "vllm/third_party/deep_gemm": "DeepGEMM (FP8 block GEMM, MLA)",
    "vllm/vllm-rs": "the Rust front-end binary",
    "vllm/_flashmla_C": "FlashMLA (DeepSeek MLA)",
    "vllm/_flashmla_extension_C": "FlashMLA (DeepSeek MLA)",
}

MANYLINUX = [f"manylinux_2_{m}_x86_64" for m in (35, 34, 33, 32, 31, 30, 29, 28, 27, 26, 25, 24, 17, 12, 5)] + [
    "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]


def canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def pip(*args: str, python: str = sys.executable) -> subprocess.CompletedProcess:
    return subprocess.run([python, "-m", "pip", *args], check=True, text=True)


def interpreter(version: str) -> str:
    """A ``python<version>`` on PATH: pip evaluates environment markers (``python_version >
    "3.11"``) against the interpreter it runs in, not against ``--python-version``."""
    found = [shutil.which(f"python{version}")] + sorted(
        str(p) for p in Path.home().glob(f".pyenv/versions/{version}.*/bin/python{version}"))
    exe = next((e for e in found if e and subprocess.run([e, "-c", "import pip"],
                                                          capture_output=True).returncode == 0), None)
    if exe is None:
        raise SystemExit(f"lock for Python {version} needs python{version} on PATH (markers are "
                         f"evaluated by the running interpreter)")
    return exe


def target_flags(python: str) -> list[str]:
    flags = ["--only-binary=:all:", "--python-version", python, "--implementation", "cp"]
    for p in MANYLINUX:
        flags += ["--platform", p]
    return flags


# ---------------------------------------------------------------------------------- wheels

def stub_wheel(out_dir: Path, name: str, version: str) -> Path:
    """An empty wheel ``name==version+stub``: satisfies ``name==version`` pins, holds nothing."""
    dist = re.sub(r"[-.]+", "_", canon(name))
    ver = f"{version}+stub"
    info = f"{dist}-{ver}.dist-info"
    files = {f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {ver}\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: vllm-platform-ext\nRoot-Is-Purelib: true\n"
                              "Tag: py3-none-any\n"}
    files[f"{info}/RECORD"] = "".join(f"{n},,\n" for n in files) + f"{info}/RECORD,,\n"
    path = out_dir / f"{dist}-{ver}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for n, text in files.items():
            z.writestr(n, text)
    return path


def wheel_requirements(wheel: Path) -> list[str]:
    """The unconditional-extra ``Requires-Dist`` lines of a wheel's METADATA."""
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        lines = z.read(meta).decode().splitlines()
    return [l.split(":", 1)[1].strip() for l in lines
            if l.startswith("Requires-Dist:") and "extra ==" not in l]


def pinned_version(requirement: str) -> str | None:
    """``X`` of an ``==X`` / ``>=X`` specifier (the version a stub must claim), else None."""
    for op in ("==", ">="):
        m = re.search(re.escape(op) + r"\s*([0-9][0-9A-Za-z.]*)", requirement)
        if m:
            return m.group(1).rstrip(".")
    return None


def strip_wheel(src: Path, dst: Path, prefixes=tuple(STRIP)) -> list[str]:
    """Copy a wheel without the members under ``prefixes``; RECORD rewritten to match."""
    removed = []
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zout:
        record = next(n for n in zin.namelist() if n.endswith(".dist-info/RECORD"))
        for info in zin.infolist():
            if info.filename.startswith(prefixes):
                removed.append(info.filename)
                continue
            if info.filename == record:
                continue
            zout.writestr(info, zin.read(info.filename))
        kept = [l for l in zin.read(record).decode().splitlines()
                if l and not l.split(",", 1)[0].startswith(prefixes)]
        zout.writestr(record, "\n".join(kept) + "\n")
    return removed


def restore(src: Path, dst: Path, compression: int = zipfile.ZIP_STORED) -> None:
    """Copy a wheel's members unchanged into a zip of another compression (RECORD hashes are
    over the members' bytes, so the wheel stays valid)."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", compression) as zout:
        for info in zin.infolist():
            data = zin.read(info.filename)
            out = copy.copy(info)
            out.compress_type = compression
            zout.writestr(out, data)


# ------------------------------------------------------------------------------------ lock

def vllm_wheel(version: str) -> Path:
    WHEEL_CACHE.mkdir(parents=True, exist_ok=True)
    have = [p for p in WHEEL_CACHE.glob(f"vllm-{version}-*.whl")]
    if not have:
        pip("download", "--no-deps", "-q", "-d", str(WHEEL_CACHE), *target_flags("3.12"), f"vllm=={version}")
        have = list(WHEEL_CACHE.glob(f"vllm-{version}-*.whl"))
    if len(have) != 1:
        raise SystemExit(f"expected one vllm {version} wheel in {WHEEL_CACHE}, found {have}")
    return have[0]


def resolve(version: str, python: str) -> dict:
    """Resolve vLLM ``version``'s dependency closure for ``python`` on manylinux x86_64."""
    wheel = vllm_wheel(version)
    reqs = wheel_requirements(wheel)
    stubs = dict(ON_MACHINE)
    for r in reqs:
        name = canon(re.split(r"[\s;\[<>=!~]", r, 1)[0])
        if name in NOT_CARRIED or name in stubs:
            stubs.setdefault(name, pinned_version(r) or "0")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "stubs").mkdir()
        for name, ver in stubs.items():
            stub_wheel(tmp / "stubs", name, ver)
        (tmp / "constraints.txt").write_text("".join(f"{n}=={v}+stub\n" for n, v in stubs.items()))
        report = tmp / "report.json"
        pip("install", "--dry-run", "--ignore-installed", "-q", "--report", str(report),
            "--target", str(tmp / "t"), "--find-links", str(tmp / "stubs"),
            "-c", str(tmp / "constraints.txt"), *target_flags(python), str(wheel), *EXTRA,
            python=interpreter(python))
        data = json.loads(report.read_text())
    wheels = []
    for item in data["install"]:
        name, ver = canon(item["metadata"]["name"]), item["metadata"]["version"]
        if name == "vllm" or ver.endswith("+stub"):
            continue
        info = item["download_info"]
        digest = info.get("archive_info", {}).get("hashes", {}).get("sha256") or \
            info.get("archive_info", {}).get("hash", "").removeprefix("sha256=")
        wheels.append({"name": name, "version": ver, "file": info["url"].rsplit("/", 1)[-1],
                       "sha256": digest})
    wheels.sort(key=lambda w: w["name"])
    return {"vllm": {"version": version, "file": wheel.name, "sha256": sha256(wheel)},
            "python": python, "platforms": "manylinux x86_64, glibc <= 2.35",
            "on_machine": ON_MACHINE, "extra": list(EXTRA),
            "not_carried": {n: NOT_CARRIED[n] for n in sorted(stubs) if n in NOT_CARRIED},
            "stripped": STRIP, "wheels": wheels}


def lock_key(version: str, python: str) -> str:
    return f"vllm-{version}/py{python}"


def read_lock() -> dict:
    return json.loads(LOCK.read_text()) if LOCK.exists() else {}


def cmd_lock(args) -> int:
    lock = read_lock()
    entry = resolve(args.vllm, args.python)
    missing = [w["name"] for w in entry["wheels"] if not w["sha256"]]
    for w in entry["wheels"]:  # the index gave no hash: download once and hash the file
        if not w["sha256"]:
            with tempfile.TemporaryDirectory() as tmp:
                pip("download", "--no-deps", "-q", "-d", tmp, *target_flags(args.python),
                    f"{w['name']}=={w['version']}")
                w["sha256"] = sha256(next(Path(tmp).iterdir()))
    lock[lock_key(args.vllm, args.python)] = entry
    LOCK.write_text(json.dumps(dict(sorted(lock.items())), indent=1) + "\n")
    print(f"locked {lock_key(args.vllm, args.python)}: {len(entry['wheels'])} wheels "
          f"({len(missing)} hashed locally) -> {LOCK.relative_to(REPO)}")
    return 0


# ----------------------------------------------------------------------------------- build

def split_file(path: Path, out_dir: Path, part_bytes: int) -> list[Path]:
    parts = []
    with open(path, "rb") as f:
        i = 0
        while chunk := f.read(part_bytes):
            p = out_dir / f"{path.name}.part{i:02d}"
            p.write_bytes(chunk)
            parts.append(p)
            i += 1
    return parts


UNPACK_SH = """#!/usr/bin/env bash
# Check, join and unpack this bundle (written by ci/gpu/bundle.py build). Usage: bash unpack.sh [DEST]
set -euo pipefail
cd "$(dirname "$0")"
sha256sum -c --quiet SHA256SUMS
dest="${1:-$PWD/unpacked}"
mkdir -p "$dest"
cat %(name)s.part* | xz -d | tar -x -C "$dest"
echo "unpacked to $dest; run the suite with:"
echo "  bash $dest/project/ci/gpu/run.sh --wheels $dest/wheels --suite core"
"""


def _head_archive(prefix: str) -> bytes:
    return subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", f"--prefix={prefix}", "HEAD"],
                          check=True, capture_output=True).stdout


def project_tar(tar: tarfile.TarFile) -> None:
    """This project's committed tree (``git archive HEAD``) under ``project/``."""
    with tarfile.open(fileobj=io.BytesIO(_head_archive("project/"))) as src:
        for m in src.getmembers():
            tar.addfile(m, src.extractfile(m) if m.isfile() else None)


def project_wheel(out_dir: Path) -> Path:
    """A wheel of the committed tree: installs offline with ``--no-deps`` and no build backend on
    the GPU machine, and carries the entry points through which vLLM loads the plugin."""
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(fileobj=io.BytesIO(_head_archive("src/"))) as src:
            src.extractall(tmp, filter="data")
        pip("wheel", "--no-deps", "-q", "-w", str(out_dir), str(Path(tmp) / "src"))
    (wheel,) = out_dir.glob("vllm_platform_ext-*.whl")
    return wheel


def pack(out: Path, wheels: list[Path], name: str, level: int = 6, project: bool = True,
         part_bytes: int = PART_MIB << 20) -> list[Path]:
    """``wheels`` (under ``wheels/``) and this project's tree (under ``project/``) as one
    ``name.tar.xz`` cut into ``PART_MIB`` parts in ``out``, with ``SHA256SUMS`` and ``unpack.sh``."""
    packed = out / f"{name}.tar.xz"
    with tempfile.TemporaryDirectory() as tmp:
        tar_path = Path(tmp) / "bundle.tar"
        with tarfile.open(tar_path, "w") as tar:
            for f in wheels:  # stored (uncompressed) zips: xz packs their libraries far better
                stored = Path(tmp) / f.name
                restore(f, stored)
                tar.add(stored, arcname=f"wheels/{f.name}")
                stored.unlink()
            if project:
                project_tar(tar)
        with open(packed, "wb") as f:
            subprocess.run(["xz", "-T0", f"-{level}", "-c", str(tar_path)], check=True, stdout=f)
    parts = split_file(packed, out, part_bytes)
    packed.unlink()
    (out / "unpack.sh").write_text(UNPACK_SH % {"name": packed.name})
    (out / "SHA256SUMS").write_text("".join(f"{sha256(p)}  {p.name}\n" for p in parts))
    return parts


def cmd_build(args) -> int:
    key = lock_key(args.vllm, args.python)
    entry = read_lock().get(key)
    if entry is None:
        raise SystemExit(f"{key} is not in {LOCK}; run: python ci/gpu/bundle.py lock --vllm {args.vllm} "
                         f"--python {args.python}")
    have = {}
    if args.have:  # `pip freeze` of the GPU machine: what is there already is not carried
        for line in Path(args.have).read_text().splitlines():
            if "==" in line:
                n, v = line.split("==", 1)
                have[canon(n)] = v.strip()
    out = Path(args.out or REPO / ".carry" / f"gpu-{args.vllm}-py{args.python}")
    shutil.rmtree(out, ignore_errors=True)
    (out / "dl").mkdir(parents=True)
    wheel = vllm_wheel(args.vllm)
    if sha256(wheel) != entry["vllm"]["sha256"]:
        raise SystemExit(f"{wheel.name}: sha256 differs from the lock")
    carried = [w for w in entry["wheels"] if have.get(w["name"]) != w["version"]]
    spec = [f"{w['name']}=={w['version']}" for w in carried]
    if spec:
        pip("download", "--no-deps", "-q", "-d", str(out / "dl"), *target_flags(args.python), *spec)
    by_file = {w["file"]: w for w in carried}
    for f in (out / "dl").iterdir():
        w = by_file.get(f.name)
        if w is None or sha256(f) != w["sha256"]:
            raise SystemExit(f"{f.name}: not the locked file (name or sha256 differs)")
    if len(list((out / "dl").iterdir())) != len(carried):
        raise SystemExit("download is missing locked wheels")
    stripped = out / "dl" / wheel.name
    removed = strip_wheel(wheel, stripped)
    project_wheel(out / "dl")
    name = f"gpu-bundle-vllm-{args.vllm}-py{args.python}"
    files = sorted((out / "dl").iterdir())
    parts = pack(out, files, name, args.level)
    shutil.rmtree(out / "dl")
    manifest = {"key": key, "lock": entry, "files": [f.name for f in files], "carried": [w["name"] for w in carried],
                "already_on_machine": sorted(set(w["name"] for w in entry["wheels"]) - set(
                    w["name"] for w in carried)),
                "stripped_members": len(removed),
                "parts": [{"file": p.name, "bytes": p.stat().st_size} for p in parts],
                "project_commit": subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"],
                                                 capture_output=True, text=True).stdout.strip()}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    total = sum(p.stat().st_size for p in parts)
    print(f"{out}: {len(parts)} parts, {total / 2**20:.0f} MiB, {len(files)} wheels: vLLM (stripped of "
          f"{len(removed)} files), {len(carried)} locked, this project's")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("lock", "build"):
        p = sub.add_parser(name)
        p.add_argument("--vllm", required=True, help="vLLM version, e.g. 0.23.0")
        p.add_argument("--python", required=True, help="the GPU machine's Python, e.g. 3.12")
        if name == "build":
            p.add_argument("--out", help="bundle folder (default .carry/gpu-VLLM-pyPY)")
            p.add_argument("--have", help="pip freeze of the GPU machine: wheels it has are not carried")
            p.add_argument("--level", type=int, default=6, help="xz level")
    args = ap.parse_args(argv)
    return {"lock": cmd_lock, "build": cmd_build}[args.cmd](args)


if __name__ == "__main__":
    raise SystemExit(main())
