"""A bundle that carries its own torch (vLLM lines whose torch is not the GPU machine's, issue 52):
a tiny synthetic bundle with fake torch / Triton / CUDA wheels goes through the same code as the
real one (bundle.bundle_pins, bundle.pack, unpack.sh, run.sh --do check, machine_venv.py) against a
stand-in machine venv holding another torch and Triton and the machine's nvidia/ tree."""
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from conftest import REPO, load_tool

bundle = load_tool("ci/gpu/bundle.py")


def _wheel(out: Path, dist: str, version: str, files: dict) -> Path:
    info = f"{dist}-{version}.dist-info"
    files = dict(files)
    files[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n"
    files[f"{info}/WHEEL"] = "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    files[f"{info}/RECORD"] = "".join(f"{n},,\n" for n in files) + f"{info}/RECORD,,\n"
    path = out / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for n, d in files.items():
            z.writestr(n, d)
    return path


def _torch_files(version: str, cuda: str) -> dict:
    return {"torch/__init__.py": f"__version__ = '{version}'\nfrom . import version\n"
                                 "class cuda:\n    is_available = staticmethod(lambda: False)\n",
            "torch/version.py": f"from typing import Optional\n__version__ = '{version}'\ncuda: Optional[str] = '{cuda}'\n"}


def _machine(tmp_path: Path) -> tuple[Path, Path]:
    """A machine interpreter that is a venv holding torch 2.11.0+cu130, Triton 3.6.0 and an nvidia/ tree."""
    machine = tmp_path / "opt" / "torch" / ".venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(machine)], check=True)
    site = Path(subprocess.run([str(machine / "bin" / "python3"), "-c",
                                "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    for rel, text in {**_torch_files("2.11.0+cu130", "13.0"), "triton/__init__.py": "__version__ = '3.6.0'\n",
                      "nvidia/cu13/lib/libcublas.so.13": "machine cublas 13.1.0\n",
                      "nvidia/nccl/lib/libnccl.so.2": "machine nccl 2.28.9\n"}.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(text)
    return machine, site


def test_bundle_carrying_torch_packs_unpacks_and_resolves_the_carried_torch_and_triton(tmp_path):
    wheels = tmp_path / "dl"
    wheels.mkdir()
    payload = os.urandom(3 << 19)  # 1.5 MiB, incompressible: the archive spans parts of 1 MiB
    files = [_wheel(wheels, "torch", "2.14.0", _torch_files("2.14.0+cu130", "13.0")),
             _wheel(wheels, "triton", "3.8.0", {"triton/__init__.py": "__version__ = '3.8.0'\n"}),
             _wheel(wheels, "nvidia_nccl_cu13", "2.30.7", {"nvidia/nccl/lib/libnccl.so.2": payload}),
             _wheel(wheels, "vllm", "0.33.0", {"vllm/__init__.py": "__version__ = '0.33.0'\n"}),
             _wheel(wheels, "vllm_platform_ext", "0.1.0", {"vllm_platform_ext/__init__.py": ""})]
    entry = {"vllm": {"version": "0.33.0"}, "carries_torch": {"torch": "2.14.0"},
             "wheels": [{"name": "torch", "version": "2.14.0", "file": files[0].name},
                        {"name": "triton", "version": "3.8.0", "file": files[1].name}]}
    pins = bundle.bundle_pins(entry, wheels)
    assert pins == {"torch": "2.14.0", "torch_cuda": "13.0", "triton": "3.8.0", "vllm": "0.33.0"}
    assert bundle.bundle_pins({k: v for k, v in entry.items() if k != "carries_torch"}, wheels) is None
    out = tmp_path / "bundle"
    out.mkdir()
    parts = bundle.pack(out, files, "gpu-bundle-t", level=0, project=False, part_bytes=1 << 20,
                        files={f"wheels/{bundle.PINS}": json.dumps(pins).encode()})
    assert len(parts) == 2 and all(p.stat().st_size <= 1 << 20 for p in parts)
    assert [l.split()[1] for l in (out / "SHA256SUMS").read_text().splitlines()] == [p.name for p in parts]
    dest = tmp_path / "b"
    proc = subprocess.run(["bash", str(out / "unpack.sh"), str(dest)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((dest / "wheels" / bundle.PINS).read_text()) == pins
    shutil.copytree(os.path.join(REPO, "ci", "gpu"), dest / "project" / "ci" / "gpu")  # this tree's run.sh
    machine, msite = _machine(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHON", "PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{machine / 'bin'}:{env['PATH']}"
    run = ["bash", str(dest / "project" / "ci" / "gpu" / "run.sh"), "--wheels", str(dest / "wheels"), "--do", "check"]
    proc = subprocess.run(run, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    vsite = Path(subprocess.run([str(dest / "venv" / "bin" / "python"), "-c",
                                 "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                capture_output=True, text=True, check=True).stdout.strip())
    assert f"torch 2.14.0+cu130 from {os.path.realpath(vsite)}/torch/__init__.py" in proc.stdout
    assert "carried torch 2.14.0+cu130 (CUDA 13.0), triton 3.8.0: the pins of vLLM 0.33.0" in proc.stdout
    assert "torch 2.14.0+cu130 cuda 13.0 device none; triton 3.8.0; vllm 0.33.0" in proc.stdout  # run.sh's line
    cublas, nccl = vsite / "nvidia/cu13/lib/libcublas.so.13", vsite / "nvidia/nccl/lib/libnccl.so.2"
    assert cublas.is_symlink() and cublas.resolve() == (msite / "nvidia/cu13/lib/libcublas.so.13").resolve()
    assert not nccl.is_symlink() and nccl.read_bytes() == payload  # the carried NCCL wins over the machine's
    # the machine's torch still imports in its own interpreter (the float32 reference runs there)
    assert subprocess.run([str(machine / "bin" / "python3"), "-c", "import torch; print(torch.__version__)"],
                          capture_output=True, text=True, env=env).stdout.strip() == "2.11.0+cu130"

    # pins that are not what imports: the check fails by name
    (dest / "wheels" / bundle.PINS).write_text(json.dumps({**pins, "torch": "2.13.0"}))
    proc = subprocess.run(run, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode != 0
    assert "the bundle carries torch 2.13.0 but the run venv imports torch 2.14.0+cu130" in proc.stderr
    (dest / "wheels" / bundle.PINS).write_text(json.dumps({**pins, "torch_cuda": "12.8"}))
    proc = subprocess.run(run, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode != 0 and "reports CUDA 13.0, the bundle pins 12.8" in proc.stderr
    # without pins (a bundle that relies on the machine's torch) a carried torch is refused, as before
    (dest / "wheels" / bundle.PINS).unlink()
    proc = subprocess.run(run, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode != 0 and "a carried wheel shadows it" in proc.stderr


def test_unpack_follow_unpacks_parts_as_they_arrive_whole_and_wait_reports(tmp_path):
    """``unpack.sh --follow`` runs in its own session and feeds each part to xz once it is there whole
    (a half-copied part is waited for), so unpacking overlaps the carrying; ``--wait`` returns when it
    is done and fails, with the log, when a part never arrives."""
    import time

    payload = os.urandom(5 << 19)  # 2.5 MiB: three 1 MiB parts
    whl = _wheel(tmp_path, "big", "1", {"big/data.bin": payload})
    out = tmp_path / "bundle"
    out.mkdir()
    parts = bundle.pack(out, [whl], "gpu-bundle-t", level=0, project=False, part_bytes=1 << 20)
    assert len(parts) == 3
    machine = tmp_path / "p"  # the machine's staging folder: unpack.sh and SHA256SUMS come first
    machine.mkdir()
    for f in ("unpack.sh", "SHA256SUMS"):
        shutil.copy(out / f, machine / f)
    dest = tmp_path / "b"
    proc = subprocess.run(["bash", str(machine / "unpack.sh"), "--follow", str(dest)], capture_output=True, text=True,
                          timeout=30)
    assert proc.returncode == 0 and "in the background" in proc.stdout, proc.stderr
    (machine / parts[0].name).write_bytes(parts[0].read_bytes()[:1000])  # a copy under way
    time.sleep(1.5)
    assert not (dest / ".unpack-done").exists()
    for p in parts:
        shutil.copy(p, machine / p.name)
        time.sleep(0.2)
    proc = subprocess.run(["bash", str(machine / "unpack.sh"), "--wait", str(dest), "60"], capture_output=True,
                          text=True, timeout=90)
    assert proc.returncode == 0, proc.stderr
    with zipfile.ZipFile(dest / "wheels" / whl.name) as z:
        assert z.read("big/data.bin") == payload
    # a part that never comes whole: --wait gives up with the reason
    (machine / parts[2].name).write_bytes(b"x")
    dest2 = tmp_path / "b2"
    subprocess.run(["bash", str(machine / "unpack.sh"), "--follow", str(dest2)], check=True, capture_output=True)
    proc = subprocess.run(["bash", str(machine / "unpack.sh"), "--wait", str(dest2), "3"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode != 0 and "not unpacked after 3 s (stopped)" in proc.stderr
    pid = int((dest2 / ".unpack-pid").read_text())
    for _ in range(50):  # the follower's session is gone with it
        if subprocess.run(["kill", "-0", str(pid)], capture_output=True).returncode != 0:
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"the follower {pid} outlived --wait")


def test_resplit_cuts_the_same_archive_again_and_refuses_a_bad_part(tmp_path):
    """``bundle.py split``: the parts of a built bundle joined (each checked against SHA256SUMS) and cut
    again at another size without compressing again; SHA256SUMS and manifest.json follow, unpack works."""
    payload = os.urandom(5 << 19)
    whl = _wheel(tmp_path, "big", "1", {"big/data.bin": payload})
    out = tmp_path / "bundle"
    out.mkdir()
    parts = bundle.pack(out, [whl], "gpu-bundle-t", level=0, project=False, part_bytes=1 << 20)
    (out / "manifest.json").write_text(json.dumps({"parts": []}))
    joined = b"".join(p.read_bytes() for p in parts)
    new = bundle.resplit(out, 2 << 20)
    assert len(parts) == 3 and len(new) == 2 and b"".join(p.read_bytes() for p in new) == joined
    assert sorted(p.name for p in out.glob("*.part*")) == [p.name for p in new]
    assert [p["bytes"] for p in json.loads((out / "manifest.json").read_text())["parts"]] == [2 << 20, len(joined) - (2 << 20)]
    proc = subprocess.run(["bash", str(out / "unpack.sh"), str(tmp_path / "b")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    with zipfile.ZipFile(tmp_path / "b" / "wheels" / whl.name) as z:
        assert z.read("big/data.bin") == payload
    new[0].write_bytes(b"x" + new[0].read_bytes()[1:])
    try:
        bundle.resplit(out, 1 << 20)
    except SystemExit as exc:
        assert "sha256 differs from SHA256SUMS" in str(exc)
    else:
        raise AssertionError("a corrupted part was cut again")
    assert bundle.max_part_mib(25 << 20) == 38 and bundle.max_part_mib((25 << 20) + 1) == 37
