"""Child of tests/patch/test_turboquant_v2_capture.py, run on one vLLM line's own Python (0.29+: model runner v2).

The line's ``CudaGraphManager._init_candidates`` makes the capture descriptors of an MTP k=3 engine in vLLM's
default graph mode (FULL_AND_PIECEWISE); for each FULL one the line's ``InputBatch.make_dummy`` makes the dummy
batch the capture runs with the max query length the line's capture passes, and the TurboQuant route's builder
tag (``spec_verify.verify_width``) is computed on what ``MambaHybridModelState.prepare_attn`` hands the builders
at capture (CUDAGraphMode.NONE: the batch's own tokens, the CPU ``query_start_loc``, the promised or the measured
``max_query_len``, as the line spells it). Prints ``JSON{...}``.
"""
from __future__ import annotations

import inspect
import json
from types import SimpleNamespace as NS

import torch

K = 3
MAX_REQS = 64
SIZES = [1, 2, 4] + list(range(8, 257, 8)) + list(range(272, 513, 16))  # vLLM's default capture-size shape


def main() -> None:
    import vllm
    from vllm.config import CUDAGraphMode
    from vllm.v1.worker.gpu import cudagraph_utils as cu
    from vllm.v1.worker.gpu.input_batch import InputBatch

    from vllm_platform_ext.patch.turboquant import spec_verify as sv

    capture_src = inspect.getsource(cu)
    mgr = cu.CudaGraphManager.__new__(cu.CudaGraphManager)  # _init_candidates' inputs, as __init__ sets them
    spec = NS(num_speculative_tokens=K, uses_dynamic_speculative_decoding=lambda: False)
    mgr.vllm_config = NS(speculative_config=spec, num_speculative_tokens=K, cache_config=NS(use_kda_recoverssm=False),
                         parallel_config=NS(data_parallel_size=1), uniform_decode_query_len=K + 1)
    # 0.34 keys decode graphs by request count (decode_cudagraph_capture_request_sizes) and token-keyed
    # graphs by prefill_cudagraph_capture_token_sizes; 0.29-0.33 by cudagraph_capture_sizes
    mgr.compilation_config = NS(cudagraph_capture_sizes=SIZES, max_cudagraph_capture_size=max(SIZES),
                                prefill_cudagraph_capture_token_sizes=SIZES,
                                decode_cudagraph_capture_request_sizes=[1, 2, 4] + list(range(8, MAX_REQS + 1, 8)),
                                max_decode_cudagraph_capture_tokens=None)
    mgr.cudagraph_mode = CUDAGraphMode.FULL_AND_PIECEWISE
    mgr.max_num_reqs, mgr.decode_query_len, mgr.varlen_decode = MAX_REQS, K + 1, False
    mgr.decode_request_sizes, mgr.decode_max_reqs, mgr._decode_descs = None, {K + 1: MAX_REQS}, {}
    mgr.lora_capture_cases, mgr.ubatch_runner, mgr._candidates, mgr._capture_descs = [0], None, {}, {}
    mgr._init_candidates()
    full = mgr._capture_descs.get(CUDAGraphMode.FULL, [])
    n = MAX_REQS * (K + 1) + 8
    bufs = NS(device=torch.device("cpu"), seq_lens=torch.zeros(MAX_REQS + 1, dtype=torch.int32),
              query_start_loc=torch.zeros(MAX_REQS + 2, dtype=torch.int32), input_ids=torch.zeros(n, dtype=torch.long),
              positions=torch.zeros(n, dtype=torch.long), is_padding=torch.zeros(n, dtype=torch.bool))
    # what the line's capture passes as max_query_len, and what prepare_inputs_to_capture / the GDN model state's
    # prepare_attn make of it: read from the line's own source (each spelling named, anything else refused)
    from vllm.v1.worker.gpu.model_states.mamba_hybrid import MambaHybridModelState

    if "max_query_len=desc.max_query_len or desc.uniform_token_count" in capture_src:
        call = "promised"  # 0.31+: the descriptor's promise, else its uniform width
    elif "max_query_len=desc.max_query_len," in capture_src:
        call = "descriptor"  # 0.29-0.30: the descriptor's own (None for uniform decode graphs)
    else:
        raise SystemExit("capture passes max_query_len in a spelling this child does not know")
    fills_none = "if full_cudagraph and max_query_len is None:" in inspect.getsource(cu.prepare_inputs_to_capture)
    prep_src = inspect.getsource(MambaHybridModelState.prepare_attn)
    promised = "max_query_len = input_batch.max_query_len" in prep_src
    rows = []
    for d in full:
        mql = (getattr(d, "max_query_len", None) or d.uniform_token_count) if call == "promised" else d.max_query_len
        if mql is None and fills_none:
            mql = d.num_tokens
        ib = InputBatch.make_dummy(d.num_reqs, d.num_tokens, bufs, max_query_len=mql)
        qsl = torch.from_numpy(ib.query_start_loc_np)
        measured = int((qsl[1:] - qsl[:-1]).max())
        cam = NS(query_start_loc_cpu=qsl, num_actual_tokens=ib.num_tokens,
                 max_query_len=ib.max_query_len if promised and ib.max_query_len is not None else measured)
        rows.append({"num_tokens": d.num_tokens, "num_reqs": d.num_reqs, "uniform": d.uniform_token_count,
                     "max_query_len": cam.max_query_len, "tag": sv.verify_width(cam, K)})
    print("JSON" + json.dumps({"vllm": vllm.__version__, "file": vllm.__file__, "full": rows,
                               "capture_call": call, "fills_none": fills_none, "prepare_attn_promised": promised}))


if __name__ == "__main__":
    main()
