"""Loop-body SASS size of the v2 verify kernel for sm_90 (no GPU needed).
    python ci/tools/aot_loop.py PRESET '{constexpr overrides}' NUM_WARPS NUM_STAGES"""
import collections, json, re, subprocess, sys, os
sys.path.insert(0, os.path.dirname(__file__))
import aot_sass as A

def loop_body(sass):
    ins = []
    for l in sass.splitlines():
        m = re.match(r"\s*/\*([0-9a-f]+)\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_]+)(\.[A-Z0-9_.]*)?", l)
        if m: ins.append((int(m.group(1), 16), m.group(3) + (m.group(4) or ""), l))
    loops = []
    for a, op, l in ins:
        if op.startswith("BRA"):
            t = re.search(r"BRA\s+0x([0-9a-f]+)", l)
            if t and int(t.group(1), 16) < a:
                loops.append((int(t.group(1), 16), a))
    loops.sort()
    # the main (unmasked) loop comes first in the code
    best = loops[0] if loops else None
    global ALL_LOOPS
    ALL_LOOPS = [(b - a) // 16 + 1 for a, b in loops]
    return [op for a, op, l in ins if best and best[0] <= a <= best[1]]

if __name__ == "__main__":
    preset = sys.argv[1]; over = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
    nw = int(sys.argv[3]) if len(sys.argv) > 3 else 4; ns = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    k = A.compile_v2(A.consts_for(preset, **over), nw, ns)
    ops, sass, res = A.stats(k)
    body = loop_body(sass)
    c = collections.Counter(o.split(".")[0] for o in body)
    bn = over.get("BLOCK_N", 64)
    print("loops", ALL_LOOPS, end=" ")
    print(f"{preset} {json.dumps(over)} w{nw} s{ns}: REG/STACK {res[:2]} loop {len(body)} instr/warp -> {len(body)*nw/bn:.1f} warp-instr/token |",
          " ".join(f"{k}:{v}" for k, v in c.most_common(14)))
    if "--sass" in sys.argv: open("/tmp/k.sass", "w").write(sass)
