"""The CUDA-path GDN wiring (``patch/gdn_cuda.py``) against a real OLD vLLM line (0.23.0).

The old line lives in its own venv (``ci/old_vllm_venv.sh``, default ``.venv-old``; path
override ``OLD_VLLM_PYTHON``). pytest runs this file there as a script (``--old-side``): it
imports the old vLLM's real ``GDNAttentionMetadataBuilder`` (built through its own
``__init__``), ``GPUModelRunner._build_attention_metadata`` and GDN layer module, applies the
patch group, runs the scenarios on CPU tensors and prints the results as JSON; the tests below
check them. Everything the old side needs is imported inside functions, before ``import
pytest``, since the old venv has no pytest.

Batch used (K = 3 speculative tokens, block-table row i = [10i+1 .. 10i+4], decode rows first
as the runner orders them):
  r0  decode, no drafts, previous step accepted 3    (state in block 3 / conv offset 2)
  r1  decode, no drafts, previous step accepted 1
  r2  one-token LAST prompt chunk (16 of 17 prompt tokens computed): must stay a prefill
  r3  first prompt chunk, 4 tokens, no prior state
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

K = 3
BT = [[10 * i + j for j in range(1, K + 2)] for i in range(4)]
PREFIX = "model.layers.0.linear_attn"


def _old_side() -> dict:  # runs in the old venv
    import types

    import torch

    import vllm
    from vllm.config import CUDAGraphMode
    from vllm.v1.attention.backend import CommonAttentionMetadata
    from vllm.v1.attention.backends import gdn_attn
    from vllm.v1.kv_cache_interface import MambaSpec
    from vllm.v1.worker import gpu_model_runner as runner_mod

    from vllm_platform_ext import patching
    from vllm_platform_ext.report import Report
    from vllm_platform_ext.patch import gdn_cuda as G

    NS = types.SimpleNamespace
    out: dict = {"vllm": vllm.__version__, "probe": G.probe(), "skip": G.skip_reason(), "targets": list(G.targets())}

    def builder(full_cudagraph=False):
        mode = CUDAGraphMode.FULL_AND_PIECEWISE if full_cudagraph else CUDAGraphMode.NONE
        cfg = NS(compilation_config=NS(cudagraph_mode=mode, max_cudagraph_capture_size=None),
                 speculative_config=NS(num_speculative_tokens=K, parallel_drafting=False),
                 scheduler_config=NS(max_num_seqs=8), cache_config=NS(mamba_cache_mode="none"),
                 parallel_config=NS(decode_context_parallel_size=1), additional_config={}, model_config=None)
        spec = MambaSpec(block_size=16, shapes=((K + 3, 8), (2, 4, 4)), dtypes=(torch.float32, torch.float32),
                         mamba_cache_mode="none", num_speculative_blocks=K)
        return gdn_attn.GDNAttentionMetadataBuilder(spec, [PREFIX], cfg, torch.device("cpu"))

    def batch(qlens, seq_lens, prompt_lens):
        n = len(qlens)
        qsl = torch.tensor([0, *torch.tensor(qlens).cumsum(0).tolist()], dtype=torch.int32)
        seq = torch.tensor(seq_lens, dtype=torch.int32)
        computed = seq - torch.tensor(qlens, dtype=torch.int32)
        prompt = torch.tensor(prompt_lens, dtype=torch.int32)
        return dict(qsl=qsl, seq=seq, computed=computed, prompt=prompt, n=n, T=int(qsl[-1]),
                    bt=torch.tensor(BT[:n], dtype=torch.int32))

    def common(b):  # as GPUModelRunner._build_attention_metadata (0.23) fills it
        return CommonAttentionMetadata(
            query_start_loc=b["qsl"], query_start_loc_cpu=b["qsl"], seq_lens=b["seq"], _seq_lens_cpu=b["seq"],
            _num_computed_tokens_cpu=b["computed"], seq_lens_cpu_upper_bound=b["seq"], num_reqs=b["n"],
            num_actual_tokens=b["T"], max_query_len=int((b["qsl"][1:] - b["qsl"][:-1]).max()),
            max_seq_len=int(b["seq"].max()), block_table_tensor=b["bt"],
            slot_mapping=torch.zeros(b["T"], dtype=torch.long), causal=True,
            is_prefilling=b["computed"] < b["prompt"], positions=torch.zeros(b["T"], dtype=torch.long))

    def summary(md):
        def lst(t):
            return None if t is None else t.tolist()
        return dict(num_spec_decodes=md.num_spec_decodes, num_decodes=md.num_decodes, num_prefills=md.num_prefills,
                    num_spec_decode_tokens=md.num_spec_decode_tokens, num_prefill_tokens=md.num_prefill_tokens,
                    num_accepted_tokens=lst(md.num_accepted_tokens),
                    spec_state_indices=lst(md.spec_state_indices_tensor),
                    non_spec_state_indices=lst(md.non_spec_state_indices_tensor),
                    spec_token_indx=lst(md.spec_token_indx), non_spec_token_indx=lst(md.non_spec_token_indx),
                    has_initial_state=lst(md.has_initial_state),
                    spec_query_start_loc=lst(md.spec_query_start_loc))

    mixed = batch([1, 1, 1, 4], [40, 30, 17, 4], [20, 10, 17, 50])
    decodes = batch([1, 1], [40, 30], [20, 10])
    spec_step = batch([3, 1, 1, 4], [42, 30, 17, 4], [20, 10, 17, 50])  # r0 carries 2 drafts
    accepted4 = torch.tensor([3, 1, 1, 1], dtype=torch.int32)

    def builder_runs():
        B = gdn_attn.GDNAttentionMetadataBuilder.build
        r = {}
        # a step where no request drafted: the old runner passes nothing; the runner patch
        # offers the accepted counts through the context variable it sets
        token = G._STEP_ACCEPTED.set(accepted4)
        try:
            r["no_drafts_mixed"] = summary(B(builder(), 0, common(mixed)))
            r["no_drafts_decodes"] = summary(B(builder(), 0, common(decodes)))
        finally:
            G._STEP_ACCEPTED.reset(token)
        r["no_drafts_no_runner"] = summary(B(builder(), 0, common(decodes)))

        def in_step(accepted, fn):  # inside a scheduled step, as the runner patch sets it up
            token = G._STEP_ACCEPTED.set(accepted)
            try:
                return summary(fn())
            finally:
                G._STEP_ACCEPTED.reset(token)

        # a spec step: r0 has 2 drafts, the old runner leaves r1 (no drafts) at -1
        acc = torch.tensor([3, 2, 1, 1], dtype=torch.int32)
        r["spec_step"] = in_step(acc, lambda: B(builder(), 0, common(spec_step), acc,
                                                torch.tensor([2, -1, -1, -1], dtype=torch.int32)))
        # every row a decode that was passed explicitly with zero drafts (sum gate)
        acc = torch.tensor([3, 2], dtype=torch.int32)
        r["explicit_zero_drafts"] = in_step(acc, lambda: B(builder(), 0, common(decodes), acc,
                                                           torch.tensor([0, 0], dtype=torch.int32)))
        # the same counts outside a scheduled step (a dummy run): upstream decides alone
        r["explicit_zero_drafts_no_step"] = summary(B(builder(), 0, common(decodes), acc,
                                                      torch.tensor([0, 0], dtype=torch.int32)))
        # full-cudagraph capture of one-token rows goes down the same path as the replays
        r["capture"] = in_step(G.CAPTURE, lambda: builder(full_cudagraph=True).build_for_cudagraph_capture(
            common(decodes)))
        return r

    def runner_run(use_spec_decode, dummy=False):
        """The old runner's real _build_attention_metadata on a minimal stand-in runner: a
        scheduled step (``num_scheduled_tokens`` passed, as execute_model does), or with
        ``dummy`` the warm-up run before a FULL graph capture (``_dummy_run`` with
        force_attention: use_spec_decode, no num_scheduled_tokens, buffers still all zero)."""
        b = mixed
        bld = builder()
        stale = torch.tensor([2, 2, 2, 2, 2, 2, 2, 2], dtype=torch.int32)  # left from an earlier spec step
        acc = torch.tensor([3, 1, 1, 1, 1, 1, 1, 1], dtype=torch.int32)
        if dummy:
            stale, acc = torch.zeros(8, dtype=torch.int32), torch.zeros(8, dtype=torch.int32)
        fake = NS(
            kv_cache_config=NS(kv_cache_groups=[NS(kv_cache_spec=bld.kv_cache_spec)]),
            attn_groups=[[NS(get_metadata_builder=lambda ubid=0: bld, layer_names=[PREFIX])]],
            max_model_len=4096, optimistic_seq_lens_cpu=b["seq"], device=torch.device("cpu"),
            input_batch=NS(block_table=[NS(get_device_tensor=lambda n: b["bt"][:n])],
                           num_computed_tokens_cpu_tensor=b["computed"], num_prompt_tokens_cpu_tensor=b["prompt"]),
            routed_experts_initialized=False, use_async_spec_decode=False, dcp_world_size=1,
            query_start_loc=NS(gpu=b["qsl"], cpu=b["qsl"]), seq_lens=b["seq"],
            positions=torch.zeros(b["T"], dtype=torch.long), cache_config=NS(kv_sharing_fast_prefill=False),
            speculative_config=NS(num_speculative_tokens=K), drafter=object(), is_mm_prefix_lm=False,
            _get_encoder_seq_lens=lambda *a, **k: (None, None), mamba_prev_last_scheduled_idx=None,
            num_accepted_tokens=NS(gpu=acc, cpu=acc), num_decode_draft_tokens=NS(cpu=stale, gpu=stale),
            num_accepted_tokens_event=object())
        scheduled = None if dummy else {f"r{i}": int(q) for i, q in enumerate(b["qsl"].diff().tolist())}
        md, _ = runner_mod.GPUModelRunner._build_attention_metadata(
            fake, num_tokens=b["T"], num_reqs=b["n"], max_query_len=4, use_spec_decode=use_spec_decode,
            slot_mappings={0: torch.zeros(b["T"], dtype=torch.long)}, num_scheduled_tokens=scheduled)
        return summary(md[PREFIX])

    def layer_run():
        """Our layer wrappers around a stand-in for the layer's spec call (the real
        _forward_core needs the Triton kernels): the gates reaching the kernel must be the
        spec tokens' in a mixed batch, and untouched otherwise."""
        import vllm.forward_context as fc

        seen = []

        def kernel(**kw):
            seen.append((kw["a"].tolist(), kw["b"].tolist()))
            return None, None

        gating = G._make_gating(kernel)
        r = {}
        # the prompt tail r2 ordered first: the spec tokens are not a prefix of the batch
        tail_first = batch([1, 1, 1, 4], [17, 40, 30, 4], [17, 20, 10, 50])
        for name, b, acc in (("tail_first", tail_first, torch.tensor([1, 3, 1, 1], dtype=torch.int32)),
                             ("decodes", decodes, accepted4)):
            token = G._STEP_ACCEPTED.set(acc)
            try:
                md = gdn_attn.GDNAttentionMetadataBuilder.build(builder(), 0, common(b))
            finally:
                G._STEP_ACCEPTED.reset(token)
            a = torch.arange(b["T"], dtype=torch.float32) * 10
            bb = a + 1

            def body(self, mixed_qkv, b_, a_, core_attn_out):  # the layer's spec call, as written in 0.23
                q = torch.zeros(1, md.num_spec_decode_tokens, 1, 1)
                gating(A_log=None, a=a_, b=b_, q=q, num_accepted_tokens=md.num_accepted_tokens)
                gating(A_log=None, a=a_, b=b_, q=q)  # a non-spec call: never touched

            core = G._make_forward_core(body)
            saved = fc._forward_context
            fc._forward_context = NS(attn_metadata={PREFIX: md})
            try:
                seen.clear()
                core(NS(prefix=PREFIX), None, bb, a, None)
            finally:
                fc._forward_context = saved
            r[name] = dict(spec_call=seen[0], other_call=seen[1], spec_token_indx=md.spec_token_indx.tolist())
        return r

    def old(fn):  # what the unpatched old line does
        return fn()

    out["unpatched"] = dict(builder=old(builder_runs), runner_no_drafts=runner_run(False),
                            runner_warmup=runner_run(True, dummy=True))
    report = Report()
    (group,) = G.groups()
    out["applied"] = patching.apply_group(group, report)
    entry = report.find("patch", group.name)
    out["report"] = entry.detail if entry else None
    out["patched_targets"] = patching.applied_targets(group.name)
    try:
        out["patched"] = dict(builder=builder_runs(), runner_no_drafts=runner_run(False), layer=layer_run(),
                              runner_warmup=runner_run(True, dummy=True))
    finally:
        patching.restore(group.name)
    out["restored"] = not any(patching.is_patched(t) for t in G.targets())
    # the builder patch alone cannot help on a no-draft step: the runner passes no accepted counts
    (bp,) = [p for p in group.build() if p.target == G.BUILD_TARGET]
    patching.apply("test-builder-only", [bp])
    try:
        out["builder_only_runner_no_drafts"] = runner_run(False)
    finally:
        patching.restore("test-builder-only")
    return out


