"""Debug: Gluon vs v2 vs reference on 3bit_nc with parts of the slot zeroed."""
import os, sys, torch
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
import test_turboquant_gpu as T
from vllm_platform_ext.ops.turboquant import triton_verify as TV, reference as R, layout as L
for preset in ("turboquant_3bit_nc", "turboquant_k3v4_nc"):
    lay, cent, H = T._tables(preset)
    view, bt = T.make_cache(preset, [5, 300], 4, layout="vllm")
    sl = torch.tensor([5, 300], dtype=torch.int32, device="cuda")
    q = torch.randn(8, 24, 256, device="cuda")
    args = dict(preset=preset, scale=256**-0.5, centroids=cent, PiT=H)
    for name in ("plain", "vals0", "keys0", "zero0", "scale1"):
        v = view.clone()
        if name == "vals0": v[..., lay.value_offset:lay.scale_offset] = 0
        if name == "keys0": v[..., :lay.mse_bytes] = 0
        if name == "zero0": v[..., lay.scale_offset + 2:lay.scale_offset + 4] = 0
        if name == "scale1": v[..., lay.value_offset:lay.scale_offset] = 0x49; v[..., lay.scale_offset:lay.scale_offset+2] = torch.tensor([0, 0x3c], dtype=torch.uint8, device="cuda")
        ref = R.turboquant_verify_attention_reference(q, v, bt, sl, 4, **args)
        g = TV.turboquant_verify_attention(q, v, bt, sl, 4, **args)
        k = TV.LAST_KERNEL
        v2 = TV.turboquant_verify_attention(q, v, bt, sl, 4, **args, gluon=False)
        print(preset, name, k, "gluon", f"{T.rel_err(g, ref):.2e}", "v2", f"{T.rel_err(v2, ref):.2e}", flush=True)
        if name == "plain":
            d = (g - ref).abs()
            print("  worst row/head", divmod(int(d.amax(-1).argmax()), 24), "per-dim err sample", d[0, 0, :16].tolist())
            print("  g", g[0,0,:8].tolist()); print("  r", ref[0,0,:8].tolist())
