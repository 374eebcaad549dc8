"""Child of the CUDA-path GDN wiring tests (``patch/gdn_cuda.py``) on a real vLLM line's own code:
run by tests/patch/test_gdn_cuda_wiring_old_vllm.py in the old-vLLM venv (0.23.0) and by
tests/patch/test_gdn_cuda_lines.py with a line's wheel first on ``PYTHONPATH`` (``conftest.run_line_child``).
It imports the line's real ``GDNAttentionMetadataBuilder`` (built through its own ``__init__``),
``GPUModelRunner._build_attention_metadata`` and GDN layer module, applies the patch group, runs the
scenarios on CPU tensors and prints the results as one ``JSON`` line. It imports no pytest (the old venv has none).

Batch used (K = 3 speculative tokens, block-table row i = [10i+1 .. 10i+4], decode rows first
as the runner orders them):
  r0  decode, no drafts, previous step accepted 3    (state in block 3 / conv offset 2)
  r1  decode, no drafts, previous step accepted 1
  r2  one-token LAST prompt chunk (16 of 17 prompt tokens computed): must stay a prefill
  r3  first prompt chunk, 4 tokens, no prior state
"""
from __future__ import annotations

import json

K = 3
BT = [[10 * i + j for j in range(1, K + 2)] for i in range(4)]
PREFIX = "model.layers.0.linear_attn"


