"""The GPU stand-in for a MetaX host (issue 33, item 4: ``ci/gpu/metax_standin.sh``,
``tests/fixtures/metax_standin_gpu.py``), what of it runs without a GPU:

* the script: its syntax, its argument errors, its ``prepare`` step (the stub root it writes: the
  GPU forwards in place of the compiled MetaX parts, the CPU stubs for the rest, no flashinfer;
  vLLM-metax's entry points; the fake libmxsml; the engines' environment), and without gcc;
* the ``flash_attn`` forward's argument mapping onto ``vllm.vllm_flash_attn`` (a fake recording the
  calls): Dao's unpaged and paged varlen calls, ``flash_attn_with_kvcache``;
* the ``mcoplib._C`` stub giving vLLM-metax's ``CudaRTLibrary`` the cuda* names, in either import order;
* in the stand-in's environment on vLLM 0.26's Python (its CUDA libraries faked as empty modules):
  vLLM-metax's platform resolves, our ``register()`` returns None, both plugins' hooks run, the GPU
  stubs are the ones imported;
* the cells runner's ``metax-standin`` suite, ``--engine-env`` and ``--plugins-off``.

What needs the GPU (the ops vLLM's CUDA libraries register, FA2's numbers, the engines) is the
script's own ``premise``, ``fa-check``, ``smoke`` and ``cells`` steps.
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, load_tool
from vllm_platform_ext.testing import cell_judge, cell_suites, cells
from vllm_platform_ext.testing.engine import EngineRun

SCRIPT = Path(REPO) / "ci" / "gpu" / "metax_standin.sh"
_spec = importlib.util.spec_from_file_location("metax_standin_gpu", Path(REPO) / "tests" / "fixtures" / "metax_standin_gpu.py")
gpu = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu)


def metax_src() -> Path | None:
    carried = Path(REPO) / ".carry" / "vllm-metax-master"
    if (carried / "vllm_metax").is_dir():
        return carried
    src = gpu.cpu.metax_source()
    return None if src is None else src / "master"


needs_metax = pytest.mark.skipif(metax_src() is None, reason="vLLM-metax's source is absent (.carry/vllm-metax-master "
                                                              "or ../shared/vllm-metax): set VLLM_METAX_SRC")
VENV = Path(sys.executable).parent.parent  # this interpreter's venv stands for run.sh's


def run_script(*args, timeout=120):
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout)


def test_script_parses():
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True).returncode == 0


@pytest.mark.parametrize("args,message", [
    (["--bogus"], "unknown argument --bogus"),
    (["--venv"], "--venv needs a value"),
    (["--timeout", "soon"], "--timeout takes seconds > 0; got soon"),
    (["--parallel", "0"], "--parallel takes a count > 0"),
    (["--steps", "premise,engines"], "--steps takes premise, prepare, smoke, fa-check, doctor, cells, gptq-moe; got engines"),
    (["--steps", "gptq-moe"], "the gptq-moe step needs --gptq-moe-root ROOT"),
    (["--gptq-moe-root", "/nonexistent"], "--gptq-moe-root /nonexistent holds no kit.json"),
    (["--venv", "/nonexistent/venv"], "no python at /nonexistent/venv/bin/python"),
    (["--venv", str(VENV), "--metax-src", "/nonexistent"], "--metax-src /nonexistent holds no vllm_metax/platform.py"),
])
def test_script_argument_errors(args, message):
    proc = run_script(*args)
    assert proc.returncode == 2 and message in proc.stderr, (proc.returncode, proc.stderr)
    assert "metax_standin.sh:" in proc.stderr


def test_script_help_names_the_steps():
    proc = run_script("--help")
    assert proc.returncode == 0
    assert all(s in proc.stdout for s in ("premise", "prepare", "smoke", "fa-check", "doctor", "cells", "--venv"))


STUBS = ("mcoplib", "mcoplib._C", "mcoplib._moe_C", "mcoplib.sgl_kernel", "mcoplib.triton_fused_moe", "mctlassEx",
         "flash_attn", "flash_attn.layers", "flash_attn.layers.rotary", "flash_mla", "fla", "fla.ops")


@needs_metax
def test_script_prepare_writes_the_stand_in(tmp_path):
    out = tmp_path / "out"
    proc = run_script("--venv", str(VENV), "--metax-src", str(metax_src()), "--out", str(out), "--steps", "prepare")
    log = (out / "standin.log").read_text()
    assert proc.returncode == 0 and "step prepare: ok" in log and "DONE: all steps ok" in log, log
    root = out / "root"
    stubs = root / "stubs"
    text = {name: (stubs.joinpath(*name.split(".")) / "__init__.py").read_text() for name in STUBS}
    assert "import vllm._C_stable_libtorch" in text["mcoplib._C"] and "cuda_to_maca_mapping" in text["mcoplib._C"]
    assert "import vllm._moe_C_stable_libtorch" in text["mcoplib._moe_C"]
    assert "fa_version=2" in text["flash_attn"] and "vllm.vllm_flash_attn" in text["flash_attn.layers.rotary"]
    for name in ("mcoplib", "mcoplib.sgl_kernel", "mcoplib.triton_fused_moe", "mctlassEx", "flash_mla", "fla"):
        assert "CPU stand-in" in text[name], name  # import-only: the CPU stand-in's placeholder
    assert not (stubs / "flashinfer").exists()  # vLLM's has_flashinfer() would find it
    (dist,) = (root / "metax_eps").iterdir()
    assert dist.name.startswith("vllm_metax-0.26.0") and "metax = vllm_metax:register" in (dist / "entry_points.txt").read_text()
    env = json.loads((root / "engine-env.json").read_text())
    path = env["PYTHONPATH"].split(":")
    assert path[0] == str(root / "metax_eps") and str(metax_src().resolve()) in path and path[-1] == str(Path(REPO))
    assert path.index(str(stubs)) > path.index(str(metax_src().resolve()))
    assert env["FAKE_MXSML_MEM_GIB"] == "80" and env["USE_VLLM_TRITON_EXPERT"] == "1"
    if shutil.which("gcc") or shutil.which("cc"):
        assert Path(env["VLLM_PLATFORM_EXT_MXSML_LIB"]).is_file()
        assert env["LD_LIBRARY_PATH"].split(":")[0] == str(root / "mxsml")
    assert (root / "metax-plugins.txt").read_text().strip() == "metax,metax_out_of_tree,metax_enhanced_model"
    sourced = subprocess.run(["bash", "-c", '. "$0" && env -0', str(root / "env.sh")], capture_output=True, text=True,
                             env={"PATH": os.environ["PATH"]})
    got = dict(kv.split("=", 1) for kv in sourced.stdout.split("\0") if "=" in kv)
    assert {k: got.get(k) for k in env} == env


def test_fake_card_count_covers_the_physical_ids_vllm_metax_asks_for(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi: CUDA_VISIBLE_DEVICES alone
    assert gpu.fake_card_count({}) == 1
    assert gpu.fake_card_count({"CUDA_VISIBLE_DEVICES": "2"}) == 3
    assert gpu.fake_card_count({"CUDA_VISIBLE_DEVICES": "0,3"}) == 4
    assert gpu.fake_card_count({"CUDA_VISIBLE_DEVICES": "GPU-7bc81034"}) == 1
    assert gpu.fake_card_count({"CUDA_VISIBLE_DEVICES": "40"}) == 16  # the fake's own bound
    smi = tmp_path / "nvidia-smi"  # a 4-card host, one card visible
    smi.write_text("#!/bin/sh\n" + "".join(f"echo 'GPU {i}: NVIDIA H200 (UUID: GPU-{i})'\n" for i in range(4)))
    smi.chmod(0o755)
    assert gpu.fake_card_count({"CUDA_VISIBLE_DEVICES": "1"}) == 4


@needs_metax
def test_prepare_without_gcc_says_so_and_leaves_mxsml_out(tmp_path, monkeypatch):
    logs = []
    monkeypatch.setattr(shutil, "which", lambda name: None)
    env = gpu.prepare(tmp_path / "root", metax_src(), log=logs.append)
    assert "VLLM_PLATFORM_EXT_MXSML_LIB" not in env and "LD_LIBRARY_PATH" not in env
    assert any("no fake libmxsml" in line and "NonMxsmlMacaPlatform" in line for line in logs), logs
    with pytest.raises(SystemExit, match="not a stand-in root"):
        (tmp_path / "other").mkdir()
        (tmp_path / "other" / "keep.txt").write_text("x")
        gpu.prepare(tmp_path / "other", metax_src(), log=logs.append)


FAKE_VFA = '''
import torch
CALLS = []


def flash_attn_varlen_func(**kw):
    CALLS.append(kw)
    out = torch.zeros_like(kw["q"])
    return (out, torch.zeros(kw["q"].shape[1], kw["q"].shape[0])) if kw.get("return_softmax_lse") else out
'''

MAPPING = r'''
import json, torch
import flash_attn
from vllm.vllm_flash_attn import CALLS

def show(kw):
    return {k: (v.tolist() if isinstance(v, torch.Tensor) and v.numel() < 50 else
                list(v.shape) if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}

res = {}
H, D = 4, 8
q, k, v = torch.randn(55, H, D), torch.randn(55, 2, D), torch.randn(55, 2, D)
cu = torch.tensor([0, 5, 22, 55], dtype=torch.int32)
out = flash_attn.flash_attn_varlen_func(q, k, v, cu, cu, 33, 33, softmax_scale=0.5, causal=True)
res["unpaged"] = show(CALLS[-1]) | {"out": list(out.shape)}
kc, vc = torch.randn(9, 16, 2, D), torch.randn(9, 16, 2, D)
table = torch.tensor([[3, 1, 0], [2, 5, 4], [6, 0, 0]], dtype=torch.int32)
cu_q = torch.tensor([0, 3, 13, 20], dtype=torch.int32)
cu_k = torch.tensor([0, 20, 60, 67], dtype=torch.int32)
out = flash_attn.flash_attn_varlen_func(q=q[:20], k=kc, v=vc, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=10,
                                        max_seqlen_k=40, softmax_scale=0.5, causal=True, alibi_slopes=None,
                                        window_size=None, block_table=table, softcap=0.0, s_aux=None)
res["paged"] = show(CALLS[-1]) | {"seqused_dtype": str(CALLS[-1]["seqused_k"].dtype), "table_same": CALLS[-1]["block_table"] is table}
o, lse, probs = flash_attn.flash_attn_varlen_func(q=q, k=k, v=v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=33,
                                                  max_seqlen_k=33, return_attn_probs=True)
res["probs"] = {"lse": CALLS[-1]["return_softmax_lse"], "probs": probs}
qd = torch.randn(3, 4, H, D)
lens = torch.tensor([12, 30, 4], dtype=torch.int32)
out = flash_attn.flash_attn_with_kvcache(q=qd, k_cache=kc, v_cache=vc, block_table=table, cache_seqlens=lens,
                                         softmax_scale=0.5, causal=True, window_size=None, alibi_slopes=None,
                                         softcap=0.0, s_aux=None, num_splits=0)
res["kvcache"] = show(CALLS[-1]) | {"out": list(out.shape), "table_same": CALLS[-1]["block_table"] is table}
flash_attn.flash_attn_with_kvcache(qd, kc, vc, cache_seqlens=7, block_table=table, num_splits=1)
res["kvcache_int"] = show(CALLS[-1])
errors = {}
for name, call in {"sinks": lambda: flash_attn.flash_attn_varlen_func(q, k, v, cu, cu, 33, 33, s_aux=torch.zeros(H)),
                   "append": lambda: flash_attn.flash_attn_with_kvcache(qd, kc, vc, k=k, v=v, cache_seqlens=lens,
                                                                        block_table=table),
                   "unpaged_cache": lambda: flash_attn.flash_attn_with_kvcache(qd, kc, vc, cache_seqlens=lens)}.items():
    try:
        call()
        errors[name] = "no error"
    except NotImplementedError as exc:
        errors[name] = str(exc)
res["errors"] = errors
print("JSON" + json.dumps(res))
'''


def _child(tmp_path, code, *path):
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(map(str, path))})
    lines = [line for line in proc.stdout.splitlines() if line.startswith("JSON")]
    assert proc.returncode == 0 and lines, proc.stdout[-2000:] + proc.stderr[-4000:]
    return json.loads(lines[-1][4:])


def test_flash_attn_forward_maps_dao_calls_onto_vllm_varlen(tmp_path):
    fake = tmp_path / "fake"
    (fake / "vllm" / "vllm_flash_attn").mkdir(parents=True)
    (fake / "vllm" / "__init__.py").write_text("")
    (fake / "vllm" / "vllm_flash_attn" / "__init__.py").write_text(FAKE_VFA)
    gpu.write_gpu_stubs(tmp_path / "stubs")
    res = _child(tmp_path, MAPPING, fake, tmp_path / "stubs")
    un = res["unpaged"]  # TurboQuant's prefill: K/V unpaged, passed through
    assert un["cu_seqlens_k"] == [0, 5, 22, 55] and un["seqused_k"] is None and un["block_table"] is None
    assert un["fa_version"] == 2 and un["causal"] is True and un["softmax_scale"] == 0.5 and un["window_size"] == [-1, -1]
    assert un["max_seqlen_q"] == un["max_seqlen_k"] == 33 and un["return_softmax_lse"] is False and un["out"] == [55, 4, 8]
    pg = res["paged"]  # Dao's paged call: the keys' lengths from cu_seqlens_k, as vLLM's FA2 takes them
    assert pg["cu_seqlens_k"] is None and pg["seqused_k"] == [20, 40, 7] and pg["seqused_dtype"] == "torch.int32"
    assert pg["table_same"] and pg["k"] == [9, 16, 2, 8] and pg["cu_seqlens_q"] == [0, 3, 13, 20]
    assert pg["max_seqlen_k"] == 40 and pg["window_size"] is None and pg["fa_version"] == 2
    assert res["probs"] == {"lse": True, "probs": None}  # Dao's (out, lse, probs)
    kv = res["kvcache"]  # decode/verify: B sequences of Lq queries each, bottom-right causal on the paged cache
    assert kv["q"] == [12, 4, 8] and kv["cu_seqlens_q"] == [0, 4, 8, 12] and kv["max_seqlen_q"] == 4
    assert kv["seqused_k"] == [12, 30, 4] and kv.get("cu_seqlens_k") is None and kv["table_same"]
    assert kv["max_seqlen_k"] == 3 * 16 and kv["causal"] is True and kv["num_splits"] == 0 and kv["out"] == [3, 4, 4, 8]
    assert res["kvcache_int"]["seqused_k"] == [7, 7, 7] and res["kvcache_int"]["num_splits"] == 1
    errors = res["errors"]
    assert "sinks" in errors["sinks"] and "appends no k/v" in errors["append"] and "block_table" in errors["unpaged_cache"]


# vllm_flash_attn's varlen contract (its docstring and asserts) in torch: unpaged K/V by cu_seqlens_k,
# or paged K/V ([blocks, block, heads, D], any strides) by block_table with the lengths in seqused_k
CONTRACT_VFA = '''
import torch


def flash_attn_varlen_func(q, k, v, max_seqlen_q, cu_seqlens_q, max_seqlen_k, cu_seqlens_k=None, seqused_k=None,
                           softmax_scale=None, causal=False, window_size=None, block_table=None,
                           return_softmax_lse=False, fa_version=2, softcap=0.0, alibi_slopes=None, num_splits=0,
                           out=None, dropout_p=0.0, deterministic=False):
    assert fa_version == 2 and (cu_seqlens_k is None) != (seqused_k is None) and not softcap and alibi_slopes is None
    assert block_table is None or seqused_k is not None, "seqused_k must be provided if block_table is provided"
    assert window_size in (None, [-1, -1])
    outs = []
    for i in range(len(cu_seqlens_q) - 1):
        qs = q[cu_seqlens_q[i]:cu_seqlens_q[i + 1]]
        if block_table is not None:
            n, bs = int(seqused_k[i]), k.shape[1]
            ks = torch.stack([k[block_table[i, t // bs], t % bs] for t in range(n)])
            vs = torch.stack([v[block_table[i, t // bs], t % bs] for t in range(n)])
        else:
            ks, vs = k[cu_seqlens_k[i]:cu_seqlens_k[i + 1]], v[cu_seqlens_k[i]:cu_seqlens_k[i + 1]]
        assert qs.shape[0] <= max_seqlen_q and ks.shape[0] <= max_seqlen_k
        g = qs.shape[1] // ks.shape[1]
        ks, vs = ks.float().repeat_interleave(g, 1), vs.float().repeat_interleave(g, 1)
        sc = torch.einsum("qhd,khd->hqk", qs.float(), ks) * softmax_scale
        if causal:
            lq, lk = qs.shape[0], ks.shape[0]
            sc = sc.masked_fill(torch.arange(lk)[None, :] > torch.arange(lq)[:, None] + lk - lq, float("-inf"))
        outs.append(torch.einsum("hqk,khd->qhd", sc.softmax(-1), vs))
    res = torch.cat(outs).to(q.dtype)
    return (res, None) if return_softmax_lse else res
'''


# vLLM's cache update into strided caches (each token's K/V to its slot), for the cache-write check
CONTRACT_CACHE_OPS = '''
import torch

_lib = torch.library.Library("_C_cache_ops", "DEF")
_lib.define("reshape_and_cache_flash(Tensor key, Tensor value, Tensor(a!) key_cache, Tensor(b!) value_cache, "
            "Tensor slot_mapping, str kv_cache_dtype, Tensor k_scale, Tensor v_scale) -> ()")


def _write(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale):
    bs = key_cache.shape[1]
    for i, s in enumerate(slot_mapping.tolist()):
        key_cache[s // bs, s % bs] = key[i]
        value_cache[s // bs, s % bs] = value[i]


_lib.impl("reshape_and_cache_flash", _write, "CompositeExplicitAutograd")
'''


def test_fa_check_passes_on_the_varlen_contract(tmp_path):
    """The script's fa-check (its paged caches packed as vLLM-metax's FLASH_ATTN lays them out, NHD and
    HND) through the forward onto a torch model of vllm_flash_attn's varlen contract, and its cache-write
    check on a torch model of reshape_and_cache_flash: it passes, so on the GPU a failure there is vLLM's
    FA2 or cache kernel disagreeing, not the check or the argument mapping."""
    fake = tmp_path / "fake"
    (fake / "vllm" / "vllm_flash_attn").mkdir(parents=True)
    (fake / "vllm" / "__init__.py").write_text("")
    (fake / "vllm" / "vllm_flash_attn" / "__init__.py").write_text(CONTRACT_VFA)
    (fake / "vllm" / "_C_stable_libtorch.py").write_text(CONTRACT_CACHE_OPS)
    gpu.write_gpu_stubs(tmp_path / "stubs")
    proc = subprocess.run([sys.executable, str(Path(REPO) / "tests" / "fixtures" / "metax_standin_gpu.py"), "fa-check"],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "VPE_FA_CHECK_DEVICE": "cpu",
                               "PYTHONPATH": os.pathsep.join([str(fake), str(tmp_path / "stubs")])})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not res["failed"] and len(res["fa_check"]) == 9, res
    assert {"cache write NHD (reshape_and_cache_flash)", "with_kvcache HND (FLASH_ATTN decode)",
            "with_kvcache one token NHD (drafter decode)", "with_kvcache one token HND (drafter decode)"} \
        <= set(res["fa_check"])


HOOK = r'''
import json, sys
res = {}
if sys.argv[1] == "stub-first":
    import mcoplib._C
    from vllm_metax.patch.enhancement.distributed import cuda_wrapper
else:
    from vllm_metax.patch.enhancement.distributed import cuda_wrapper
    import mcoplib._C
import vllm._C_stable_libtorch
print("JSON" + json.dumps({"mapping": cuda_wrapper.CudaRTLibrary.cuda_to_maca_mapping,
                           "other": __import__("vllm_metax.other").other.MAPPING}))
'''


@pytest.mark.parametrize("order", ["stub-first", "wrapper-first"])
def test_mcoplib_c_stub_gives_cudart_library_the_cuda_names(tmp_path, order):
    fake = tmp_path / "fake"
    wrapper = fake / "vllm_metax" / "patch" / "enhancement" / "distributed"
    wrapper.mkdir(parents=True)
    (fake / "vllm").mkdir()
    for d in (fake / "vllm", fake / "vllm_metax", *wrapper.parents[:3], wrapper):
        (d / "__init__.py").touch()
    (fake / "vllm" / "_C_stable_libtorch.py").write_text("")
    mapping = 'MAPPING = {"cudaSetDevice": "mcSetDevice", "cudaMalloc": "mcMalloc"}\n'
    (wrapper / "cuda_wrapper.py").write_text(f"class CudaRTLibrary:\n    cuda_to_maca_mapping = {mapping.split(' = ')[1]}")
    (fake / "vllm_metax" / "other.py").write_text(mapping)  # another module of the package: left alone
    gpu.write_gpu_stubs(tmp_path / "stubs")
    code = HOOK.replace("sys.argv[1]", repr(order))
    res = _child(tmp_path, code, fake, tmp_path / "stubs")
    assert res["mapping"] == {"cudaSetDevice": "cudaSetDevice", "cudaMalloc": "cudaMalloc"}
    assert res["other"]["cudaSetDevice"] == "mcSetDevice"


SMOKE = r'''
import runpy, sys, types
for m in ("vllm._C_stable_libtorch", "vllm._moe_C_stable_libtorch"):  # vLLM's CUDA libraries: absent on CPU
    sys.modules[m] = types.ModuleType(m)
sys.argv = ["metax_standin_gpu.py", "smoke"]
try:
    runpy.run_path(sys.argv_path, run_name="__main__")
except SystemExit:
    pass
'''


@needs_metax
def test_stand_in_env_resolves_vllm_metax_platform_with_the_gpu_stubs(tmp_path, monkeypatch):
    lines, tables = load_tool("ci/tools/vllm_lines.py"), load_tool("ci/tools/compat_tables.py")
    missing = lines.deps_missing()
    if missing:
        pytest.fail(missing)
    wheel = tables.find_wheel("0.26.0")
    if wheel is None:
        pytest.fail(f"no vllm-0.26.0 wheel in {tables.WHEEL_DIR}: run `python ci/tools/compat_tables.py fetch`")
    line_dir = lines.extract(wheel, "0.26.0")
    # card 2 of a 4-card host, as window 6 ran it: vLLM-metax asks the fake libmxsml for the physical id
    # CUDA_VISIBLE_DEVICES names (a one-card fake answered NVMLError_InvalidArgument there)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2")
    env = gpu.prepare(tmp_path / "root", metax_src(), log=lambda s: None)
    if "VLLM_PLATFORM_EXT_MXSML_LIB" in env:
        assert int(env["FAKE_MXSML_COUNT"]) >= 3
    env = {**os.environ, **env}
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], str(line_dir), str(lines.DEPS_DIR)])
    code = SMOKE.replace("sys.argv_path", repr(str(Path(REPO) / "tests" / "fixtures" / "metax_standin_gpu.py")))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env)
    out = proc.stdout
    ok = [line.strip()[5:] for line in out.splitlines() if line.strip().startswith("[ok]")]
    for want in ("vLLM-metax's platform is active (MxsmlMacaPlatform)", "our register() returned None",
                 "our bootstrap: no failed entry", "mcoplib._C is the GPU stand-in's", "mcoplib._moe_C is the GPU",
                 "flash_attn is the GPU stand-in's", "flash_attn forwards to vLLM's FA2", "no flashinfer stub",
                 "CudaRTLibrary binds cuda* names"):
        assert any(line.startswith(want) for line in ok), (want, out[-4000:], proc.stderr[-4000:])
    assert "'capability': DeviceCapability(major=8, minor=0)" in out and "'total_memory_gib': 80.0" in out
    assert "backend TURBOQUANT: vllm_metax.v1.attention.backends.turboquant_attn.MacaTurboQuantAttentionBackend" in out
    # what only the GPU gives: vLLM's CUDA kernels (the ops), libcudart
    assert "[FAILED] torch.ops._C.rms_norm has vLLM's CUDA kernel" in out


def test_metax_standin_suite_and_the_plugin_off_cell_keeps_vllm_metax(tmp_path, monkeypatch):
    ids = [c.id for c in cells.select("metax-standin")]  # a suite name holding a "-", as tq-diag
    assert [c.id for c in cells.select("tq-diag")] == [c.id for c in cells.SUITES["tq-diag"]]
    assert cell_suites._suite_tokens("core-tq-diag+metax-standin") == ["core", "-", "tq-diag", "+", "metax-standin"]
    assert ids == ["qwen3_next-mtp3-k8v4-full_and_piecewise-on", "qwen3_next-base-k8v4-full_and_piecewise-on",
                   "qwen3_next-mtp3-auto-full_and_piecewise-on", "qwen3_next-mtp3-k8v4-full_and_piecewise-off"]
    off = cells.SUITES["metax-standin"][3]
    assert off.env() == {"VLLM_PLUGINS": ""} and off.env("metax,metax_out_of_tree") == {"VLLM_PLUGINS": "metax,metax_out_of_tree"}
    seen = []

    def engine(model, prompts, configs, settings, env, timeout, log_path=None):
        (cfg,) = configs
        seen.append((cfg.label, cfg.kv_cache_dtype, env, timeout, log_path))
        return [EngineRun(mode=cfg.mode, k=cfg.k, tokens=[[5]] * len(prompts), num_draft_tokens=6, num_accepted_tokens=2)]

    def Audit(bad):  # round(bad * 100) of 100 positions past both thresholds
        from vllm_platform_ext.testing.audit import AuditResult

        return AuditResult([[1.0] * round(bad * 100) + [0.0] * (100 - round(bad * 100))])

    refs = []

    def reference(path, prompts, generated, max_tokens, python=None, logprobs=None):
        refs.append(dict(os.environ))
        return Audit(0.01), {k: Audit(0.01) for k in generated}

    monkeypatch.setenv("VPE_KIT", "random")  # stub engines: no per-position acceptance counts
    monkeypatch.setattr(cells, "make_tiny_model", lambda kind, out, dims, target="random": out)
    monkeypatch.setattr(cells, "run_in_subprocess", engine)
    monkeypatch.setattr(cell_judge, "reference_audits", reference)
    ee = tmp_path / "engine-env.json"
    ee.write_text(json.dumps({"PYTHONPATH": "/standin/stubs", "USE_VLLM_TRITON_EXPERT": "1"}))
    out = tmp_path / "out"
    rc = cells.main(["--suite", "metax-standin", "--parallel", "4", "--timeout", "99", "--engine-env", str(ee),
                     "--plugins-off", "metax,metax_out_of_tree,metax_enhanced_model", "--out", str(out)])
    assert rc == 0 and len(seen) == 4
    for label, kv, env, timeout, log_path in seen:
        assert env["PYTHONPATH"] == "/standin/stubs" and env["USE_VLLM_TRITON_EXPERT"] == "1" and timeout == 99
        assert Path(log_path).parent == out / "engine-logs"
    offs = [env for _, _, env, _, lp in seen if lp.endswith("-off.log")]
    assert [e["VLLM_PLUGINS"] for e in offs] == ["metax,metax_out_of_tree,metax_enhanced_model"]
    assert sum("VLLM_PLUGINS" in env for _, _, env, _, _ in seen) == 1
    assert refs and all(r.get("PYTHONPATH") != "/standin/stubs" for r in refs)  # the reference never gets it
    res = {r["id"]: r for r in json.loads((out / "results.json").read_text())}
    assert res["qwen3_next-mtp3-k8v4-full_and_piecewise-on"]["status"] == "pass"
    progress = (out / "progress.log").read_text()
    assert progress.count("[cells] qwen3_next-") == 4 and "[cells] reference audit of qwen3_next" in progress
    assert (out / "engine-logs" / "runs.json").is_file()  # the tokens, for testing/cell_replay.py
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"A": 1}))
    with pytest.raises(SystemExit):
        cells.main(["--suite", "metax-standin", "--engine-env", str(bad), "--out", str(out)])


FAKE_PYTHON = r'''#!/usr/bin/env bash
# the venv's python for the script's orchestration: prepare runs for real, the GPU steps are faked
case " $* " in
  *" -m vllm_platform_ext.testing.cells "*)
    printf '%s\n' "$@" >"$FAKE_DIR/cells.args"; echo "$PYTHONPATH" >"$FAKE_DIR/cells.pythonpath"
    while [ $# -gt 0 ]; do [ "$1" = --out ] && out="$2"; shift; done
    echo "| fake cells table |" >"$out/results.md"; exit 0 ;;
  *" -m vllm_platform_ext.testing.gptq_cells "*)
    printf '%s\n' "$@" >>"$FAKE_DIR/gptq.args"; echo "$PYTHONPATH" >"$FAKE_DIR/gptq.pythonpath"; exit 0 ;;
  *" smoke "*) echo "smoke: vLLM-metax's platform is not active"; exit 3 ;;
  *" premise "*|*" fa-check "*|*" vllm_platform_ext.cli doctor "*) echo "fake $*"; exit 0 ;;
  *) exec REAL "$@" ;;
esac
'''


@needs_metax
def test_script_runs_every_step_past_a_failed_one_and_exits_1(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text(FAKE_PYTHON.replace("REAL", sys.executable))
    (venv / "bin" / "python").chmod(0o755)
    out = tmp_path / "out"
    env = {**os.environ, "FAKE_DIR": str(tmp_path), "VPE_REFERENCE_PYTHON": sys.executable}
    proc = subprocess.run(["bash", str(SCRIPT), "--venv", str(venv), "--metax-src", str(metax_src()), "--out", str(out),
                           "--timeout", "77", "--parallel", "3"], capture_output=True, text=True, timeout=300, env=env)
    log = (out / "standin.log").read_text()
    assert proc.returncode == 1, log
    for step in ("prepare", "premise", "fa-check", "doctor", "cells"):
        assert f"step {step}: ok" in log, (step, log)
    # fa-check (it JIT-compiles the FA2 modules into the cache) finishes before the cells start
    assert log.index("step fa-check: ok") < log.index("step cells: reference python"), log
    assert "step smoke: FAILED rc=3" in log and "| smoke: vLLM-metax's platform is not active" in log
    assert "DONE with failures: smoke" in log and (out / "smoke.log").exists() and (out / "doctor.log").exists()
    args = (tmp_path / "cells.args").read_text().split("\n")
    val = lambda flag: args[args.index(flag) + 1]
    assert val("--suite") == "metax-standin" and val("--timeout") == "77" and val("--parallel") == "3"
    assert val("--engine-env") == str(out / "root" / "engine-env.json") and val("--out") == str(out)
    assert val("--plugins-off") == "metax,metax_out_of_tree,metax_enhanced_model"
    assert (tmp_path / "cells.pythonpath").read_text().strip() == str(out / "root" / "metax_eps")
    table = (out / "results.md").read_text()
    assert table.startswith("GPU stand-in (ci/gpu/metax_standin.sh)") and "| fake cells table |" in table


@needs_metax
def test_script_gptq_moe_step_runs_the_kit_in_the_stand_in(tmp_path):
    """--gptq-moe-root adds the gptq-moe step (issue 50: GPTQ MoE through vLLM-metax's MacaAutoGPTQConfig): the kit's
    MoE cells, engines only, in the stand-in's env with only our plugin off, then judged."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text(FAKE_PYTHON.replace("REAL", sys.executable))
    (venv / "bin" / "python").chmod(0o755)
    kit = tmp_path / "kit"
    kit.mkdir()
    (kit / "kit.json").write_text('{"kind": "qwen3_5_moe", "dims": "gpu"}')
    out = tmp_path / "out"
    env = {**os.environ, "FAKE_DIR": str(tmp_path), "VPE_REFERENCE_PYTHON": sys.executable}
    proc = subprocess.run(["bash", str(SCRIPT), "--venv", str(venv), "--metax-src", str(metax_src()), "--out", str(out),
                           "--timeout", "77", "--parallel", "3", "--steps", "prepare", "--gptq-moe-root", str(kit)],
                          capture_output=True, text=True, timeout=300, env=env)
    log = (out / "standin.log").read_text()
    assert proc.returncode == 0 and "step gptq-moe: ok" in log and "DONE: all steps ok" in log, log
    args = (tmp_path / "gptq.args").read_text().split("\n")
    run = args[: args.index("judge")] if "judge" in args else args
    assert run[:5] == ["-m", "vllm_platform_ext.testing.gptq_cells", "run", str(kit), str(out / "gptq-moe")]
    val = lambda flag: run[run.index(flag) + 1]
    assert "--moe" in run and "--engines-only" in run and val("--parallel") == "3" and val("--timeout") == "77"
    assert val("--engine-env") == str(out / "root" / "engine-env.json")
    assert val("--plugins-off") == "metax,metax_out_of_tree,metax_enhanced_model"
    judge = args[args.index("judge") - 2:]
    assert judge[:5] == ["-m", "vllm_platform_ext.testing.gptq_cells", "judge", str(kit), str(out / "gptq-moe")]
    assert (tmp_path / "gptq.pythonpath").read_text().strip() == str(out / "root" / "metax_eps")
