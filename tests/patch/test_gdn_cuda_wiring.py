"""The CUDA-path GDN wiring (``patch/gdn_cuda.py``), checked on CPU against the installed vLLM.

vLLM 0.32 already runs zero-draft decode rows on the speculative path, so the group must skip
with the source lines as evidence; the builder wrapper for older lines is checked on its own
and on 0.32's real ``GDNAttentionMetadataBuilder.build`` with CPU tensors, and the builder's
spec metadata is fed to the CPU GDN ops to show the accepted-slot read end to end.
"""
from __future__ import annotations

import types

import pytest
import torch

from vllm_platform_ext import patching
from vllm_platform_ext.testing import gdn_cases as GC
from vllm_platform_ext.testing import gdn_harness as GH
from vllm_platform_ext.ops.gdn import torch_ops
from vllm_platform_ext.report import Report
from vllm_platform_ext.patch import gdn_cuda as G

import vllm.v1.attention.backends.gdn_attn as gdn_attn  # noqa: E402  (vLLM 0.32, what CI installs)
from vllm.v1.attention.backend import CommonAttentionMetadata  # noqa: E402

# the all-zero-draft gate of the 0.2x builders (vllm gdn_attn.py at commit 007d5005)
OLD_BUILDER_EXCERPT = """
        if (
            not self.use_spec_decode
            or num_decode_draft_tokens_cpu is None
            or num_decode_draft_tokens_cpu[num_decode_draft_tokens_cpu >= 0]
            .sum()
            .item()
            == 0
        ):
            spec_sequence_masks = None
"""


OLD_RUNNER_EXCERPT = """
        if self.num_accepted_tokens_event is not None:
            self.num_accepted_tokens_event.synchronize()
            self.num_accepted_tokens.copy_to_gpu()
        is_prefilling = num_computed_tokens_cpu < num_prompt_tokens_cpu
            if use_spec_decode and isinstance(
                builder, (Mamba2AttentionMetadataBuilder, GDNAttentionMetadataBuilder)
            ):
                extra_attn_metadata_args = dict(
                    num_accepted_tokens=self.num_accepted_tokens.gpu[:num_reqs_padded],
                    use_spec_decode=use_spec_decode,
                    num_scheduled_tokens=scheduler_output.num_scheduled_tokens,
"""
OLD_LAYER_EXCERPT = """
                fused_sigmoid_gating_delta_rule_update(
                    A_log=self.A_log,
                    a=a,
                    b=b,
                    cu_seqlens=spec_query_start_loc[  # type: ignore[index]
                        : attn_metadata.num_spec_decodes
                    ],
                    num_accepted_tokens=num_accepted_tokens,
"""


def test_probe_finds_the_upstream_fix_and_skips():
    p = G.probe()
    assert p["runner_fix"] and p["builder_spec_mask"] and p["builder_sum_gate"] is None, p
    for key, needle in (("runner_fix", "zero_draft_decode_mask"), ("builder_spec_mask", ">= 0")):
        path, line = p[key].rsplit(":", 1)
        with open(path) as f:
            assert needle in f.read().splitlines()[int(line) - 1]
    reason = G.skip_reason()
    assert reason and "already" in reason and p["runner_fix"] in reason, reason


def test_group_is_reported_skipped_and_patches_nothing():
    report = Report()
    (group,) = G.groups()
    assert patching.apply_group(group, report) is False
    entry = report.find("patch", group.name)
    assert entry is not None and "zero_draft_decode_mask" in entry.detail
    assert not any(patching.is_patched(t) for t in G.targets())


def test_old_sum_gate_is_recognised():
    assert G._OLD_SUM_GATE.search(OLD_BUILDER_EXCERPT)
    with open(gdn_attn.__file__) as f:
        assert not G._OLD_SUM_GATE.search(f.read())


