"""TurboQuant K+1 verify per tensor-parallel rank (issue 34), on the CPU.

TurboQuant does not run in the CPU engine, so this is what each rank of a TP engine sees,
built by hand: rank ``r`` holds query heads ``[r*Hq/tp, (r+1)*Hq/tp)`` and, as vLLM's
``QKVParallelLinear`` shards them, KV heads ``[r*Hk/tp, (r+1)*Hk/tp)`` when ``Hk >= tp``, else
the single KV head ``r // (tp/Hk)`` (replicated ``tp/Hk`` times, ``linear.py``:
``shard_rank = tp_rank // num_kv_head_replicas``). Each rank stores its own KV heads into its
own cache (both page layouts: head-major, and vLLM's LBNHC where positions of one head are Hk
slots apart, with Hk the *rank's* count, 1 when replicated), sizes its verify workspace with its
own query heads, and runs the Triton verify op (interpreter). The ranks' outputs, put side by
side over heads, must equal the float64 reference of the unsplit model (all heads, one cache,
TP=1). Controls: every rank reading rank 0's KV heads, or the ranks' outputs in the wrong
order, must be told apart.

The per-rank head counts assumed here are checked against vLLM's own ``ModelConfig`` for the
kit models (``get_num_attention_heads`` / ``get_num_kv_heads`` with ``tensor_parallel_size``).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from vllm_platform_ext.ops.turboquant import layout as L
from vllm_platform_ext.ops.turboquant import reference as R

HERE = os.path.abspath(__file__)
# (Hq, Hk, tp): KV heads split; one KV head replicated on 2 ranks (the CPU kit's shape);
# two KV heads each replicated twice on 4 ranks; Qwen3.6-35B-A3B's 16/2 heads on 2 ranks
SHAPES = [(4, 2, 2), (2, 1, 2), (8, 2, 4), (16, 2, 2)]
# (preset, Hq, Hk, tp, page layout) through the op (interpreter time: ~4 s a rank)
CASES = [("turboquant_k8v4", 2, 1, 2, "vllm"), ("turboquant_k8v4", 2, 1, 2, "head"),
         ("turboquant_k8v4", 4, 2, 2, "vllm"), ("turboquant_k8v4", 8, 2, 4, "head"),
         ("turboquant_4bit_nc", 4, 2, 2, "head"), ("turboquant_4bit_nc", 2, 1, 2, "vllm")]
D, K1, PAGE, NB = 64, 4, 16, 8


def rank_heads(hq: int, hk: int, tp: int, rank: int) -> tuple[list[int], list[int]]:
    """(query heads, KV heads) of ``rank``, as vLLM shards them."""
    if hq % tp:
        raise ValueError(f"{hq} query heads do not split over {tp} ranks")
    q = list(range(rank * hq // tp, (rank + 1) * hq // tp))
    if hk >= tp:
        if hk % tp:
            raise ValueError(f"{hk} KV heads do not split over {tp} ranks")
        return q, list(range(rank * hk // tp, (rank + 1) * hk // tp))
    if tp % hk:
        raise ValueError(f"{tp} ranks do not replicate {hk} KV heads evenly")
    return q, [rank // (tp // hk)]


def test_rank_heads_cover_every_head_and_keep_each_query_with_its_kv_head():
    for hq, hk, tp in SHAPES:
        g = hq // hk
        qs = []
        for r in range(tp):
            q, kv = rank_heads(hq, hk, tp, r)
            qs += q
            assert {h // g for h in q} <= set(kv), (hq, hk, tp, r)  # the GQA group of each query head
            assert len(kv) == max(1, hk // tp)
        assert qs == list(range(hq))
    with pytest.raises(ValueError):
        rank_heads(4, 3, 2, 0)


@pytest.mark.parametrize("dims,tp", [("cpu", 2), ("gpu", 2)])
def test_per_rank_head_counts_match_vllm(dims, tp, tmp_path):
    """vLLM's own per-rank counts for the kit models equal :func:`rank_heads`'s."""
    from vllm.config import ModelConfig, ParallelConfig

    from vllm_platform_ext.testing.tiny_models import config_dict, make_tiny_model

    path = make_tiny_model("qwen3_next", tmp_path / "m", dims=dims)
    mc = ModelConfig(model=str(path), dtype="bfloat16", skip_tokenizer_init=True)
    pc = ParallelConfig(tensor_parallel_size=tp)
    cfg = config_dict("qwen3_next", dims=dims)
    q, kv = rank_heads(cfg["num_attention_heads"], cfg["num_key_value_heads"], tp, 0)
    assert (mc.get_num_attention_heads(pc), mc.get_num_kv_heads(pc)) == (len(q), len(kv))


def _cache(preset: str, hk: int, layout: str):
    lay = L.layout_for(preset, D)
    if layout == "vllm":
        return torch.zeros(NB, PAGE, hk, lay.slot_size_aligned, dtype=torch.uint8)
    return torch.zeros(NB, hk, PAGE, lay.slot_size_aligned, dtype=torch.uint8).transpose(1, 2)


def _interp_check() -> dict:
    """Under TRITON_INTERPRET=1: each case, each rank through the op."""
    from vllm_platform_ext.ops.turboquant import triton_verify as TV

    res = []
    for preset, hq, hk, tp, layout in CASES:
        lay = L.layout_for(preset, D)
        c, H = L.lloyd_max_centroids(D, lay.centroid_bits), L.hadamard(D)
        torch.manual_seed(hq * 100 + hk * 10 + tp)
        ntok = NB * PAGE
        k, v = torch.randn(ntok, hk, D), torch.randn(ntok, hk, D)
        sl = torch.tensor([K1 + 37, 0, 2, 128], dtype=torch.int32)  # long, padding, short, full
        bt = torch.tensor([[1, 2, 3, 0, 4, 5, 6, 7], [0] * 8, [5] + [0] * 7, [7, 6, 5, 4, 3, 2, 1, 0]],
                          dtype=torch.int32)
        q = torch.randn(4 * K1, hq, D)
        args = dict(preset=preset, scale=D ** -0.5, centroids=c, PiT=H)

        def cache_of(heads):
            cache = _cache(preset, len(heads), layout)
            R.tq_store_reference(k[:, heads], v[:, heads], cache, torch.arange(ntok), preset, PiT=H, centroids=c)
            return cache

        ref = R.turboquant_verify_attention_reference(q, cache_of(list(range(hk))), bt, sl, K1, **args)
        outs, wrong_kv, ws_shapes = [], [], []
        for r in range(tp):
            qh, kvh = rank_heads(hq, hk, tp, r)
            ws = TV.VerifyWorkspace.allocate(max_num_seqs=4, max_query_len=K1, num_q_heads=len(qh), head_dim=D,
                                             device="cpu")
            ws_shapes.append(list(ws.mid.shape))
            qr = q[:, qh].contiguous()
            outs.append(TV.turboquant_verify_attention(qr, cache_of(kvh), bt, sl, K1, workspace=ws, **args))
            # control: this rank reading rank 0's KV heads (float64 reference)
            wrong_kv.append(R.turboquant_verify_attention_reference(qr, cache_of(rank_heads(hq, hk, tp, 0)[1]),
                                                                    bt, sl, K1, **args))
        den = ref.abs().max().item()
        err = lambda o: float((torch.cat(o, dim=1).float() - ref).abs().max()) / den  # noqa: E731
        res.append({"case": [preset, hq, hk, tp, layout], "rel_err": err(outs), "rel_wrong_kv": err(wrong_kv),
                    "rel_wrong_order": err(outs[::-1]),
                    "finite": all(bool(torch.isfinite(o).all()) for o in outs), "ws": ws_shapes})
    return {"results": res}


def test_each_rank_through_the_op_equals_the_unsplit_reference():
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, HERE, "--interp"], capture_output=True, text=True, env=env,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])["results"]
    assert [r["case"] for r in res] == [list(c) for c in CASES]
    for r in res:
        preset, hq, hk, tp, layout = r["case"]
        assert r["finite"], r
        assert r["rel_err"] < 3e-3, r
        assert r["rel_wrong_order"] > 10 * r["rel_err"], r  # the comparison can fail
        if hk > 1:  # with one KV head every rank rightly reads the same head
            assert r["rel_wrong_kv"] > 10 * r["rel_err"], r
        else:
            assert r["rel_wrong_kv"] < 3e-3, r
        # each rank's workspace holds only its own query heads: [max_num_seqs x (K+1), Hq/tp, splits, D+1]
        assert all(ws[0] == 4 * K1 and ws[1] == hq // tp and ws[3] == D + 1 for ws in r["ws"]), r


if __name__ == "__main__" and sys.argv[1:] == ["--interp"]:
    print(json.dumps(_interp_check()))