def _old_side() -> dict:  # runs on the line's own vLLM
    import dataclasses
    import types

    import torch

    import vllm
    from vllm.config import CUDAGraphMode
    from vllm.v1.attention.backend import CommonAttentionMetadata
    from vllm.v1.attention.backends import gdn_attn
    from vllm.v1.kv_cache_interface import MambaSpec
    from vllm.v1.worker import gpu_model_runner as runner_mod
    from line_pins import no_pinned_memory

    no_pinned_memory()

    from vllm_platform_ext import patching
    from vllm_platform_ext.report import Report
    from vllm_platform_ext.patch import gdn_cuda as G

    NS = types.SimpleNamespace
    out: dict = {"vllm": vllm.__version__, "probe": G.probe(), "skip": G.skip_reason(), "targets": list(G.targets()),
                 "layer_needs_patch": G.layer_needs_patch()}

    def builder(full_cudagraph=False):
        mode = CUDAGraphMode.FULL_AND_PIECEWISE if full_cudagraph else CUDAGraphMode.NONE
        cfg = NS(compilation_config=NS(cudagraph_mode=mode, max_cudagraph_capture_size=None),
                 speculative_config=NS(num_speculative_tokens=K, parallel_drafting=False,
                                         use_eagle_block_drop=lambda: False),  # 0.33 reads it
                 scheduler_config=NS(max_num_seqs=8), cache_config=NS(mamba_cache_mode="none"),
                 parallel_config=NS(decode_context_parallel_size=1), additional_config={},
                 model_config=NS(hf_text_config=NS()),  # 0.33 reads the head dims (absent: Triton prefill)
                 use_v2_model_runner=False)  # 0.29+ read it (V1: the runner ngram drafting takes)
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

    fields = {f.name for f in dataclasses.fields(CommonAttentionMetadata)}

    def common(b):  # as GPUModelRunner._build_attention_metadata (0.23) fills it; 0.29+ keep no CPU copies
        kw = dict(
            query_start_loc=b["qsl"], query_start_loc_cpu=b["qsl"], seq_lens=b["seq"], _seq_lens_cpu=b["seq"],
            _num_computed_tokens_cpu=b["computed"], seq_lens_cpu_upper_bound=b["seq"], num_reqs=b["n"],
            num_actual_tokens=b["T"], max_query_len=int((b["qsl"][1:] - b["qsl"][:-1]).max()),
            max_seq_len=int(b["seq"].max()), block_table_tensor=b["bt"],
            slot_mapping=torch.zeros(b["T"], dtype=torch.long), causal=True,
            is_prefilling=b["computed"] < b["prompt"], positions=torch.zeros(b["T"], dtype=torch.long))
        return CommonAttentionMetadata(**{k: v for k, v in kw.items() if k in fields})

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
        # the inputs vLLM 0.33's fixed runner hands the builder for the same steps (its zero_draft_decode_mask
        # marks r0/r1 with 0 drafts; it passes the accepted counts on every step): on 0.33 this is upstream's
        # own answer, which the patched older lines must reproduce
        r["upstream_form_no_drafts_mixed"] = summary(B(builder(), 0, common(mixed), accepted4,
                                                       torch.tensor([0, 0, -1, -1], dtype=torch.int32)))
        acc = torch.tensor([3, 2, 1, 1], dtype=torch.int32)
        r["upstream_form_spec_step"] = summary(B(builder(), 0, common(spec_step), acc,
                                                 torch.tensor([2, 0, -1, -1], dtype=torch.int32)))
        # full-cudagraph capture of one-token rows goes down the same path as the replays
        r["capture"] = in_step(G.CAPTURE, lambda: builder(full_cudagraph=True).build_for_cudagraph_capture(
            common(decodes)))
        return r

    def attn_group(bld):
        """One attention group of the GDN layer, as the runners hold it (0.33 builds through the group: its kernel
        block table is the same here)."""
        return NS(get_metadata_builder=lambda ubid=0: bld, kv_cache_spec=bld.kv_cache_spec, layer_names=[PREFIX],
                  build_metadata=lambda cm, ubid=0, common_prefix_len=0, **kw: bld.build(common_prefix_len, cm, **kw),
                  build_metadata_for_cudagraph_capture=lambda cm, ubid=0: bld.build_for_cudagraph_capture(cm))

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
            attn_groups=[[attn_group(bld)]],
            max_model_len=4096, optimistic_seq_lens_cpu=b["seq"], device=torch.device("cpu"),
            input_batch=NS(block_table=[NS(get_device_tensor=lambda n: b["bt"][:n])],
                           num_computed_tokens_cpu_tensor=b["computed"], num_prompt_tokens_cpu_tensor=b["prompt"]),
            routed_experts_initialized=False, use_async_spec_decode=False, dcp_world_size=1,
            query_start_loc=NS(gpu=b["qsl"], cpu=b["qsl"]), seq_lens=b["seq"],
            positions=torch.zeros(b["T"], dtype=torch.long),
            cache_config=NS(kv_sharing_fast_prefill=False, use_replayssm=False),
            model_config=NS(rswa_window=None),  # 0.26+ read these two (a model without reference-SWA / replay SSM)
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

    def v2_runs():
        """Model runner v2's real ``MambaHybridModelState.prepare_attn`` (the CUDA default for MTP from 0.29) on
        a stand-in state and input batch, through the line's real ``build_attn_metadata`` and builder: a step
        where no request drafted, a step where r0 drafted 2 and r1 nothing, and a capture of one-token rows.
        None where the group does not read the line's v2 (0.22-0.26: opt-in there, another signature)."""
        import importlib

        import numpy as np

        if not (out["probe"]["v2_runner_old"] or out["probe"]["v2_runner_fix"]):
            return None
        try:
            mh = importlib.import_module("vllm.v1.worker.gpu.model_states.mamba_hybrid")
            prepare = mh.MambaHybridModelState.prepare_attn
        except (ImportError, AttributeError):
            return None
        no_pinned_memory()  # the modules just imported hold their own copies
        bld = builder()
        accepted_by_req = torch.tensor([3, 1, 1, 1], dtype=torch.int32)  # request state rows 0-3

        def run(b, drafts, for_capture=False):
            qlens = b["qsl"].diff()
            state = NS(vllm_config=NS(num_speculative_tokens=K), num_accepted_tokens_gpu=accepted_by_req.clone(),
                       max_model_len=4096, _align_mode=False, recoverssm=None)
            ib = NS(num_reqs=b["n"], num_tokens=b["T"], num_reqs_after_padding=b["n"], num_tokens_after_padding=b["T"],
                    query_start_loc_np=b["qsl"].numpy(), query_start_loc=b["qsl"], max_query_len=int(qlens.max()),
                    num_scheduled_tokens=qlens.numpy().astype(np.int32), seq_lens_cpu_upper_bound=b["seq"],
                    is_prefilling_np=(b["computed"] < b["prompt"]).numpy(), prefill_runs_as_decode_np=None,
                    idx_mapping=torch.arange(b["n"], dtype=torch.long),
                    num_draft_tokens_per_req=None if drafts is None else np.array(drafts, dtype=np.int32),
                    seq_lens=b["seq"], dcp_local_seq_lens=None, positions=torch.zeros(b["T"], dtype=torch.long),
                    prompt_lens=b["prompt"])
            md = prepare(state, ib, CUDAGraphMode.NONE, (b["bt"],), torch.zeros(1, b["T"], dtype=torch.long),
                         [[attn_group(bld)]],
                         NS(kv_cache_groups=[NS(kv_cache_spec=bld.kv_cache_spec)]), for_capture=for_capture)
            return summary(md[PREFIX])

        return dict(no_drafts=run(mixed, None), spec_step=run(spec_step, [2, 0, 0, 0]),
                    capture=run(decodes, None, for_capture=True))

    def old(fn):  # what the unpatched old line does
        return fn()

    out["unpatched"] = dict(builder=old(builder_runs), runner_no_drafts=runner_run(False),
                            runner_warmup=runner_run(True, dummy=True), v2=v2_runs())
    report = Report()
    (group,) = G.groups()
    out["applied"] = patching.apply_group(group, report)
    entry = report.find("patch", group.name)
    out["report"] = entry.detail if entry else None
    out["patched_targets"] = patching.applied_targets(group.name)
    try:
        out["patched"] = dict(builder=builder_runs(), runner_no_drafts=runner_run(False),
                              runner_warmup=runner_run(True, dummy=True), v2=v2_runs())
        if out["layer_needs_patch"]:
            out["patched"]["layer"] = layer_run()
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




if __name__ == "__main__":
    import vllm as _vllm

    print("JSON " + json.dumps(dict(_old_side(), file=_vllm.__file__)))
