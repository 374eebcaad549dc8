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

A line whose torch pin is not the machine's (0.32: 2.13.0, 0.33: 2.14.0) carries its torch and
Triton, and of the CUDA wheels that torch requires only those the machine's own cannot serve:
``ci/gpu/cuda_libs.py`` decides from the libraries' sonames and dynamic symbols (and torch's
runtime version rules), the lock records each decision with its reason, and the served ones
are stubbed like ``ON_MACHINE``. ``wheels/bundle-pins.json`` names the carried torch and Triton:
on the machine ``machine_venv.py`` makes them the run venv's, links the machine's CUDA
libraries where the carried torch looks for them, and fails unless the pins are what imports.
"""
from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cuda_libs  # noqa: E402  (ci/gpu/cuda_libs.py: the CUDA library decision)
import wheelfiles  # noqa: E402
from wheelfiles import canon, pinned_version, restore, stub_wheel, wheel_requirements  # noqa: E402,F401

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
LOCK = HERE / "lock.json"
WHEEL_CACHE = REPO / ".cache" / "vllm-wheels"  # shared with ci/tools/compat_tables.py
CUDA_CACHE = REPO / ".cache" / "gpu-wheels"  # torch / CUDA / consumer wheels read by the CUDA decision
PINS = "bundle-pins.json"  # under wheels/: the torch and Triton a bundle carries (machine_venv.py checks them)
# One part a device call, carried beside the repository's tree (tracked files, about 20 MB since the recall kit's weights, 2026-12-02): a call carries at
# most 64 MiB in all, and 60 MiB parts stopped fitting on 2026-11-29 (tests/ci/test_gpu_harness.py checks the sum).
# 34 since 2026-12-07: the tree passed 27 MiB (4 KiB blocks), and a 36 MiB part no longer fits beside it; 32 since
# window 12's results (the tree at 29.5 MiB): two MiB of room for the next records (a 0.31.0 bundle: 36 parts, not 34).
PART_MIB = 32
CARRY_LIMIT_MIB = 64

# On the GPU machine already, at these versions (the versions vLLM 0.20-0.26 pin), with the CUDA
# wheels torch 2.11.0 requires (its pip closure: the cuda-toolkit 13.0.2 components, cuDNN, NCCL, ...).
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
# Kept although large, with the reason (tests/ci/test_gpu_bundle_strip.py checks each line's own code): FlashAttention 2
# (~300 MB unpacked, ~110 MiB at xz -1). Stripped from 12324e4 on ("Hopper takes FA3"), until window 11 (2026-12-07):
# every TurboQuant engine of the rebuilt 0.26.0 bundle died at its first prefill, "'_vllm_fa2_C' object has no
# attribute 'varlen_fwd'", because 0.23, 0.26 and 0.33 override flash_attn_version to 2 for a TurboQuant KV cache.
KEPT = {
    "vllm/vllm_flash_attn/_vllm_fa2_C": "vllm/engine/arg_utils.py: a TurboQuant KV cache overrides flash_attn_version "
                                        "to 2 (\"not yet compatible with FlashAttention >= 3\"): its prefill and "
                                        "continuation rows call FA2's varlen_fwd",
}
# Paths inside other carried wheels the suite never loads on a Hopper GPU (prefixes), with the reason.
STRIP_WHEELS = {
    "triton": {
        "triton/backends/nvidia/lib/cupti/libcupti_static.a": "static archives: linked by nothing at run time",
        "triton/backends/nvidia/lib/cupti/libnvperf_host_static.a": "static archives: linked by nothing at run time",
        "triton/backends/nvidia/lib/cupti-blackwell/": "Proton's CUPTI for Blackwell (sm_100+)",
        "triton/backends/nvidia/bin/ptxas-blackwell": "ptxas for Blackwell (sm_100+); Hopper uses bin/ptxas",
    },
}

# CUDA wheels a carried torch needs that cuda_libs.decide() refuses on a runtime rule alone (the
# machine's library defines every symbol the carried binaries take, so torch imports and links): left
# to the machine when the suite never reaches the rule, with the reason. Torch raises at the first
# call that does ("cuDNN version incompatibility"), never computes with the older library silently.
CUDA_LEFT_ON_MACHINE = {
    "nvidia-cudnn-cu13": "the suite makes no cuDNN call (text models with language_model_only; GDN's conv "
                         "and attention run in Triton / FlashAttention), and torch raises at the first one: "
                         "carrying cuDNN 9.24 costs 473 MiB (13 parts) at xz -1",
}

MANYLINUX = [f"manylinux_2_{m}_x86_64" for m in range(35, 4, -1)] + [  # pip matches N exactly (NCCL: 2_18)
    "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]


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

def strip_wheel(src: Path, dst: Path, prefixes=tuple(STRIP)) -> list[str]:
    return wheelfiles.strip_wheel(src, dst, prefixes)


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


def dry_run(requirements: list[str], python: str, stubs: dict) -> list[dict]:
    """pip's resolution (``--dry-run --report``) of ``requirements`` for ``python`` on manylinux
    x86_64, with ``stubs`` (name -> version) replaced by empty ``version+stub`` wheels."""
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "stubs").mkdir()
        for name, ver in stubs.items():
            stub_wheel(tmp / "stubs", name, ver)
        (tmp / "constraints.txt").write_text("".join(f"{n}=={v}+stub\n" for n, v in stubs.items()))
        report = tmp / "report.json"
        pip("install", "--dry-run", "--ignore-installed", "-q", "--report", str(report),
            "--target", str(tmp / "t"), "--find-links", str(tmp / "stubs"),
            "-c", str(tmp / "constraints.txt"), *target_flags(python), *requirements,
            python=interpreter(python))
        return json.loads(report.read_text())["install"]


def locked(item: dict) -> dict:
    """A lock row (name, version, file, sha256) of one item of pip's report."""
    info = item["download_info"]
    digest = info.get("archive_info", {}).get("hashes", {}).get("sha256") or \
        info.get("archive_info", {}).get("hash", "").removeprefix("sha256=")
    return {"name": canon(item["metadata"]["name"]), "version": item["metadata"]["version"],
            "file": info["url"].rsplit("/", 1)[-1], "sha256": digest}


