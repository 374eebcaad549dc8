import torch, triton
from vllm_platform_ext.ops.turboquant import launch_policy as P
from vllm_platform_ext.ops.turboquant.workspace import workspace_splits
dev = torch.device("cpu")  # _num_sms -> 132 (H200/H100 SXM count)
hq, hk, d, k1 = 16, 2, 256, 4
for max_seqs in (1, 8):
    rows_ws = max_seqs * k1
    max_splits = max(P.DEFAULT_MAX_KV_SPLITS, triton.cdiv(P.SMALL_BATCH_MAX_SPLITS, max_seqs))
    mid_numel = rows_ws * hq * max_splits * (d + 1)
    for b in (1, 8):
        if b > max_seqs: continue
        rows = k1 * (hq // hk)
        block_m = min(max(16, min(64, triton.next_power_of_2(rows))), 32)
        m_chunks = triton.cdiv(rows, min(max(16, min(64, triton.next_power_of_2(rows))), 32))
        g = P.gluon_launch_config("turboquant_k8v4", b, hk, k1, m_chunks)
        trans_rows = max(g.get("TRANSPOSED_ROWS", 8), g.get("WG_ROWS", 0) if g.get("WGMMA") else 0)
        trans = rows <= min(64, trans_rows)
        prog_rows = sum(P.transposed_row_groups(rows)) if trans else block_m
        ctas = P.gluon_ctas_per_sm(g, prog_rows, True)
        n = b * k1
        cap = max(max_splits, mid_numel // (n * hq * (d + 1)))
        splits, mt = P.gluon_split_plan(b * hk * (1 if trans else m_chunks), dev, max_splits, ctas, cap, prog_rows)
        for page in (16, 1488):
            tiles = P.split_tiles(4096, splits, g["BLOCK_N"], mt)
            active = triton.cdiv(4096, tiles * g["BLOCK_N"])
            print(f"max_num_seqs={max_seqs} b={b} page={page}: kernel={'wg' if (trans and g.get('WGMMA')) else 't' if trans else 'rowmajor'} "
                  f"BLOCK_N={g['BLOCK_N']} stages={g['num_stages']} splits={splits} min_tiles={mt} tiles/split={tiles} "
                  f"active_splits={active} CTAs={b*hk*(1 if trans else m_chunks)*active} grid={(hk*(1 if trans else m_chunks), b, splits)}")
