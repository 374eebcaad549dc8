"""The TurboQuant route's own audit (``VLLM_PLATFORM_EXT_TQ_ROUTE_CHECK=1``, patch/turboquant/route_check.py):
its causal windows against a loop over the batch written from vLLM's metadata contract, its difference
measure against float64, and the judge's reading of its figures. The check against each line's real
decode kernel runs in tests/patch/test_turboquant_engine_contract.py (Triton interpreter) and on the GPU."""
from __future__ import annotations

import math
import random
from types import SimpleNamespace

import pytest
import torch

from vllm_platform_ext.patch.turboquant import route_check
from vllm_platform_ext.testing import ranks


def _loop_rows(qlens, seq_lens):
    """Token by token: request, and the positions it may see (its own included)."""
    out = []
    for r, (q, s) in enumerate(zip(qlens, seq_lens)):
        for t in range(q):
            out.append((r, s - q + 1 + t))
    return out


@pytest.mark.parametrize("seed", range(6))
def test_token_rows_are_each_tokens_causal_window(seed):
    r = random.Random(seed)
    nreq = r.randint(1, 7)
    qlens = [r.choice([0, 1, 1, 2, 3, 4]) for _ in range(nreq)]  # empty requests (padding) included
    if sum(qlens) == 0:
        qlens[0] = 1
    seq_lens = [q + r.randint(0, 40) for q in qlens]
    qsl = torch.tensor([0] + list(torch.tensor(qlens).cumsum(0).tolist()), dtype=torch.int32)
    bt = torch.arange(nreq * 3, dtype=torch.int32).view(nreq, 3)
    got_bt, got_len, real = route_check.token_rows(qsl, torch.tensor(seq_lens, dtype=torch.int32), bt, sum(qlens))
    want = _loop_rows(qlens, seq_lens)
    assert real.all()
    assert got_len.tolist() == [n for _, n in want]
    assert got_bt.tolist() == [bt[req].tolist() for req, _ in want]
    assert got_len.dtype == torch.int32


def test_token_rows_match_the_k1_kernels_windows():
    """A uniform K+1 batch: row i of request b sees seq_len - K + i positions (routing.synthetic_rows)."""
    from vllm_platform_ext.ops.turboquant.routing import synthetic_rows

    k1, seq = 4, torch.tensor([37, 9, 20], dtype=torch.int32)
    bt = torch.arange(12, dtype=torch.int32).view(3, 4)
    qsl = torch.arange(0, 13, 4, dtype=torch.int32)
    a_bt, a_len, _ = route_check.token_rows(qsl, seq, bt, 12)
    b_bt, b_len = synthetic_rows(bt, seq, 3, k1)
    assert a_len.tolist() == b_len.tolist() and torch.equal(a_bt, b_bt)


def test_a_captured_graphs_padding_is_not_compared():
    """FULL graphs pad a uniform K+1 batch: padded requests with seq_len 0 (measured on the H200, 2026-12-02: vLLM's
    decode kernel gives NaN on their empty windows in every MTP k=3 cell) and tokens past the last request."""
    k1 = 4
    seq = torch.tensor([37, 9, 0, 0], dtype=torch.int32)  # two real requests, two padded
    qsl = torch.tensor([0, 4, 8, 12, 16], dtype=torch.int32)
    bt = torch.arange(16, dtype=torch.int32).view(4, 4)
    _, lens, real = route_check.token_rows(qsl, seq, bt, 18)  # 2 tokens past the last request too
    assert real.tolist() == [True] * 8 + [False] * 10
    assert lens[:8].tolist() == [34, 35, 36, 37, 6, 7, 8, 9] and (lens >= 1).all()
    ref = torch.randn(18, 2, 8)
    got = ref.clone()
    ref[8:] = float("nan")  # what the decode kernel wrote on the padding
    assert float(route_check.relative_difference(got, ref, real)) == 0.0
    got[3, 1] = float("nan")  # a NaN in a real row is never hidden
    assert math.isnan(float(route_check.relative_difference(got, ref, real)))
    got[3, 1] = ref[3, 1] * 1.5
    assert float(route_check.relative_difference(got, ref, real)) == pytest.approx(0.5, rel=1e-5)