def torch_pin(requirements: list[str]) -> str | None:
    """The ``torch==X`` a vLLM wheel pins, else None."""
    for r in requirements:
        if canon(re.split(r"[\s;\[<>=!~]", r, 1)[0]) == "torch" and "==" in r:
            return pinned_version(r)
    return None


def fetch(row: dict, python: str) -> Path:
    """The locked wheel ``row`` in :data:`CUDA_CACHE` (downloaded once, sha256 checked)."""
    CUDA_CACHE.mkdir(parents=True, exist_ok=True)
    path = CUDA_CACHE / row["file"]
    if not path.exists():
        pip("download", "--no-deps", "-q", "-d", str(CUDA_CACHE), *target_flags(python), f"{row['name']}=={row['version']}")
    if sha256(path) != row["sha256"]:
        raise SystemExit(f"{path}: sha256 differs from the index's {row['sha256']}")
    return path


def cuda_closure(torch_version: str, python: str) -> dict:
    """name -> lock row of the CUDA packages (``nvidia-*``, ``cuda-*``) pip installs with torch."""
    rows = [locked(i) for i in dry_run([f"torch=={torch_version}"], python, {})]
    return {r["name"]: r for r in rows if r["name"].startswith(cuda_libs.CUDA_PREFIXES)}


def cuda_decision(torch_version: str, consumers: list, python: str) -> tuple[dict, dict]:
    """The CUDA packages torch ``torch_version`` needs (name -> lock row) and, for each, whether
    the machine's (torch ``ON_MACHINE`` 's closure) serves it (:func:`cuda_libs.decide`), read
    from the libraries of both versions and of ``consumers`` (the carried wheels that link them)."""
    need, have = cuda_closure(torch_version, python), cuda_closure(ON_MACHINE["torch"], python)
    differ = [n for n in need if n in have and have[n]["version"] != need[n]["version"]]
    new_libs = {n: cuda_libs.wheel_elfs(fetch(need[n], python)) for n in differ}
    old_libs = {n: cuda_libs.wheel_elfs(fetch(have[n], python)) for n in differ}
    users = [e for w in consumers for e in cuda_libs.wheel_elfs(w)]
    decisions = cuda_libs.decide({n: r["version"] for n, r in need.items()},
                                 {n: r["version"] for n, r in have.items()}, new_libs, old_libs, users)
    return need, {n: d.as_dict() for n, d in decisions.items()}