def test_spec_row_drafts():
    # rows: decode w/o drafts, 1-token LAST prompt chunk (prior state, still prefilling),
    # spec row with 2 drafts, 4-token prompt chunk, decode already marked 0
    qsl = torch.tensor([0, 1, 2, 5, 9, 10])
    prefilling = torch.tensor([False, True, False, True, False])
    drafts = torch.tensor([-1, -1, 2, -1, 0])
    out = G.spec_row_drafts(qsl, prefilling, drafts, 5, keep_sum_gate_open=True)
    assert out.tolist() == [0, -1, 2, -1, 0]
    assert drafts.tolist() == [-1, -1, 2, -1, 0], "input must not be modified"
    # no draft counts passed (a step where nobody drafted): every row starts at -1
    assert G.spec_row_drafts(qsl, prefilling, None, 5, keep_sum_gate_open=False).tolist() == [0, -1, -1, -1, 0]
    # every spec row at zero drafts: the old sum gate would drop them; one gets 1 (still >= 0)
    assert G.spec_row_drafts(qsl[:3], prefilling[:2], None, 2, keep_sum_gate_open=True).tolist() == [1, -1]
    # padded rows beyond num_reqs and unknown prefill state are left alone
    assert G.spec_row_drafts(qsl, prefilling, None, 2, keep_sum_gate_open=False).tolist() == [0, -1, -1, -1, -1]
    assert G.spec_row_drafts(qsl, None, drafts, 5, keep_sum_gate_open=False).tolist() == drafts.tolist()


def test_probe_reads_other_versions_sources():
    """The old-line patterns, checked on excerpts of the 0.23.0 sources (the real files are
    checked by tests/patch/test_gdn_cuda_wiring_old_vllm.py)."""
    files = {
        G.BUILDER_MODULE: ("b.py", OLD_BUILDER_EXCERPT + "\n spec_sequence_masks_cpu = num_decode_draft_tokens_cpu >= 0\n"),
        G.RUNNER_MODULE: ("r.py", OLD_RUNNER_EXCERPT),
        G.LAYER_LOCATIONS[0][0]: ("l.py", OLD_LAYER_EXCERPT),
    }
    p = G.probe(files.get)
    assert all(p[k] for k in G._OLD_LINE_FEATURES), p
    assert G.skip_reason(p) is None
    files[G.LAYER_LOCATIONS[0][0]] = ("l.py", OLD_LAYER_EXCERPT + "\n a_spec = a.index_select(0, spec_token_indx)\n")
    assert "not patching blind" in G.skip_reason(G.probe(files.get))


def _builder(num_spec: int):
    """vLLM's builder without its config plumbing: only what ``build`` reads on this path."""
    b = object.__new__(gdn_attn.GDNAttentionMetadataBuilder)
    b.num_spec, b.use_spec_decode, b.use_full_cuda_graph = num_spec, True, False
    b.decode_cudagraph_max_bs = 64
    b.kv_cache_spec = types.SimpleNamespace(block_size=16, num_speculative_blocks=num_spec, mamba_cache_mode="none")
    b.vllm_config = types.SimpleNamespace(cache_config=types.SimpleNamespace(mamba_cache_mode="none"))
    b.gdn_prefill_backend = "triton"
    b.device = torch.device("cpu")
    b.checkpoint_builder = types.SimpleNamespace(build=lambda m, rows: None)  # prefix-cache checkpoints: off
    return b


def _metadata(lens, seq_lens, num_spec, prefilling=None):
    n = len(lens)
    qsl = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32)
    seq = torch.tensor(seq_lens, dtype=torch.int32)
    bt = torch.arange(1, n * (num_spec + 1) + 1, dtype=torch.int32).reshape(n, num_spec + 1)
    return CommonAttentionMetadata(
        query_start_loc=qsl, query_start_loc_cpu=qsl, seq_lens=seq, num_reqs=n, num_actual_tokens=int(qsl[-1]),
        max_query_len=max(lens), max_seq_len=max(seq_lens), block_table_tensor=bt,
        slot_mapping=torch.zeros(int(qsl[-1]), dtype=torch.long), seq_lens_cpu_upper_bound=seq,
        is_prefilling=torch.tensor(prefilling if prefilling is not None else [False] * n))


