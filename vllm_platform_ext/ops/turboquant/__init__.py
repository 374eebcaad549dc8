"""TurboQuant KV-cache ops (torch reference, Triton K+1 verify attention).

``turboquant.verify_attention``: attention of a uniform K+1 speculative-verify batch (K = 0 is
plain decode) over vLLM's TurboQuant cache, all four presets. The ``config`` dicts are extra
keyword arguments the wiring passes to the op (empty = per-call choice from (K+1) x GQA rows:
BLOCK_M <= 64, BLOCK_N 32, 4 warps up to 32 rows else 8, 2 stages). MACA (MetaX) gets a
conservative 4 warps and single-stage pipelining until it is measured there.
"""
from vllm_platform_ext.ops.dispatch import OpImpl

_VERIFY = "vllm_platform_ext.ops.turboquant.triton_verify:turboquant_verify_attention"
_VERIFY_REF = "vllm_platform_ext.ops.turboquant.reference:turboquant_verify_attention_reference"

OPS: list[OpImpl] = [
    OpImpl("turboquant.verify_attention", "cuda", _VERIFY, "triton", {}),
    OpImpl("turboquant.verify_attention", "maca", _VERIFY, "triton", {"num_warps": 4, "num_stages": 1}),
    OpImpl("turboquant.verify_attention", "cpu", _VERIFY_REF, "torch", {}),
]