def links_cuda(item: dict) -> bool:
    """Whether a wheel of pip's report may link torch's CUDA libraries: it is torch, or it requires
    torch or a CUDA package (torchvision, vLLM, ...)."""
    reqs = item["metadata"].get("requires_dist") or []
    names = {canon(re.split(r"[\s;\[<>=!~(]", r, 1)[0]) for r in reqs if "extra ==" not in r}
    return canon(item["metadata"]["name"]) == "torch" or "torch" in names or any(
        n.startswith(cuda_libs.CUDA_PREFIXES) for n in names)


def resolve(version: str, python: str) -> dict:
    """Resolve vLLM ``version``'s dependency closure for ``python`` on manylinux x86_64."""
    wheel = vllm_wheel(version)
    reqs = wheel_requirements(wheel)
    pin = torch_pin(reqs)
    carry_torch = pin is not None and pin != ON_MACHINE["torch"]
    stubs = {} if carry_torch else dict(ON_MACHINE)
    need = cuda_closure(pin, python) if carry_torch else {}
    stubs.update({n: r["version"] for n, r in need.items()})  # decided below, one by one
    for r in reqs:
        name = canon(re.split(r"[\s;\[<>=!~]", r, 1)[0])
        if name in NOT_CARRIED or name in stubs:
            stubs.setdefault(name, pinned_version(r) or "0")
    items = [i for i in dry_run([str(wheel), *EXTRA], python, stubs)
             if canon(i["metadata"]["name"]) != "vllm" and not i["metadata"]["version"].endswith("+stub")]
    wheels = [locked(i) for i in items]
    on_machine, cuda = dict(ON_MACHINE), None
    if carry_torch:
        consumers = [wheel] + [fetch(locked(i), python) for i in items if links_cuda(i)]
        need, cuda = cuda_decision(pin, consumers, python)
        for n, d in cuda.items():
            if not d["served"] and d.get("rule_only") and n in CUDA_LEFT_ON_MACHINE:
                d["left_on_machine"] = CUDA_LEFT_ON_MACHINE[n]
        wheels += [need[n] for n, d in cuda.items() if not d["served"] and "left_on_machine" not in d]
        on_machine = {n: d["machine"] for n, d in cuda.items() if d["served"] or "left_on_machine" in d}
    wheels.sort(key=lambda w: w["name"])
    entry = {"vllm": {"version": version, "file": wheel.name, "sha256": sha256(wheel)},
             "python": python, "platforms": "manylinux x86_64, glibc <= 2.35",
             "on_machine": on_machine, "extra": list(EXTRA),
             "not_carried": {n: NOT_CARRIED[n] for n in sorted(stubs) if n in NOT_CARRIED},
             "stripped": {**STRIP, **{f"{n}:{p}": r for n, ps in STRIP_WHEELS.items() for p, r in ps.items()}},
             "wheels": wheels}
    if carry_torch:
        entry["carries_torch"] = {"torch": pin, "machine_torch": ON_MACHINE["torch"], "cuda": cuda}
    return entry


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


