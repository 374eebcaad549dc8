"""Compile the Gluon k8v4 verify kernel for sm_90 without a GPU; print registers, spills and
a SASS opcode histogram (Triton with Gluon, e.g. the GPU machine's 3.6).

    python tools/aot_gluon.py '{"BLOCK_M": 32, "BLOCK_N": 64, "WM": 1, "WN": 4, "STAGES": 1}' [--sass]
"""
import json
import os
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource

sys.path.insert(0, os.path.dirname(__file__))
import aot_sass as A  # noqa: E402

from vllm_platform_ext.ops.turboquant import gluon_verify as GV  # noqa: E402


def compile_gluon(consts, maxnreg=None):
    fn = GV._tq_verify_gluon_k8v4
    sig, constexprs, attrs = A.signature(fn, consts)
    src = GluonASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs)
    opts = {"num_warps": consts["WM"] * consts["WN"]}
    if maxnreg:
        opts["maxnreg"] = maxnreg
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts)


if __name__ == "__main__":
    c = dict(G=6, BLOCK_M=32, M_CHUNKS=1, PAGE=16, BLOCK_N=64, VAL_W32=64, SZ_W32=96, WM=1, WN=4, STAGES=1)
    if len(sys.argv) > 1 and not sys.argv[1].startswith("--"):
        c.update(json.loads(sys.argv[1]))
    k = compile_gluon(c, int(os.environ["MAXNREG"]) if os.environ.get("MAXNREG") else None)
    ops, sass, res = A.stats(k)
    print("REG/STACK/SHARED/LOCAL", res, "shared(meta)", k.metadata.shared, "total", sum(ops.values()))
    print(json.dumps(dict(ops.most_common(30))))
    if "--sass" in sys.argv:
        open("/tmp/g.sass", "w").write(sass)
        open("/tmp/g.ttgir", "w").write(k.asm["ttgir"])
