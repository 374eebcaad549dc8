"""TurboQuant KV-cache ops (torch reference, Triton and Gluon K+1 verify attention).

``turboquant.verify_attention``: attention of a uniform K+1 speculative-verify batch (K = 0 is
plain decode) over vLLM's TurboQuant cache, all four presets. The ``config`` dicts are extra
keyword arguments the wiring passes to the op (empty = the per-preset launch tables and shape
rules in ``triton_verify``; k8v4 takes the explicit-layout Gluon kernel on NVIDIA SM >= 8.9).
MACA (MetaX) gets the Triton kernel with a conservative 4 warps and single-stage pipelining
until it is measured there (the Gluon kernel's PTX is NVIDIA's).
"""
from vllm_platform_ext.ops.dispatch import OpImpl

_VERIFY = "vllm_platform_ext.ops.turboquant.triton_verify:turboquant_verify_attention"
_VERIFY_REF = "vllm_platform_ext.ops.turboquant.reference:turboquant_verify_attention_reference"

OPS: list[OpImpl] = [
    OpImpl("turboquant.verify_attention", "cuda", _VERIFY, "triton", {}),
    OpImpl("turboquant.verify_attention", "maca", _VERIFY, "triton", {"num_warps": 4, "num_stages": 1, "gluon": False,
                                                                        "inline_ptx": False}),
    OpImpl("turboquant.verify_attention", "cpu", _VERIFY_REF, "torch", {}),
]