def tree_bytes(repo: Path = REPO) -> int:
    """The tracked files a device call sends beside a part, as the device counts them (4 KiB blocks)."""
    files = subprocess.run(["git", "-C", str(repo), "ls-files", "-z"], check=True, capture_output=True).stdout
    return sum(-(-(repo / f).stat().st_size // 4096) * 4096 for f in files.decode().split("\0")
               if f and (repo / f).is_file())


def max_part_mib(tree: int) -> int:
    """The largest part (MiB) that fits one call beside ``tree`` bytes and 1 MiB of small files."""
    return ((CARRY_LIMIT_MIB << 20) - tree - (1 << 20)) >> 20


def resplit(out: Path, part_bytes: int) -> list[Path]:
    """Cut a built bundle's parts again at ``part_bytes`` (checked against SHA256SUMS first; the
    archive is not compressed again): SHA256SUMS and manifest.json follow."""
    sums = [l.split() for l in (out / "SHA256SUMS").read_text().splitlines() if l.strip()]
    for digest, name in sums:
        if sha256(out / name) != digest:
            raise SystemExit(f"{out / name}: sha256 differs from SHA256SUMS")
    joined = out / sums[0][1].rsplit(".part", 1)[0]
    with open(joined, "wb") as f:
        for _, name in sums:
            f.write((out / name).read_bytes())
            (out / name).unlink()
    parts = split_file(joined, out, part_bytes)
    joined.unlink()
    (out / "SHA256SUMS").write_text("".join(f"{sha256(p)}  {p.name}\n" for p in parts))
    if (out / "manifest.json").is_file():
        manifest = json.loads((out / "manifest.json").read_text())
        manifest["parts"] = [{"file": p.name, "bytes": p.stat().st_size} for p in parts]
        (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return parts


UNPACK_SH = (HERE / "unpack.sh.in").read_text()  # the bundle's unpack.sh (``%(name)s``: the archive)


def _head_archive(prefix: str, commit: str = "HEAD") -> bytes:
    return subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", f"--prefix={prefix}", commit],
                          check=True, capture_output=True).stdout


def project_tar(tar: tarfile.TarFile, commit: str = "HEAD") -> None:
    """This project's committed tree (``git archive HEAD``) under ``project/``."""
    with tarfile.open(fileobj=io.BytesIO(_head_archive("project/", commit))) as src:
        for m in src.getmembers():
            tar.addfile(m, src.extractfile(m) if m.isfile() else None)


def project_wheel(out_dir: Path, commit: str = "HEAD") -> Path:
    """A wheel of the committed tree: installs offline with ``--no-deps`` and no build backend on
    the GPU machine, and carries the entry points through which vLLM loads the plugin."""
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(fileobj=io.BytesIO(_head_archive("src/", commit))) as src:
            src.extractall(tmp, filter="data")
        pip("wheel", "--no-deps", "-q", "-w", str(out_dir), str(Path(tmp) / "src"))
    (wheel,) = out_dir.glob("vllm_platform_ext-*.whl")
    return wheel


def pack(out: Path, wheels: list[Path], name: str, level: int = 6, project: bool = True,
         part_bytes: int = PART_MIB << 20, files: dict | None = None, commit: str = "HEAD") -> list[Path]:
    """``wheels`` (under ``wheels/``), ``files`` (arcname -> bytes) and this project's tree (under
    ``project/``) as one ``name.tar.xz`` cut into ``PART_MIB`` parts in ``out``, with ``SHA256SUMS``
    and ``unpack.sh``."""
    packed = out / f"{name}.tar.xz"
    with tempfile.TemporaryDirectory() as tmp:
        tar_path = Path(tmp) / "bundle.tar"
        with tarfile.open(tar_path, "w") as tar:
            for f in wheels:  # stored (uncompressed) zips: xz packs their libraries far better
                stored = Path(tmp) / f.name
                restore(f, stored)
                tar.add(stored, arcname=f"wheels/{f.name}")
                stored.unlink()
            for arcname, data in (files or {}).items():
                info = tarfile.TarInfo(arcname)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            if project:
                project_tar(tar, commit)
        with open(packed, "wb") as f:
            subprocess.run(["xz", "-T0", f"-{level}", "-c", str(tar_path)], check=True, stdout=f)
    parts = split_file(packed, out, part_bytes)
    packed.unlink()
    (out / "unpack.sh").write_text(UNPACK_SH % {"name": packed.name})
    (out / "SHA256SUMS").write_text("".join(f"{sha256(p)}  {p.name}\n" for p in parts))
    return parts


def bundle_pins(entry: dict, wheel_dir: Path) -> dict | None:
    """What ``wheels/bundle-pins.json`` says for a lock entry that carries torch: the torch version,
    its CUDA (``torch/version.py`` of the carried wheel) and the Triton version."""
    if "carries_torch" not in entry:
        return None
    rows = {w["name"]: w for w in entry["wheels"]}
    with zipfile.ZipFile(wheel_dir / rows["torch"]["file"]) as z:
        m = re.search(r"^cuda: .*= '([0-9.]+)'", z.read("torch/version.py").decode(), re.M)
    return {"torch": rows["torch"]["version"], "torch_cuda": m.group(1) if m else None,
            "triton": rows["triton"]["version"], "vllm": entry["vllm"]["version"]}


def cmd_build(args) -> int:
    key = lock_key(args.vllm, args.python)
    entry = read_lock().get(key)
    check_part_mib(args.part_mib)
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], check=True, capture_output=True,
                            text=True).stdout.strip()  # the project's tree and wheel: this commit, whatever HEAD does next
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
    for w in carried:  # wheels the lock's CUDA decision already fetched
        if (CUDA_CACHE / w["file"]).is_file():
            try:
                os.link(CUDA_CACHE / w["file"], out / "dl" / w["file"])
            except OSError:
                shutil.copy(CUDA_CACHE / w["file"], out / "dl" / w["file"])
    spec = [f"{w['name']}=={w['version']}" for w in carried if not (out / "dl" / w["file"]).exists()]
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
    for w in carried:
        if w["name"] in STRIP_WHEELS:  # stripped in place (the sha256 above was the locked file's)
            f = out / "dl" / w["file"]
            tmp = f.with_suffix(".stripping")
            removed += strip_wheel(f, tmp, tuple(STRIP_WHEELS[w["name"]]))
            f.unlink()
            tmp.rename(f)
    if not args.no_project:
        project_wheel(out / "dl", commit)
    name = f"gpu-bundle-vllm-{args.vllm}-py{args.python}"
    files = sorted((out / "dl").iterdir())
    pins = bundle_pins(entry, out / "dl")
    t0 = time.monotonic()
    parts = pack(out, files, name, args.level, project=not args.no_project, part_bytes=args.part_mib << 20, commit=commit, files={f"wheels/{PINS}": json.dumps(pins, indent=1).encode()} if pins else None)
    shutil.rmtree(out / "dl")
    manifest = {"key": key, "lock": entry, "files": [f.name for f in files], "carried": [w["name"] for w in carried],
                "already_on_machine": sorted(set(w["name"] for w in entry["wheels"]) - set(
                    w["name"] for w in carried)),
                "stripped_members": len(removed), "xz_level": args.level,
                "pack_seconds": round(time.monotonic() - t0), "pins": pins,
                "parts": [{"file": p.name, "bytes": p.stat().st_size} for p in parts],
                "project_commit": None if args.no_project else commit}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    total = sum(p.stat().st_size for p in parts)
    print(f"{out}: {len(parts)} parts, {total / 2**20:.0f} MiB, {len(files)} wheels: vLLM (stripped of "
          f"{len(removed)} files), {len(carried)} locked{'' if args.no_project else ', this project'}; xz -{args.level} packed in "
          f"{manifest['pack_seconds']} s")
    return 0


