"""CUDA-path GDN wiring: zero-draft decode rows must run the speculative path.

After a verify step that accepted ``a`` tokens, a request's recurrent state is in block-table
column ``a-1`` and its conv window at offset ``a-1``; only vLLM's speculative GDN path reads
them there. When the next step gives the request no drafts (ngram / suffix / prompt-lookup
proposers do this), older vLLM lines class the row as a plain decode, which reads column 0
and offset 0: stale state (vllm#39273, PR #40738, seeds/000).

vLLM 0.32/0.33 fixed it by keeping such rows speculative with zero drafts: the runner marks
them ``num_decode_draft_tokens = 0`` (``zero_draft_decode_mask``), passes the accepted counts
on every step of a speculative config, and the builder selects spec rows with ``>= 0`` and
runs the spec path even when every row drafted nothing. The probes below look for exactly
that in the installed sources and skip the group with the lines found as evidence.

On the older lines (run against the real vLLM 0.23.0 and, from their wheels, 0.27-0.31; the probes
also match the 0.19.0 and 0.26.0 sources) three places lack it. The group patches the runner and the
builder, and the layer where it is old (0.19-0.27; 0.28+ fixed the layer, PR #51812). 0.29-0.31 spell the
builder's sum gate through the mask they have just built; before 2026-12-07 the probe missed that and the
fixed layer, took 0.28-0.31 for "neither old nor fixed" and left them unpatched:

* runner, ``GPUModelRunner._build_attention_metadata``: passes ``num_accepted_tokens`` to the
  GDN builder only when some request has drafts this step (``if use_spec_decode and
  isinstance(builder, ...)``). The runner keeps the accepted counts current on every step
  (``_prepare_inputs`` copies them to ``self.num_accepted_tokens`` whenever speculative tokens
  are configured); the wrapper offers them to the GDN builder for the duration of the call
  (a context variable), so other builders (Mamba2) see nothing new. It does so only for a
  scheduled step (the call that passes ``num_scheduled_tokens``), never for ``_dummy_run``
  (profiling, warm-up, graph capture): there the buffers hold zeros or stale values, and
  upstream's own all-zero gate is what keeps those batches off the spec path. Opening that
  gate in the warm-up runs before a FULL graph capture (``force_attention``, buffers still
  zero) made the spec kernels read state column ``0 - 1``: the CUDA illegal memory access of
  KV auto + MTP k=3 + FULL_AND_PIECEWISE on vLLM 0.23. During a capture itself the builder's
  ``build_for_cudagraph_capture`` passes consistent counts (accepted = query length), and
  one-token rows are captured on the spec path, as scheduled steps run them. The builder
  wrapper changes nothing outside a scheduled step or a capture.
* builder, ``GDNAttentionMetadataBuilder.build``: decode rows without drafts arrive as ``-1``
  (or with no draft counts at all). The wrapper marks one-token rows that are not prefilling
  (``common_attn_metadata.is_prefilling``, the runner's ``num_computed < num_prompt``: the
  same test as 0.32's ``zero_draft_decode_mask``) as zero-draft spec rows, takes the accepted
  counts from the runner when none were passed, and keeps the builder's all-zero-draft sum gate
  from discarding them. A one-token last prompt chunk is prefilling, so it stays a non-spec row
  (a prefill with initial state, as upstream does).
* layer, ``QwenGatedDeltaNetAttention._forward_core`` (0.19: ``gdn_linear_attn.GatedDeltaNetAttention``): in a batch that mixes spec rows with
  prefills, its spec call of ``fused_sigmoid_gating_delta_rule_update`` passes the gates
  ``a``/``b`` of the whole batch, not of the spec tokens (upstream fixed it in PR #51812 with
  ``a.index_select(0, spec_token_indx)``). Rerouting zero-draft rows creates such mixed batches
  on steps without drafts, so the group selects the spec tokens' gates for that call.

Model runner v2 (``vllm/v1/worker/gpu/``): the CUDA default from 0.29 wherever it supports the config
(MTP does; ngram from 0.32; ``runner_choice``), the only runner of 0.34. Its ``model_states/mamba_hybrid.py``
keeps decode rows without drafts as spec rows from 0.32 (0.34: the probe skips with that line as evidence);
on 0.27-0.31 it marks them -1 (a decode row has no drafts under MTP where the scheduler trims them: a request
at its length limit, a token budget spent). There the group also wraps ``MambaHybridModelState.prepare_attn``,
which passes the accepted counts itself: inside it the builder wrapper makes such rows zero-draft spec rows,
and a capture is marked as the V1 runner's is. v2 of 0.22-0.26 (opt-in there) is not covered, nor the ROCm
``_forward_core_rocm`` path.
"""
from __future__ import annotations