def test_pad_slots_are_not_compared():
    """vLLM 0.26's dummy K+1 runs under FULL graphs (H200, 2026-12-03, results/gpu/2026-12-03-dummy-run-nan/):
    ``seq_lens`` K+1 = 4 for every request, so each looks real by its lengths, but ``slot_mapping`` is all -1
    (PAD_SLOT_ID): nothing is written to the cache, and vLLM's decode kernel read slots nobody wrote (NaN in every
    MTP k=3 cell). A token whose own slot is negative is padding; a real token beside it stays real."""
    k1 = 4
    seq = torch.full((3,), k1, dtype=torch.int32)
    qsl = torch.arange(0, 13, k1, dtype=torch.int32)
    bt = torch.arange(12, dtype=torch.int32).view(3, 4)
    dummy = torch.full((16,), -1, dtype=torch.int64)  # padded past the 12 tokens too, as the runner pads
    _, _, real = route_check.token_rows(qsl, seq, bt, 12, dummy)
    assert not real.any()
    # without slot_mapping the lengths alone call them real: the check needs the slots
    _, _, by_lens = route_check.token_rows(qsl, seq, bt, 12)
    assert by_lens.all()
    # a real step: request 0 and 2 write their slots, request 1 is a pad request (-1), one more pad token at the end
    seq = torch.tensor([37, 4, 20], dtype=torch.int32)
    slots = torch.tensor([100, 101, 102, 103, -1, -1, -1, -1, 7, 8, 9, 10, -1], dtype=torch.int64)
    _, lens, real = route_check.token_rows(qsl, seq, bt, 13, slots)
    assert real.tolist() == [True] * 4 + [False] * 4 + [True] * 4 + [False]
    assert lens[:4].tolist() == [34, 35, 36, 37] and lens[8:12].tolist() == [17, 18, 19, 20]
    # a slot_mapping shorter than the rows (never seen; defensive): the rows past it are not compared
    _, _, real = route_check.token_rows(qsl, seq, bt, 12, slots[:6])
    assert real.tolist() == [True] * 4 + [False] * 8
    ref = torch.randn(12, 2, 8)
    got = ref.clone()
    ref[4:8] = float("nan")  # the decode kernel on the unwritten slots
    _, _, real = route_check.token_rows(qsl, seq, bt, 12, slots)
    assert float(route_check.relative_difference(got, ref, real)) == 0.0


def test_check_reads_the_metadatas_slot_mapping(monkeypatch):
    """check() hands the metadata's own slot_mapping to token_rows: the dummy run's rows count as no non-finite row."""
    from vllm_platform_ext.patch.turboquant import upstream_rows

    monkeypatch.setattr(route_check, "_STATE", {})
    monkeypatch.setattr(upstream_rows, "decode_kernel", lambda impl: object())

    def rows_forward(impl, layer, q, cache, bt, lens, one, out):
        out.copy_(torch.full_like(out, float("nan")))  # unwritten slots
        return True

    monkeypatch.setattr(upstream_rows, "rows_forward", rows_forward)
    md = SimpleNamespace(query_start_loc=torch.arange(0, 13, 4, dtype=torch.int32),
                         seq_lens=torch.full((3,), 4, dtype=torch.int32),
                         block_table=torch.zeros(3, 2, dtype=torch.int32),
                         slot_mapping=torch.full((12,), -1, dtype=torch.int64))
    q = torch.randn(12, 2, 8)
    assert route_check.check(None, None, q, None, md, q.clone(), "k1")
    figs = route_check.snapshot()
    assert figs["k1_calls"] == 1 and figs["k1_nonfinite_ref"] == 0 and figs["k1_max_rel"] == 0.0
    md.slot_mapping = torch.arange(12, dtype=torch.int64)  # the same call with written slots: vLLM's NaN counted
    assert route_check.check(None, None, q, None, md, q.clone(), "k1")
    assert route_check.snapshot()["k1_nonfinite_ref"] == 12


def test_relative_difference_against_float64():
    torch.manual_seed(0)
    ref = torch.randn(6, 4, 64)
    got = ref.clone()
    got[2, 1] += 0.3 * ref[2, 1].norm() / math.sqrt(64)  # one row, one head moved by 0.3 of its norm
    rows = (got.double() - ref.double()).norm(dim=-1) / ref.double().norm(dim=-1)
    assert float(route_check.relative_difference(got, ref)) == pytest.approx(float(rows.max()), rel=1e-5)
    assert float(rows.max()) == pytest.approx(0.3, rel=1e-6)
    assert float(route_check.relative_difference(ref, ref)) == 0.0
    # a row whose output is near zero is measured against FLOOR x the largest row, not blown up
    ref[0] = 1e-9
    got = ref.clone()
    got[0] += 1e-6
    assert float(route_check.relative_difference(got, ref)) < 1e-4
    nan = ref.clone()
    nan[3, 0, 0] = float("nan")
    assert math.isnan(float(route_check.relative_difference(nan, ref)))