def test_vllm_builder_runs_zero_draft_rows_as_spec_rows_into_our_ops():
    """0.32's builder on CPU tensors: an all-zero-draft batch keeps the spec path and the
    accepted counts; its spec metadata drives our ops to read column / offset accepted-1."""
    k = 3
    b = _builder(k)
    m = _metadata([1, 4, 1], [20, 30, 40], k)
    acc = torch.tensor([3, 1, 4], dtype=torch.int32)
    md = b.build(0, m, acc, torch.tensor([0, 3, 0], dtype=torch.int32))
    assert md.num_spec_decodes == 3 and md.num_decodes == 0 and md.num_prefills == 0
    assert md.spec_state_indices_tensor.shape == (3, k + 1)
    assert md.num_accepted_tokens.tolist() == [3, 1, 4]
    # the GDN layer's spec calls, with the builder's tensors, against the reference
    T = int(md.spec_query_start_loc[-1])
    conv_case = GC.make_conv_update_case(7, num_spec=k, lengths=[1, 4, 1], accepted=[3, 1, 4], width=4, dim=8)
    conv_case.update(query_start_loc=md.spec_query_start_loc, conv_state_indices=md.spec_state_indices_tensor[:, 0],
                     num_accepted_tokens=md.num_accepted_tokens,
                     conv_states=torch.randn(int(md.spec_state_indices_tensor.max()) + 1, 8, 3 + k))
    GH.assert_close(GH.run_and_compare(torch_ops, conv_case, torch.float32), torch.float32)
    rec_case = GC.make_recurrent_case(8, num_spec=k, lengths=[1, 4, 1], accepted=[3, 1, 4], K=8, V=8)
    rec_case.update(query_start_loc=md.spec_query_start_loc, state_indices=md.spec_state_indices_tensor,
                    num_accepted_tokens=md.num_accepted_tokens,
                    ssm_states=torch.randn(int(md.spec_state_indices_tensor.max()) + 1, *rec_case["ssm_states"].shape[1:]))
    assert rec_case["q"].shape[0] == T
    GH.assert_close(GH.run_and_compare(torch_ops, rec_case, torch.float32), torch.float32)


def test_wrapper_on_the_real_builder_reclassifies_unmarked_decode_rows():
    """The group's builder patch forced onto 0.32's builder (the group itself skips there): a
    decode row that arrives with -1 (as older runners send it) becomes a spec row with its
    accepted count; a prefilling row does not."""
    k = 2
    (group,) = G.groups()
    (bp,) = [p for p in group.build() if p.target == G.BUILD_TARGET]
    patching.apply("test-" + group.name, [bp])
    try:
        b = _builder(k)
        # zero-draft decode, spec row, first prompt chunk
        m = _metadata([1, 3, 5], [20, 30, 5], k, prefilling=[False, False, True])
        acc = torch.tensor([2, 1, 1], dtype=torch.int32)
        token = G._STEP_ACCEPTED.set(acc)  # inside a scheduled step, as the runner patch sets it
        try:
            md = gdn_attn.GDNAttentionMetadataBuilder.build(b, 0, m, acc, torch.tensor([-1, 2, -1], dtype=torch.int32))
        finally:
            G._STEP_ACCEPTED.reset(token)
        assert md.num_spec_decodes == 2 and md.num_prefills == 1
        assert md.num_accepted_tokens.tolist() == [2, 1]
        assert md.spec_state_indices_tensor.tolist() == [[1, 2, 3], [4, 5, 6]]
    finally:
        patching.restore("test-" + group.name)
    assert not patching.is_patched(G.BUILD_TARGET)
    # unpatched, the same input leaves the decode row on the plain path (column 0, no offset)
    md = gdn_attn.GDNAttentionMetadataBuilder.build(_builder(k), 0, _metadata([1, 3, 5], [20, 30, 5], k),
                                                    torch.tensor([2, 1, 1], dtype=torch.int32),
                                                    torch.tensor([-1, 2, -1], dtype=torch.int32))
    assert md.num_spec_decodes == 1