import contextvars
import importlib.util
import inspect
import re
from typing import Any, Callable

from vllm_platform_ext.patching import Patch, PatchGroup
from vllm_platform_ext.patch.sources import module_source, read_safely

BUILDER_MODULE = "vllm.v1.attention.backends.gdn_attn"
RUNNER_MODULE = "vllm.v1.worker.gpu_model_runner"
# where the GDN layer lives: 0.2x (gdn/ package), 0.19 (one module); the first that exists is used
LAYER_LOCATIONS = (
    ("vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn", "QwenGatedDeltaNetAttention"),
    ("vllm.model_executor.layers.mamba.gdn_linear_attn", "GatedDeltaNetAttention"),
)
BUILD_TARGET = f"{BUILDER_MODULE}:GDNAttentionMetadataBuilder.build"
RUNNER_TARGET = f"{RUNNER_MODULE}:GPUModelRunner._build_attention_metadata"
LAYER_MODULE = "<gdn layer module>"  # probe() key for the module found in LAYER_LOCATIONS

# upstream evidence (0.32/0.33)
_RUNNER_FIX = re.compile(r"zero_draft_decode_mask\s*=")
_BUILDER_SPEC_MASK = re.compile(r"spec_sequence_masks(_cpu)?\s*=\s*num_decode_draft_tokens_cpu\s*>=\s*0")
# the old gate that sends an all-zero-draft batch down the plain path (0.19-0.28; 0.29-0.31 index the same
# rows through the mask they have just built)
_OLD_SUM_GATE = re.compile(r"num_decode_draft_tokens_cpu\[\s*(?:num_decode_draft_tokens_cpu\s*>=\s*0|"
                           r"spec_sequence_masks_cpu)\s*\]\s*\.sum\(\)\s*\.item\(\)\s*==\s*0", re.S)
# model runner v2 (0.33+; the only runner of 0.34): decode rows without drafts stay spec rows
V2_MODULE = "vllm.v1.worker.gpu.model_states.mamba_hybrid"
_V2_ZERO_DRAFT_FIX = re.compile(r"np\.where\(\s*is_decode,\s*num_draft_tokens_per_req,\s*-1\s*\)")
# model runner v2 of 0.27-0.31: only rows that drafted are spec rows (the CUDA default for MTP from 0.29)
_V2_OLD_MASK = re.compile(r"spec_decode_mask\s*=\s*\(\s*num_draft_tokens_per_req\s*>\s*0\s*\)\s*&\s*is_decode")
V2_TARGET = f"{V2_MODULE}:MambaHybridModelState.prepare_attn"
# old runner: GDN builders get the accepted counts only on steps where some request drafted
_RUNNER_GATE = re.compile(r"if\s+use_spec_decode\s+and\s+isinstance\(\s*builder,\s*\([^)]*GDNAttentionMetadataBuilder",
                          re.S)
