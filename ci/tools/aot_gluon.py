"""Compile the Gluon verify kernel for sm_90 without a GPU; print registers, spills and a SASS
opcode histogram (Triton with Gluon, e.g. the GPU machine's 3.6).

    python ci/tools/aot_gluon.py [PRESET] '{"BLOCK_M": 32, "BLOCK_N": 64, "WM": 1, "WN": 4, "STAGES": 1}' [--sass]
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
from vllm_platform_ext.ops.turboquant import layout as L  # noqa: E402


def consts_for(preset="turboquant_k8v4", **over):
    """The kernel's constexprs for one preset at head dim 256 (G = 6, page 16), then ``over``."""
    lay = L.layout_for(preset, 256)
    units = 4 if lay.key_fp8 else 2
    c = dict(G=6, BLOCK_M=32, M_CHUNKS=1, PAGE=16, BLOCK_N=64, VAL_W=lay.key_packed_size // units,
             SZ_W=lay.scale_offset // units, WM=1, WN=4, STAGES=1)
    c.update(KEY_BITS=8 if lay.key_fp8 else lay.key_bits, VAL_BITS=lay.value_bits, NORM_W=lay.mse_bytes // 2,
             NORM_CORRECTION=lay.norm_correction, PREFETCH=False,
             FOLD=lay.key_bits == 4, MIN_TILES=1, BASE_SPLITS=32)
    c.update(over)
    return c


def compile_gluon(consts, maxnreg=None, arch=90, rows=None):
    """The row-major kernel, or with ``rows`` = (RA, RB) the transposed one
    (``_tq_verify_t_gluon``: the same consts, NW = WM x WN warps, row groups RA + RB; WG / WG_DEPTH
    in ``consts`` for its warpgroup-MMA form)."""
    fn = GV._tq_verify_t_gluon if rows else GV._tq_verify_gluon
    if rows:
        consts = {k: v for k, v in consts.items() if k not in ("BLOCK_M", "M_CHUNKS", "WM", "WN")} | {
            "NW": consts["WM"] * consts["WN"], "RA": rows[0], "RB": rows[1]}
        consts = {"WG": False, "WG_DEPTH": 1} | consts  # mma.sync unless WG (Hopper warpgroup MMAs)
    sig, constexprs, attrs = A.signature(fn, consts)
    sig["KV"] = "*i32" if consts.get("KEY_BITS", 8) == 8 else "*i16"  # the cache's word view
    # the query as the host passes it: the model's (bf16) for fp8 keys, the rotated fp32 one for MSE keys
    if "Q" in sig:
        sig["Q"] = "*bf16" if consts.get("KEY_BITS", 8) == 8 else "*fp32"
    sig["LUT"] = "*i32"
    src = GluonASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs)
    opts = {"num_warps": consts["NW"] if rows else consts["WM"] * consts["WN"]}
    if maxnreg:
        opts["maxnreg"] = maxnreg
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options=opts)


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    preset = args.pop(0) if args and args[0].startswith("turboquant_") else "turboquant_k8v4"
    c = consts_for(preset, **(json.loads(args[0]) if args else {}))
    k = compile_gluon(c, int(os.environ["MAXNREG"]) if os.environ.get("MAXNREG") else None)
    ops, sass, res = A.stats(k)
    print("REG/STACK/SHARED/LOCAL", res, "shared(meta)", k.metadata.shared, "total", sum(ops.values()))
    print(json.dumps(dict(ops.most_common(30))))
    if "--sass" in sys.argv:
        open("/tmp/g.sass", "w").write(sass)
        open("/tmp/g.ttgir", "w").write(k.asm["ttgir"])
