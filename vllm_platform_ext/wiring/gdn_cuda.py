"""CUDA-path GDN wiring: zero-draft decode rows must run the speculative path.

After a verify step that accepted ``a`` tokens, a request's recurrent state is in block-table
column ``a-1`` and its conv window at offset ``a-1``; only vLLM's speculative GDN path reads
them there. When the next step gives the request no drafts (ngram / suffix / prompt-lookup
proposers do this), older vLLM lines class the row as a plain decode, which reads column 0
and offset 0: stale state (vllm#39273, PR #40738, seeds/000).

vLLM 0.32/0.33 fixed it by keeping such rows speculative with zero drafts: the runner marks
them ``num_decode_draft_tokens = 0`` (``zero_draft_decode_mask``) and the builder selects spec
rows with ``>= 0`` and runs the spec path even when every row drafted nothing. The probes
below look for exactly that in the installed sources and skip the group with the lines found
as evidence.

On older lines (0.19-0.26, builder with the ``.sum() == 0`` gate) the group wraps
``GDNAttentionMetadataBuilder.build``: decode rows (one token, prior state) that arrive with
``-1`` are re-marked as zero-draft spec rows, and when every spec row has zero drafts the
builder's sum gate is kept from discarding them. Limits: the builder can only act when the
runner passes ``num_accepted_tokens`` / ``num_decode_draft_tokens_cpu`` at all; runners of
those lines skip both on steps where no request has drafts (#40738's first bug), which needs a
runner-side change that this group does not make.
"""
from __future__ import annotations

import importlib.util
import re
from typing import Any, Callable

from vllm_platform_ext.patching import Patch, PatchGroup

BUILDER_MODULE = "vllm.v1.attention.backends.gdn_attn"
RUNNER_MODULE = "vllm.v1.worker.gpu_model_runner"
BUILD_TARGET = f"{BUILDER_MODULE}:GDNAttentionMetadataBuilder.build"

# upstream evidence (0.32/0.33)
_RUNNER_FIX = re.compile(r"zero_draft_decode_mask\s*=")
_BUILDER_SPEC_MASK = re.compile(r"spec_sequence_masks(_cpu)?\s*=\s*num_decode_draft_tokens_cpu\s*>=\s*0")
# the old gate that sends an all-zero-draft batch down the plain path
_OLD_SUM_GATE = re.compile(r"num_decode_draft_tokens_cpu\[\s*num_decode_draft_tokens_cpu\s*>=\s*0\s*\]\s*"
                           r"\.sum\(\)\s*\.item\(\)\s*==\s*0", re.S)


def _source(module: str) -> tuple[str, str] | None:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    with open(spec.origin, encoding="utf-8") as f:
        return spec.origin, f.read()


def _line_of(text: str, m: re.Match) -> int:
    return text.count("\n", 0, m.start()) + 1


def probe() -> dict[str, Any]:
    """What the installed vLLM does with zero-draft decode rows (reads sources, imports nothing)."""
    out: dict[str, Any] = {"runner_fix": None, "builder_spec_mask": None, "builder_sum_gate": None}
    try:
        runner = _source(RUNNER_MODULE)
        builder = _source(BUILDER_MODULE)
    except (ImportError, ValueError):
        return out
    if runner:
        m = _RUNNER_FIX.search(runner[1])
        if m:
            out["runner_fix"] = f"{runner[0]}:{_line_of(runner[1], m)}"
    if builder:
        m = _BUILDER_SPEC_MASK.search(builder[1])
        if m:
            out["builder_spec_mask"] = f"{builder[0]}:{_line_of(builder[1], m)}"
        m = _OLD_SUM_GATE.search(builder[1])
        if m:
            out["builder_sum_gate"] = f"{builder[0]}:{_line_of(builder[1], m)}"
    return out


def skip_reason() -> str | None:
    p = probe()
    if p["runner_fix"] and p["builder_spec_mask"] and not p["builder_sum_gate"]:
        return ("upstream already runs zero-draft decode rows on the speculative path: "
                f"runner zero_draft_decode_mask at {p['runner_fix']}, builder '>= 0' spec mask at "
                f"{p['builder_spec_mask']}, no all-zero-draft sum gate")
    if not p["builder_spec_mask"]:
        return "GDN metadata builder not recognised (no '>= 0' spec-row mask); not patching blind"
    if not p["builder_sum_gate"] and not p["runner_fix"]:
        return "GDN metadata builder has neither the old sum gate nor the runner fix; not patching blind"
    return None


def reclassify_zero_draft_rows(query_start_loc_cpu, seq_lens_cpu, num_decode_draft_tokens_cpu,
                               keep_sum_gate_open: bool):
    """The draft counts the builder should see: one-token rows with prior state and ``-1``
    become ``0`` (spec rows with zero drafts). With ``keep_sum_gate_open`` and every spec row at
    zero drafts, one of them is given ``1``: the old builder uses the counts only through
    ``>= 0`` and through that gate, so the rows' classification is unchanged."""
    import torch

    drafts = num_decode_draft_tokens_cpu.clone()
    n = drafts.shape[0]
    qlens = (query_start_loc_cpu[1:] - query_start_loc_cpu[:-1])[:n].to(drafts.device)
    prior = (seq_lens_cpu[:n].to(drafts.device) - qlens) > 0
    drafts[(drafts < 0) & (qlens == 1) & prior] = 0
    spec = drafts >= 0
    if keep_sum_gate_open and bool(spec.any()) and int(drafts[spec].sum()) == 0:
        first = int(torch.nonzero(spec)[0, 0])
        drafts[first] = 1
    return drafts


def _make_build(orig: Callable) -> Callable:
    gate = bool(probe()["builder_sum_gate"])

    def build(self, common_prefix_len, common_attn_metadata, num_accepted_tokens=None,
              num_decode_draft_tokens_cpu=None, *args, **kwargs):
        m = common_attn_metadata
        if (getattr(self, "use_spec_decode", False) and num_accepted_tokens is not None
                and num_decode_draft_tokens_cpu is not None):
            seq_lens_cpu = getattr(m, "seq_lens_cpu", None)  # 0.2x
            if seq_lens_cpu is None:
                seq_lens_cpu = getattr(m, "seq_lens_cpu_upper_bound", None)  # 0.3x
            if seq_lens_cpu is None:
                seq_lens_cpu = m.seq_lens.cpu()
            num_decode_draft_tokens_cpu = reclassify_zero_draft_rows(
                m.query_start_loc_cpu, seq_lens_cpu, num_decode_draft_tokens_cpu, gate)
        return orig(self, common_prefix_len, m, num_accepted_tokens, num_decode_draft_tokens_cpu, *args, **kwargs)

    build.__wrapped__ = orig
    return build


def groups() -> list[PatchGroup]:
    return [
        PatchGroup(
            name="gdn.cuda_zero_draft_spec_rows",
            why="zero-draft decode rows read the accepted SSM slot / conv offset (spec path), vllm#39273",
            build=lambda: [Patch(BUILD_TARGET, _make_build)],
            skip_if=skip_reason,
        )
    ]


GROUPS: list[PatchGroup] = groups()