_RUNNER_PASSES_ACCEPTED = re.compile(r"num_accepted_tokens\s*=\s*self\.num_accepted_tokens\.gpu\[\s*:\s*num_reqs_padded\s*\]")
# ... although it refreshes them on every step (in _prepare_inputs, whenever spec tokens are configured)
_RUNNER_SYNCS_ACCEPTED = re.compile(r"self\.num_accepted_tokens_event\.synchronize\(\).*?"
                                    r"self\.num_accepted_tokens\.copy_to_gpu\(\)", re.S)
# what the builder wrapper reads to tell a decode row from a one-token prompt chunk
_RUNNER_IS_PREFILLING = re.compile(r"is_prefilling\s*=\s*num_computed_tokens_cpu\s*<\s*num_prompt_tokens_cpu")
# how the runner wrapper tells a scheduled step from a dummy run: only execute_model passes these
_RUNNER_REAL_STEP = re.compile(r"num_scheduled_tokens\s*=\s*scheduler_output\.num_scheduled_tokens")
# old layer: the spec call takes the gates of the whole batch
_LAYER_SPEC_GATES = re.compile(r"fused_sigmoid_gating_delta_rule_update\(\s*A_log=self\.A_log,\s*a=a,\s*b=b,"
                               r"[^()]*?num_accepted_tokens=num_accepted_tokens", re.S)
_LAYER_SPEC_GATES_FIXED = re.compile(r"\ba\.index_select\(\s*0,\s*spec_token_indx\s*\)")

_RUNNER_FEATURES = ("runner_gate", "runner_passes_accepted", "runner_syncs_accepted", "runner_is_prefilling",
                    "runner_real_step")
_OLD_LINE_FEATURES = ("builder_spec_mask", "builder_sum_gate", *_RUNNER_FEATURES)

# the runner's accepted counts during a scheduled step, offered to the GDN builder (runner patch ->
# builder patch); CAPTURE during a CUDA graph capture; None otherwise (dummy and warm-up runs, a
# builder called on its own)
_STEP_ACCEPTED: contextvars.ContextVar = contextvars.ContextVar("gdn_cuda_step_accepted", default=None)
# the GDN metadata of the layer whose _forward_core is running (layer patch -> gating patch)
_LAYER_METADATA: contextvars.ContextVar = contextvars.ContextVar("gdn_cuda_layer_metadata", default=None)
CAPTURE = "cudagraph-capture"
# a scheduled step of model runner v2, which passes the accepted counts to the builder itself
V2_STEP = "model-runner-v2-step"


def _line_of(text: str, m: re.Match) -> int:
    return text.count("\n", 0, m.start()) + 1


