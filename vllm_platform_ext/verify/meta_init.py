"""The one-rank distributed state vLLM needs to build a model on the ``meta`` device in this process
(doctor MODEL_PATH: verify/checkpoint_doctor.py, verify/align_settings.py)."""
from __future__ import annotations


def init_distributed(vllm_config) -> None:
    import tempfile

    from vllm.config import set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.distributed.parallel_state import model_parallel_is_initialized

    if model_parallel_is_initialized():
        return
    with set_current_vllm_config(vllm_config):
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                     distributed_init_method=f"file://{tempfile.mkdtemp()}/init")
        initialize_model_parallel(1, 1)
