"""Issue 53 goal 1's benchmark (benchmarks/bench_tq_vs_flash.py) without a GPU: the bytes it compares
(worked out by hand from the cache formats), the % of the HBM bound and TQ / FA of a row, which goal
applies to which row and how each is judged, the goals' summary and the Markdown it writes. The timings
themselves come from the GPU machine."""
from __future__ import annotations

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "benchmarks"))

import bench_tq_vs_flash as T  # noqa: E402


def test_bytes_per_token_and_head_by_hand():
    # bf16: K and V, 256 dims, 2 bytes each
    assert T.bf16_bytes(1, 1, 1) == 1024
    assert T.bf16_bytes(32, 32768, 4) == 32 * 32768 * 4 * 1024
    # k8v4: 256 fp8 key bytes + 256 4-bit values (128 bytes) + fp16 value scale and zero (4 bytes)
    assert T.tq_bytes("turboquant_k8v4", 1, 1, 1) == 256 + 128 + 4
    # 3bit_nc: 256 3-bit key indices (96 bytes) + fp16 key norm (2) + 3-bit values (96) + scale and zero (4)
    assert T.tq_bytes("turboquant_3bit_nc", 1, 1, 1) == 96 + 2 + 96 + 4
    r = T.row("turboquant_k8v4", 24, 4, 32768, 64, 3, tq_ms=1.0, fa_ms=2.0, bw=4.0e12)
    assert r["bytes_ratio"] == pytest.approx(388 / 1024)  # the issue's "0.375x the bytes", slot scales counted


def test_a_row_s_bound_share_and_ratio():
    bw = 4.0e12
    r = T.row("turboquant_k8v4", 16, 2, 16384, 32, 1, tq_ms=0.25, fa_ms=1.0, bw=bw)
    tq_read_ms = 32 * 16384 * 2 * 388 / bw * 1e3
    fa_read_ms = 32 * 16384 * 2 * 1024 / bw * 1e3
    assert r["tq_pct_bound"] == pytest.approx(100 * tq_read_ms / 0.25)
    assert r["fa_pct_bound"] == pytest.approx(100 * fa_read_ms / 1.0)
    assert r["tq_over_fa"] == pytest.approx(0.25) and r["heads"] == "16/2" and r["preset"] == "k8v4"


def _goals(r):
    return {g["goal"]: g for g in r["goals"]}


def test_which_goals_apply_and_how_each_is_judged():
    bw = 1.0e12
    nbytes = 32 * 32768 * 4 * 388  # k8v4 at B=32, 32K, 24/4: 75% of the bound at exactly this time
    at75 = nbytes / bw * 1e3 / 0.75
    g = _goals(T.row("turboquant_k8v4", 24, 4, 32768, 32, 3, tq_ms=at75, fa_ms=2 * at75, bw=bw))
    assert g["k8v4 verify % of HBM bound"]["met"] and g["k8v4 verify TQ / FA, heads 24/4"]["met"]  # 75%, 0.5
    g = _goals(T.row("turboquant_k8v4", 24, 4, 32768, 32, 3, tq_ms=at75 * 1.01, fa_ms=2 * at75, bw=bw))
    assert not g["k8v4 verify % of HBM bound"]["met"] and not g["k8v4 verify TQ / FA, heads 24/4"]["met"]
    # plain decode: TQ / FA <= 0.6 at 32K and 64K; no %-of-bound goal; none at 16K
    g = _goals(T.row("turboquant_k8v4", 16, 2, 65536, 64, 0, tq_ms=0.6, fa_ms=1.0, bw=bw))
    assert list(g) == ["k8v4 plain decode TQ / FA, 64K"] and g["k8v4 plain decode TQ / FA, 64K"]["met"]
    assert not _goals(T.row("turboquant_k8v4", 16, 2, 32768, 64, 0, tq_ms=0.61, fa_ms=1.0, bw=bw))[
        "k8v4 plain decode TQ / FA, 32K"]["met"]
    assert T.row("turboquant_k8v4", 16, 2, 16384, 64, 0, tq_ms=0.9, fa_ms=1.0, bw=bw)["goals"] == []
    # the other presets: >= 50% of the bound, no FA ratio goal
    nb = 32 * 16384 * 2 * 198
    g = _goals(T.row("turboquant_3bit_nc", 16, 2, 16384, 32, 5, tq_ms=nb / bw * 1e3 / 0.5, fa_ms=1.0, bw=bw))
    assert list(g) == ["4bit_nc/k3v4_nc/3bit_nc verify % of HBM bound"]
    assert g["4bit_nc/k3v4_nc/3bit_nc verify % of HBM bound"]["met"]
    # below B 32 or 16K context no goal applies
    assert T.row("turboquant_k8v4", 24, 4, 32768, 8, 3, tq_ms=9.0, fa_ms=1.0, bw=bw)["goals"] == []
    assert T.row("turboquant_k8v4", 24, 4, 4096, 64, 3, tq_ms=9.0, fa_ms=1.0, bw=bw)["goals"] == []


def test_summary_takes_every_row_and_names_the_worst():
    bw = 1.0e12
    rows = [T.row("turboquant_k8v4", 24, 4, 32768, 32, k, tq_ms=t, fa_ms=1.0, bw=bw)
            for k, t in ((1, 0.4), (3, 0.55), (5, 0.3))]
    s = {g["goal"]: g for g in T.summary(rows)}
    ratio = s["k8v4 verify TQ / FA, heads 24/4"]
    assert (ratio["rows_met"], ratio["rows"], ratio["met"]) == (2, 3, False)
    assert ratio["worst"] == pytest.approx(0.55) and ratio["worst_row"] == "k8v4 24/4 32K B=32 K=3"
    pct = s["k8v4 verify % of HBM bound"]  # the worst of a ">=" goal is the lowest
    assert pct["worst"] == pytest.approx(min(r["tq_pct_bound"] for r in rows))


def test_tables_mark_each_row_and_goal():
    bw = 1.0e12
    rows = [T.row("turboquant_k8v4", 24, 4, 32768, 32, 3, tq_ms=0.4, fa_ms=1.0, bw=bw),
            T.row("turboquant_k8v4", 16, 2, 32768, 32, 0, tq_ms=0.9, fa_ms=1.0, bw=bw)]
    md = T.tables(rows)
    lines = md.splitlines()
    assert lines[0].startswith("| preset | heads | ctx | B | K | TQ ms | FA bf16 ms | TQ % bound |")
    assert "| k8v4 | 24/4 | 32K | 32 | 3 | 0.400 | 1.000 |" in md
    assert "met (<= 0.5)" in md and "**not met** (<= 0.6)" in md
    assert "| k8v4 plain decode TQ / FA, 32K | <= 0.6 | 0 | 1 | 0.900 | k8v4 16/2 32K B=32 K=0 | **not met** |" in md
    json.dumps(rows)  # the result JSON takes the rows as they are


def test_the_default_plan_covers_issue_53s_shapes():
    plan = T.plan(list(T.PRESETS), list(T.HEADS), T.CONTEXTS, T.BATCHES, quick=False)
    shapes = {(p, hq, hk, ctx) for p, hq, hk, ctx, _, _ in plan}
    assert len(shapes) == 4 * 2 * 3
    k8v4 = [(bs, ks) for p, _, _, _, bs, ks in plan if p == "turboquant_k8v4"]
    assert all(bs == (32, 64) and ks == (0, 1, 2, 3, 4, 5) for bs, ks in k8v4)
    assert {(hq, hk) for _, hq, hk, _, _, _ in plan} == {(16, 2), (24, 4)}
    assert {p[3] for p in plan} == {16384, 32768, 65536}