def check_part_mib(part_mib: int) -> None:
    room = max_part_mib(tree_bytes())
    if part_mib > room:
        raise SystemExit(f"parts of {part_mib} MiB do not fit one call beside this tree ({tree_bytes() / 2**20:.1f} "
                         f"MiB, 4 KiB blocks) and 1 MiB of small files: at most {room}")


def cmd_split(args) -> int:
    check_part_mib(args.part_mib)
    parts = resplit(Path(args.out), args.part_mib << 20)
    print(f"{args.out}: {len(parts)} parts of at most {args.part_mib} MiB")
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
            p.add_argument("--part-mib", type=int, default=PART_MIB, help="part size (MiB; checked against the tree)")
            p.add_argument("--no-project", action="store_true",
                           help="leave out this project's tree and wheel (every device call sends the tree; the wheel "
                                "is built there: see unpack.sh): about 26 MiB less at xz -1")
    p = sub.add_parser("split", help="cut a built bundle's parts again at another size (no recompression)")
    p.add_argument("--out", required=True, help="the bundle folder")
    p.add_argument("--part-mib", type=int, required=True)
    args = ap.parse_args(argv)
    return {"lock": cmd_lock, "build": cmd_build, "split": cmd_split}[args.cmd](args)


if __name__ == "__main__":
    raise SystemExit(main())