def _run(figs, routed_calls=(5,)):
    return SimpleNamespace(routes=[{"rank": i, "routes": {
        "turboquant_spec_verify": {"k1": c, "rows": 0, "decode": 0},
        **({ranks.ROUTE_CHECK_GROUP: f} if f is not None else {})}} for i, (f, c) in enumerate(zip(figs, routed_calls))])


def _figs(k1=(0, 0.0), rows=(0, 0.0), decode=(0, 0.0), enabled=True, nonfinite=None):
    f = {"enabled": enabled, "k1_calls": k1[0], "k1_max_rel": k1[1], "rows_calls": rows[0], "rows_max_rel": rows[1],
         "decode_calls": decode[0], "decode_max_rel": decode[1]}
    for k in ("k1", "rows", "decode"):
        for side in ("route", "ref", "both"):
            f[f"{k}_nonfinite_{side}"] = (nonfinite or {}).get((k, side), 0)
    return f


def test_the_judge_names_the_checks_group_and_kinds():
    """ranks (torch-free, read by the judge) spells the check's group and route kinds as the check writes them."""
    assert (ranks.ROUTE_CHECK_GROUP, ranks.ROUTE_CHECK_KINDS) == (route_check.GROUP, route_check.KINDS)


def test_judge_reads_the_check():
    ok = _figs(k1=(40, 0.004), decode=(120, 0.003))
    assert ranks.route_check_problem(_run([ok])) is None
    assert ranks.route_check_figures(_run([ok]))["k1_calls"] == 40
    bad = ranks.route_check_problem(_run([_figs(k1=(40, 0.31))]))
    assert "k1" in bad and "0.31" in bad and "decode kernel" in bad
    assert "nan" in ranks.route_check_problem(_run([_figs(rows=(3, float("nan")))]))
    # on, but it compared none of the calls the route served
    assert "compared none" in ranks.route_check_problem(_run([_figs()]))
    # off (or an engine without the group): nothing to judge
    assert ranks.route_check_problem(_run([_figs(enabled=False)])) is None
    assert ranks.route_check_problem(_run([None])) is None
    # TP: the worst rank decides
    two = _run([ok, _figs(k1=(40, 0.2))], routed_calls=(5, 5))
    assert "0.2" in ranks.route_check_problem(two)
    # non-finite rows: the route's own fail; the decode kernel's alone leave the check unable to judge
    assert "not finite in 3 real rows" in ranks.route_check_problem(_run([_figs(k1=(40, 0.0), nonfinite={("k1", "route"): 3})]))
    assert "cannot judge" in ranks.route_check_problem(_run([_figs(k1=(40, 0.0), nonfinite={("k1", "ref"): 2})]))
    # both sides non-finite in a row: the route agrees with vLLM's kernel there
    assert ranks.route_check_problem(_run([_figs(k1=(40, 0.003), nonfinite={("k1", "both"): 6})])) is None
    # the first window's records have no counts: their NaN still fails
    old = _figs(k1=(85, float("nan")))
    for k in ("k1", "rows", "decode"):
        del old[f"{k}_nonfinite_route"], old[f"{k}_nonfinite_ref"], old[f"{k}_nonfinite_both"]
    assert "nan" in ranks.route_check_problem(_run([old]))
    err = _run([{"enabled": True, "error": "RuntimeError: boom"}])
    assert "boom" in ranks.route_check_problem(err)


def test_a_first_call_inside_a_capture_is_refused(monkeypatch):
    monkeypatch.setattr(route_check, "_STATE", {})
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(RuntimeError, match="inside a CUDA graph capture"):
        route_check.state(torch.device("cuda", 0))
    assert route_check.state(torch.device("cpu")).shape == (3, 5)  # the CPU never captures


