"""Child of tests/test_platform_lines.py::test_maca_platform_calls_on_each_line: run with one vLLM
line's own Python first on ``PYTHONPATH`` and the fake MXSML library (two devices), it calls every
``MacaPlatform`` method vLLM's engine start-up and worker set-up call on a host without CUDA, and the
class paths it hands vLLM are resolved. Methods that only drive CUDA itself (``set_device``,
``get_current_memory_usage``, ``manual_seed_all``, the torch.distributed group) are left out: they call
torch.cuda only. Prints one JSON line: each call's result or its error."""
from __future__ import annotations

import json
import os
import traceback

os.environ.setdefault("FAKE_MXSML_COUNT", "2")


def main() -> None:
    import torch
    import vllm

    out: dict = {"vllm": vllm.__version__, "calls": {}, "errors": {}}
    try:
        from vllm.config import VllmConfig
        from vllm.utils.import_utils import resolve_obj_by_qualname
    except ImportError:  # older lines keep it in vllm.utils
        from vllm.config import VllmConfig
        from vllm.utils import resolve_obj_by_qualname
    import vllm.platforms as platforms

    from vllm_platform_ext.platform import MacaPlatform as P

    platforms._current_platform = P()  # what vLLM resolves where our platform plugin answers (MetaX host)

    calls = {
        "device_count": P.device_count,
        "get_device_capability": lambda: P.get_device_capability(0),
        "get_device_capability(1)": lambda: P.get_device_capability(1),
        "get_device_name": lambda: P.get_device_name(0),
        "get_device_uuid": lambda: P.get_device_uuid(1),
        "get_device_total_memory": lambda: P.get_device_total_memory(0),
        "has_device_capability": lambda: P.has_device_capability(80),
        "is_fully_connected": lambda: P.is_fully_connected([0, 1]),
        "get_device_numa_node": lambda: P.get_device_numa_node(0),
        "log_warnings": P.log_warnings,
        "import_kernels": P.import_kernels,
        "is_pin_memory_available": P.is_pin_memory_available,
        "supports_fp8": P.supports_fp8,
        "check_if_supports_dtype": lambda: P.check_if_supports_dtype(torch.bfloat16),
        "pre_register_and_update": lambda: P.pre_register_and_update(None),
        "check_and_update_config": lambda: P.check_and_update_config(VllmConfig()),
        "support_static_graph_mode": P.support_static_graph_mode,
        "support_hybrid_kv_cache": P.support_hybrid_kv_cache,
        "use_custom_allreduce": P.use_custom_allreduce,
        "opaque_attention_op": P.opaque_attention_op,
        "is_cuda_alike": lambda: P().is_cuda_alike(),
        "device_id_to_physical_device_id": lambda: P.device_id_to_physical_device_id(1),
        "get_punica_wrapper": lambda: resolve_obj_by_qualname(P.get_punica_wrapper()).__name__,
        "get_device_communicator_cls": lambda: resolve_obj_by_qualname(P.get_device_communicator_cls()).__name__,
        "get_static_graph_wrapper_cls": lambda: resolve_obj_by_qualname(P.get_static_graph_wrapper_cls()).__name__,
    }
    for name, fn in calls.items():
        try:
            out["calls"][name] = repr(fn())
        except Exception as exc:
            out["errors"][name] = f"{type(exc).__name__}: {exc} | {traceback.format_exc().splitlines()[-3]}"
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main()