def _exists(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def layer_location(exists: Callable[[str], bool] = _exists) -> tuple[str, str]:
    for module, cls in LAYER_LOCATIONS:
        if exists(module):
            return module, cls
    return LAYER_LOCATIONS[0]


def targets() -> tuple[str, str, str, str]:
    """Four of the group's targets: builder, V1 runner, layer ``_forward_core``, layer's gating kernel name (the
    layer's two are patched where it is old; v2's ``prepare_attn``, :data:`V2_TARGET`, where v2 is old)."""
    module, cls = layer_location()
    return (BUILD_TARGET, RUNNER_TARGET, f"{module}:{cls}._forward_core",
            f"{module}:fused_sigmoid_gating_delta_rule_update")


def probe(sources: Callable[[str], tuple[str, str] | None] = module_source) -> dict[str, Any]:
    """What the installed vLLM does with zero-draft decode rows (reads sources, imports nothing).

    Each key holds ``path:line`` of the code found, or None. ``sources`` maps a module name to
    ``(path, text)`` (tests point it at other vLLM versions' files)."""
    checks = {
        "runner_fix": (RUNNER_MODULE, _RUNNER_FIX),
        "runner_gate": (RUNNER_MODULE, _RUNNER_GATE),
        "runner_passes_accepted": (RUNNER_MODULE, _RUNNER_PASSES_ACCEPTED),
        "runner_syncs_accepted": (RUNNER_MODULE, _RUNNER_SYNCS_ACCEPTED),
        "runner_is_prefilling": (RUNNER_MODULE, _RUNNER_IS_PREFILLING),
        "runner_real_step": (RUNNER_MODULE, _RUNNER_REAL_STEP),
        "builder_spec_mask": (BUILDER_MODULE, _BUILDER_SPEC_MASK),
        "builder_sum_gate": (BUILDER_MODULE, _OLD_SUM_GATE),
        "layer_spec_gates": (LAYER_MODULE, _LAYER_SPEC_GATES),
        "layer_spec_gates_fixed": (LAYER_MODULE, _LAYER_SPEC_GATES_FIXED),
        "v2_runner_fix": (V2_MODULE, _V2_ZERO_DRAFT_FIX),
        "v2_runner_old": (V2_MODULE, _V2_OLD_MASK),
    }
    out: dict[str, Any] = dict.fromkeys(checks)
    texts: dict[str, tuple[str, str] | None] = {}
    layer_module = layer_location(lambda mod: read_safely(sources, mod) is not None)[0]
    for key, (module, pattern) in checks.items():
        module = layer_module if module == LAYER_MODULE else module
        if module not in texts:
            texts[module] = read_safely(sources, module)
        src = texts[module]
        if src:
            m = pattern.search(src[1])
            if m:
                out[key] = f"{src[0]}:{_line_of(src[1], m)}"
    return out


def skip_reason(p: dict[str, Any] | None = None) -> str | None:
    p = probe() if p is None else p
    if p["runner_fix"] and p["builder_spec_mask"] and not p["builder_sum_gate"] and not p["v2_runner_old"]:
        return ("upstream already runs zero-draft decode rows on the speculative path: "
                f"runner zero_draft_decode_mask at {p['runner_fix']}, builder '>= 0' spec mask at "
                f"{p['builder_spec_mask']}, no all-zero-draft sum gate")
    if (p["v2_runner_fix"] and p["builder_spec_mask"] and not p["builder_sum_gate"]
            and not any(p[k] for k in _RUNNER_FEATURES)):
        return ("upstream already runs zero-draft decode rows on the speculative path: model runner v2 only "
                f"(no V1 GPUModelRunner), its decode rows without drafts stay spec rows at {p['v2_runner_fix']}, "
                f"builder '>= 0' spec mask at {p['builder_spec_mask']}, no all-zero-draft sum gate")
    missing = [k for k in _OLD_LINE_FEATURES if not p[k]]
    layer_known = bool(p["layer_spec_gates"]) != bool(p["layer_spec_gates_fixed"])
    if p["runner_fix"] or missing or not layer_known:
        found = {k: v for k, v in p.items() if v}
        return ("installed vLLM matches neither the fixed (0.32+) nor the old (0.19-0.31) GDN code; "
                f"not patching blind: old-line features missing {missing}"
                f"{'' if layer_known else ', the layer neither old nor fixed'}, found {found}")
    return None


def layer_needs_patch(p: dict[str, Any] | None = None) -> bool:
    """The layer's spec call still takes the whole batch's gates (0.19-0.27); 0.28+ select the spec
    tokens' gates themselves (PR #51812), so only the runner and the builder are patched there."""
    p = probe() if p is None else p
    return bool(p["layer_spec_gates"]) and not p["layer_spec_gates_fixed"]


def spec_row_drafts(query_start_loc_cpu, is_prefilling, num_decode_draft_tokens_cpu, num_reqs: int,
                    keep_sum_gate_open: bool):
    """The draft counts the builder should see (a new tensor; the input is not modified).

    Rows marked ``-1`` (or all rows, when ``num_decode_draft_tokens_cpu`` is None) that are
    decode rows -- one token, not prefilling -- become ``0``: spec rows with zero drafts. With
    ``is_prefilling`` None nothing is reclassified. With ``keep_sum_gate_open`` and every spec
    row at zero drafts, one of them is given ``1``: the old builder reads the counts only
    through ``>= 0`` and through its ``.sum() == 0`` gate, so classification is unchanged and
    the gate stays open."""
    import torch

    if num_decode_draft_tokens_cpu is None:
        drafts = torch.full((query_start_loc_cpu.shape[0] - 1,), -1, dtype=torch.int32)
    else:
        drafts = num_decode_draft_tokens_cpu.clone()
    n = min(num_reqs, drafts.shape[0])
    if is_prefilling is not None:
        qlens = (query_start_loc_cpu[1:n + 1] - query_start_loc_cpu[:n]).to(drafts.device)
        decode = (qlens == 1) & ~is_prefilling[:n].to(device=drafts.device, dtype=torch.bool)
        head = drafts[:n]
        head[(head < 0) & decode] = 0
    spec = drafts >= 0
    if keep_sum_gate_open and bool(spec.any()) and int(drafts[spec].sum()) == 0:
        drafts[int(torch.nonzero(spec)[0, 0])] = 1
    return drafts


def _make_build(orig: Callable) -> Callable:
    gate = bool(probe()["builder_sum_gate"])

    def build(self, common_prefix_len, common_attn_metadata, num_accepted_tokens=None,
              num_decode_draft_tokens_cpu=None, *args, **kwargs):
        m = common_attn_metadata
        step = _STEP_ACCEPTED.get()  # None outside a scheduled step or a capture: leave all to upstream
        if step is not None and getattr(self, "use_spec_decode", False):
            if num_accepted_tokens is None and step is not CAPTURE and step is not V2_STEP:
                num_accepted_tokens = step[: m.num_reqs]
            if num_accepted_tokens is not None:
                num_decode_draft_tokens_cpu = spec_row_drafts(
                    m.query_start_loc_cpu, getattr(m, "is_prefilling", None), num_decode_draft_tokens_cpu,
                    m.num_reqs, gate)
        return orig(self, common_prefix_len, m, num_accepted_tokens, num_decode_draft_tokens_cpu, *args, **kwargs)

    build.__wrapped__ = orig
    return build


def _in_step(step: Any, fn: Callable, *args, **kwargs) -> Any:
    """``fn(*args, **kwargs)`` with ``step`` offered to the builder wrapper (:data:`_STEP_ACCEPTED`)."""
    token = _STEP_ACCEPTED.set(step)
    try:
        return fn(*args, **kwargs)
    finally:
        _STEP_ACCEPTED.reset(token)


def _make_runner_build_attention_metadata(orig: Callable) -> Callable:
    sig = inspect.signature(orig)
    for name in ("num_reqs", "num_reqs_padded", "for_cudagraph_capture", "num_scheduled_tokens"):
        if name not in sig.parameters:
            raise TypeError(f"GPUModelRunner._build_attention_metadata has no parameter {name!r}")

    def _build_attention_metadata(self, *args, **kwargs):
        accepted = None
        if (getattr(self, "speculative_config", None) is not None
                and getattr(self, "num_accepted_tokens_event", None) is not None):
            bound = sig.bind(self, *args, **kwargs).arguments
            if bound.get("for_cudagraph_capture", False):
                accepted = CAPTURE
            elif bound.get("num_scheduled_tokens") is not None:  # execute_model; _dummy_run passes none
                n = bound.get("num_reqs_padded") or bound["num_reqs"]
                accepted = self.num_accepted_tokens.gpu[:n]
        return _in_step(accepted, orig, self, *args, **kwargs)

    _build_attention_metadata.__wrapped__ = orig
    return _build_attention_metadata


def _make_v2_prepare_attn(orig: Callable) -> Callable:
    """Model runner v2 (0.27-0.31): its ``prepare_attn`` hands the GDN builder the accepted counts on every
    scheduled step but marks a decode row without drafts ``-1``; inside it the builder wrapper makes such rows
    zero-draft spec rows, as 0.32+ do themselves. A capture (``for_capture``) is marked as the V1 runner's is,
    so one-token rows are captured on the path their replays take."""
    sig = inspect.signature(orig)
    if "for_capture" not in sig.parameters:
        raise TypeError("MambaHybridModelState.prepare_attn has no parameter 'for_capture'")

    def prepare_attn(self, *args, **kwargs):
        capture = sig.bind(self, *args, **kwargs).arguments.get("for_capture", False)
        return _in_step(CAPTURE if capture else V2_STEP, orig, self, *args, **kwargs)

    prepare_attn.__wrapped__ = orig
    return prepare_attn


def _make_forward_core(orig: Callable) -> Callable:
    from vllm.forward_context import get_forward_context

    def _forward_core(self, *args, **kwargs):
        md = get_forward_context().attn_metadata
        md = md.get(self.prefix) if isinstance(md, dict) else None
        token = _LAYER_METADATA.set(md)
        try:
            return orig(self, *args, **kwargs)
        finally:
            _LAYER_METADATA.reset(token)

    _forward_core.__wrapped__ = orig
    return _forward_core


def _make_gating(orig: Callable) -> Callable:
    def fused_sigmoid_gating_delta_rule_update(*args, **kwargs):
        md = _LAYER_METADATA.get()
        if (md is not None and kwargs.get("num_accepted_tokens") is not None
                and getattr(md, "spec_sequence_masks", None) is not None
                and (md.num_prefills > 0 or md.num_decodes > 0)
                and kwargs.get("a") is not None and kwargs.get("b") is not None):
            # the layer's mixed-batch condition for index-selecting the spec tokens' qkv
            idx = md.spec_token_indx
            kwargs["a"] = kwargs["a"].index_select(0, idx)
            kwargs["b"] = kwargs["b"].index_select(0, idx)
        return orig(*args, **kwargs)

    fused_sigmoid_gating_delta_rule_update.__wrapped__ = orig
    return fused_sigmoid_gating_delta_rule_update


def _patches() -> list[Patch]:
    build, runner, core, gating = targets()
    p = probe()
    patches = [Patch(build, _make_build), Patch(runner, _make_runner_build_attention_metadata)]
    if layer_needs_patch(p):
        patches += [Patch(core, _make_forward_core), Patch(gating, _make_gating)]
    if p["v2_runner_old"]:
        patches.append(Patch(V2_TARGET, _make_v2_prepare_attn))
    return patches


def groups() -> list[PatchGroup]:
    return [
        PatchGroup(
            name="gdn.cuda_zero_draft_spec_rows",
            why="zero-draft decode rows read the accepted SSM slot / conv offset (spec path), vllm#39273",
            build=_patches,
            skip_if=skip_reason,
            targets=(BUILD_TARGET, RUNNER_TARGET, V2_TARGET, *(f"{m}:{c}._forward_core" for m, c in LAYER_LOCATIONS),
                     *(f"{m}:fused_sigmoid_gating_delta_rule_update" for m, _ in LAYER_LOCATIONS)),
            upstream="vllm#39273 / PR #40738 (seeds/000); vLLM 0.32 runs such rows on the spec path itself "
                     "(runner zero_draft_decode_mask, builder '>= 0' spec mask), 0.34's model runner v2 too; the "
                     "layer's spec-token gates: PR #51812 (0.28+, where only the runner and builder are patched)",
            retire="probe: the runner's zero_draft_decode_mask (or, without a V1 runner, model runner v2's "
                   "zero-draft spec rows) and the builder's '>= 0' spec mask present and no all-zero-draft sum "
                   "gate -> skipped as not needed (vLLM 0.32+); lines 0.22-0.31 are tested on their own code",
        )
    ]


GROUPS: list[PatchGroup] = groups()
