"""Compile the TurboQuant v2 verify kernel for sm_90 on a machine without a GPU (Triton's
bundled ptxas) and print registers, spills and a SASS opcode histogram.

    python ci/tools/aot_sass.py PRESET '{"FP8_ASM": true, ...constexpr overrides}' [num_warps] [num_stages]
"""
import collections
import json
import os
import re
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from vllm_platform_ext.ops.turboquant import layout as L
from vllm_platform_ext.ops.turboquant import word_kernels as KV2


def consts_for(preset, K1=4, G=6, BLOCK_N=64, **over):
    lay = L.layout_for(preset, 256)
    rows = K1 * G
    bm = max(16, min(64, triton.next_power_of_2(rows)))
    c = dict(G=G, BLOCK_M=bm, M_CHUNKS=triton.cdiv(rows, bm), D=256, PAGE=16, BLOCK_N=BLOCK_N,
             KEY_FP8=lay.key_fp8, KEY_W32=lay.key_fp8, KEY_BITS=lay.key_bits, NORM_W=lay.mse_bytes // 2,
             NORM_CORRECTION=lay.norm_correction, VAL_BITS=lay.value_bits, VAL_W=lay.key_packed_size // 2,
             SZ_W=lay.scale_offset // 2, PREFETCH=False, FP8_ASM=False, NIB_ASM=False, ASM_SPLIT=False)
    c.update(over)
    return c


_ARG_TYPES = {"Q": "*fp16", "Q16": "*fp16", "CENT16": "*fp16", "KV16": "*i16", "KV32": "*i32", "BT": "*i32",
              "SEQ": "*i32", "MID": "*fp32", "qk_scale": "fp32"}


def signature(fn, consts):
    """Triton signature, constexprs and divisibility attrs of a verify kernel (v2 or Gluon): names
    in ``consts`` are constexpr, the rest typed by name (i32 by default); pointers and the query
    strides are multiples of 16 at run time (Triton specializes them)."""
    sig = {n: "constexpr" if n in consts else _ARG_TYPES.get(n, "i32") for n in fn.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names)
             if sig[n].startswith("*") or n in ("stride_qn", "stride_qh")}
    return sig, {k: v for k, v in consts.items() if k in fn.arg_names}, attrs


def compile_v2(consts, num_warps=4, num_stages=1, fn=None):
    fn = fn or KV2._tq_verify_v2
    sig, constexprs, attrs = signature(fn, consts)
    src = ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs)
    opts = {"num_warps": num_warps, "num_stages": num_stages}
    if os.environ.get("MAXNREG"):
        opts["maxnreg"] = int(os.environ["MAXNREG"])
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts)


def stats(k):
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as fh:
        fh.write(k.asm["cubin"])
    import os
    tool = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump")
    sass = subprocess.run([tool, "--dump-sass", fh.name], capture_output=True, text=True).stdout
    ops = collections.Counter()
    for line in sass.splitlines():
        m = re.match(r"\s*/\*[0-9a-f]+\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_]+)", line)
        if m:
            ops[m.group(2)] += 1
    res = subprocess.run([tool, "--dump-resource-usage", fh.name], capture_output=True, text=True).stdout
    m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", res)
    return ops, sass, (m.groups() if m else res)


if __name__ == "__main__":
    preset = sys.argv[1]
    over = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
    nw = int(sys.argv[3]) if len(sys.argv) > 3 else 4
    ns = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    k = compile_v2(consts_for(preset, **over), nw, ns)
    ops, sass, res = stats(k)
    print("REG/STACK/SHARED/LOCAL", res, "shared(meta)", k.metadata.shared, "total", sum(ops.values()))
    print(json.dumps(dict(ops.most_common(40))))
    if "--sass" in sys.argv:
        open("/tmp/k.sass", "w").write(sass)