def test_snapshot_and_switch(monkeypatch):
    monkeypatch.setattr(route_check, "_STATE", {})
    monkeypatch.delenv("VLLM_PLATFORM_EXT_TQ_ROUTE_CHECK", raising=False)
    zero = {f"{k}_{x}": (0.0 if x == "max_rel" else 0) for k in ("k1", "rows", "decode")
            for x in ("calls", "max_rel", "nonfinite_route", "nonfinite_ref", "nonfinite_both")}
    assert route_check.snapshot() == {"enabled": False, **zero}
    monkeypatch.setenv("VLLM_PLATFORM_EXT_TQ_ROUTE_CHECK", "1")
    st = route_check.state(torch.device("cpu"))
    st[1] = torch.tensor([0.25, 3.0, 0.0, 2.0, 1.0])
    snap = route_check.snapshot()
    assert snap["enabled"] and snap["rows_calls"] == 3 and snap["rows_max_rel"] == pytest.approx(0.25)
    assert snap["rows_nonfinite_ref"] == 2 and snap["rows_nonfinite_route"] == 0 and snap["rows_nonfinite_both"] == 1


def test_routes_snapshot_carries_probes_and_their_errors(monkeypatch):
    from vllm_platform_ext.patch import routes

    monkeypatch.setattr(routes, "_PROBES", {})
    routes.probe("g.ok", lambda: {"calls": 2})
    routes.probe("g.bad", lambda: 1 / 0)
    snap = routes.snapshot()
    assert snap["g.ok"] == {"calls": 2}
    assert snap["g.bad"] == {"error": "ZeroDivisionError: division by zero"}
    import vllm_platform_ext.patch.turboquant.spec_verify  # noqa: F401  (registers the check where it is imported)


class _Impl:
    """A stand-in backend impl whose module's decode kernel is float64 attention over a plain K/V cache."""


def test_check_counts_which_side_is_not_finite(monkeypatch):
    from vllm_platform_ext.patch.turboquant import upstream_rows

    monkeypatch.setattr(route_check, "_STATE", {})
    ref_out = {}
    monkeypatch.setattr(upstream_rows, "decode_kernel", lambda impl: object())

    def fake_rows_forward(impl, layer, q, cache, bt, lens, k1, out):
        out.copy_(ref_out["v"])
        return True

    monkeypatch.setattr(upstream_rows, "rows_forward", fake_rows_forward)
    md = SimpleNamespace(query_start_loc=torch.tensor([0, 4, 8], dtype=torch.int32),
                         seq_lens=torch.tensor([20, 0], dtype=torch.int32),  # request 1 is padding
                         block_table=torch.zeros(2, 2, dtype=torch.int32))
    got = torch.randn(8, 2, 16)
    ref = got.clone()
    ref[5] = float("nan")  # padding: not counted
    ref[1, 0, 0] = float("nan")  # a real row the kernel left NaN
    got[2, 1, 3] = float("inf")  # a real row the route left infinite
    got[0] *= 1.1  # a real row 10% off
    got[3, 0, 0] = ref[3, 0, 0] = float("nan")  # both sides: agreement, not the route's fault
    ref_out["v"] = ref
    assert route_check.check(_Impl(), None, torch.zeros(8, 2, 16), None, md, got, "k1")
    snap = route_check.snapshot()
    assert snap["k1_calls"] == 1 and snap["k1_nonfinite_route"] == 1 and snap["k1_nonfinite_ref"] == 1
    assert snap["k1_nonfinite_both"] == 1
    assert snap["k1_max_rel"] == pytest.approx(0.1, rel=1e-4)


@pytest.mark.parametrize("figs,want", [
    (_figs(k1=(40, 0.003)), None),
    (_figs(k1=(40, 0.31)), "fail"),
    (_figs(k1=(40, 0.0), nonfinite={("k1", "route"): 3}), "fail"),
    (_figs(k1=(40, 0.0), nonfinite={("k1", "ref"): 2}), "harness-error"),
], ids=["agrees", "differs", "route-nonfinite", "kernel-nonfinite"])
def test_the_cell_judge_turns_the_check_into_a_status(figs, want):
    """cell_judge.judge: a difference or the route's own non-finite rows fail a plugin cell; vLLM's kernel alone
    non-finite leaves it a harness error; agreement leaves the verdict to the tokens."""
    from vllm_platform_ext.testing import cell_judge
    from vllm_platform_ext.testing.cell_suites import Cell
    from vllm_platform_ext.testing.engine import EngineRun

    run = EngineRun(mode="base", k=0, routes=_run([figs]).routes)
    status, note = cell_judge.judge(Cell(kv="turboquant_k8v4"), run, [], ["a token problem"])
    if want is None:
        assert (status, note) == ("fail", "a token problem")  # the check passed: the tokens' verdict stands
    else:
        assert status == want and note == ranks.route_check_problem(run)