if __name__ == "__main__" and sys.argv[1:] == ["--old-side"]:
    print("OLD-SIDE-JSON " + json.dumps(_old_side()))
    sys.exit(0)

# ---------------------------------------------------------------------------------------------
import pytest  # noqa: E402

from conftest import REPO, old_vllm_python  # noqa: E402


@pytest.fixture(scope="module")
def old():
    py = old_vllm_python()
    if not os.path.exists(py):
        pytest.fail(f"old-vLLM venv missing ({py}): run `bash ci/old_vllm_venv.sh` (setup step)")
    env = dict(os.environ, PYTHONPATH=REPO, VLLM_PLUGINS="", CUDA_VISIBLE_DEVICES="")
    env.pop("VLLM_PLATFORM_EXT_DISABLE", None)
    proc = subprocess.run([py, os.path.abspath(__file__), "--old-side"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("OLD-SIDE-JSON ")]
    assert proc.returncode == 0 and lines, f"old side failed (rc {proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}"
    return json.loads(lines[-1][len("OLD-SIDE-JSON "):])


def test_old_line_is_probed_and_the_whole_group_applies(old):
    assert old["vllm"].startswith("0.23."), old["vllm"]
    p = old["probe"]
    assert p["runner_fix"] is None and p["layer_spec_gates_fixed"] is None, p
    for key in ("builder_sum_gate", "builder_spec_mask", "runner_gate", "runner_passes_accepted",
                "runner_syncs_accepted", "runner_is_prefilling", "layer_spec_gates"):
        assert p[key], (key, p)
    assert old["skip"] is None
    assert old["applied"] is True and sorted(old["patched_targets"]) == sorted(old["targets"])
    assert len(old["targets"]) == 4 and "qwen_gdn_linear_attn:QwenGatedDeltaNetAttention._forward_core" in old["targets"][2]
    assert old["restored"]


def _row_reads(md, accepted_before):
    """SSM block each spec row reads: column accepted-1 of its block-table row."""
    return [row[a - 1] for row, a in zip(md["spec_state_indices"], md["num_accepted_tokens"])]


def test_unpatched_old_line_has_the_bug(old):
    u = old["unpatched"]
    # no-draft step: the runner passes nothing, the zero-draft decodes r0/r1 read column 0 (blocks 1, 11)
    r = u["runner_no_drafts"]
    assert r["num_spec_decodes"] == 0 and r["num_accepted_tokens"] is None
    assert r["non_spec_state_indices"][:2] == [1, 11]
    # explicit zero drafts everywhere: the sum gate discards the spec rows
    assert u["builder"]["explicit_zero_drafts"]["num_spec_decodes"] == 0
    # spec step: the undrafted decode r1 is not a spec row
    assert u["builder"]["spec_step"]["num_spec_decodes"] == 1
    # builder patch alone: a no-draft step still has no accepted counts, so nothing changes
    assert old["builder_only_runner_no_drafts"]["num_spec_decodes"] == 0


def test_no_draft_step_through_the_real_runner(old):
    """The real old runner method, no request drafted: r0/r1 become spec rows that read the
    accepted block; the one-token prompt tail r2 and the first chunk r3 stay prefills."""
    md = old["patched"]["runner_no_drafts"]
    assert md["num_spec_decodes"] == 2 and md["num_decodes"] == 0 and md["num_prefills"] == 2
    assert md["num_accepted_tokens"] == [3, 1]
    assert md["spec_state_indices"] == [BT[0], BT[1]]
    assert _row_reads(md, [3, 1]) == [3, 11]  # r0: block 3 (accepted 3), r1: block 11
    assert md["non_spec_state_indices"] == [BT[2][0], BT[3][0]]
    assert md["has_initial_state"] == [True, False]  # r2 continues its prompt, r3 starts
    assert md["spec_token_indx"] == [0, 1] and md["non_spec_token_indx"] == [2, 3, 4, 5, 6]
    # the same inputs through the builder alone, with the counts the runner offers
    assert old["patched"]["builder"]["no_drafts_mixed"] == md


def test_spec_step_undrafted_decode_joins_the_spec_rows(old):
    md = old["patched"]["builder"]["spec_step"]
    assert md["num_spec_decodes"] == 2 and md["num_prefills"] == 2 and md["num_decodes"] == 0
    assert md["num_accepted_tokens"] == [3, 2] and md["spec_state_indices"] == [BT[0], BT[1]]
    assert md["spec_query_start_loc"] == [0, 3, 4] and md["num_spec_decode_tokens"] == 4
    assert md["has_initial_state"] == [True, False]


def test_all_zero_draft_batches_keep_the_spec_path(old):
    b = old["patched"]["builder"]
    for key in ("no_drafts_decodes", "explicit_zero_drafts"):
        md = b[key]
        assert md["num_spec_decodes"] == 2 and md["num_decodes"] == 0 and md["num_prefills"] == 0, (key, md)
        assert md["spec_state_indices"] == [BT[0], BT[1]]
    assert b["no_drafts_decodes"]["num_accepted_tokens"] == [3, 1]
    assert b["explicit_zero_drafts"]["num_accepted_tokens"] == [3, 2]
    # without the runner's counts the builder leaves a no-draft step alone
    assert b["no_drafts_no_runner"]["num_spec_decodes"] == 0
    # full-cudagraph capture of one-token rows takes the spec path too (reads column 0: accepted 1)
    cap = b["capture"]
    assert cap["num_spec_decodes"] == 2 and cap["num_decodes"] == 0
    assert cap["num_accepted_tokens"][:2] == [1, 1]


def test_warmup_run_before_full_capture_is_left_to_upstream(old):
    """Regression (issue 22, vLLM 0.23 on an H100, KV auto + MTP k=3 + FULL_AND_PIECEWISE: CUDA
    illegal memory access with the group on). The warm-up runs before a FULL graph capture
    build attention metadata from buffers that no step has filled yet: accepted 0, drafts 0.
    Upstream's all-zero gate keeps that batch off the spec path; the group used to open it,
    and the spec kernels then read state column accepted - 1 = -1. Now it leaves such runs
    alone, and a scheduled step with explicit zero drafts still takes the spec path."""
    patched, unpatched = old["patched"]["runner_warmup"], old["unpatched"]["runner_warmup"]
    assert patched == unpatched
    assert patched["num_spec_decodes"] == 0
    b = old["patched"]["builder"]
    assert b["explicit_zero_drafts_no_step"] == old["unpatched"]["builder"]["explicit_zero_drafts_no_step"]
    assert b["explicit_zero_drafts_no_step"]["num_spec_decodes"] == 0
    assert b["explicit_zero_drafts"]["num_spec_decodes"] == 2


def test_layer_spec_call_gets_the_spec_tokens_gates(old):
    lay = old["patched"]["layer"]
    a = [10.0 * t for t in range(7)]
    m = lay["tail_first"]
    assert m["spec_token_indx"] == [1, 2]  # unpatched, the kernel would read a[0:2]: r2's gate for r0
    assert m["spec_call"] == [[a[1], a[2]], [a[1] + 1, a[2] + 1]]
    assert m["other_call"] == [a, [x + 1 for x in a]]
    d = lay["decodes"]  # spec-only batch: the layer's own tensors are already the spec tokens'
    assert d["spec_call"] == [[0.0, 10.0], [1.0, 11.0]]
