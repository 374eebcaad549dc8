"""The guard's detectors against brute-force references, and the guard fed crafted steps.

No engine: ``trailing_period`` and ``LoopWatch`` against the definition checked position by position
over random and planted sequences; ``AcceptWindow`` against the mean of the last W steps;
:class:`Guard` fed ``EngineCoreOutput``-shaped steps and ``SpecDecodingStats``-shaped counters (a
collapse, a drift from the baseline, an engine-wide zero-acceptance episode, speculation slower than its
draft-free steps, and healthy streams that must raise nothing), on a clock of the test's own.
"""
from __future__ import annotations

import copy
import random
from types import SimpleNamespace as NS

import pytest

from vllm_platform_ext.guard.detect import (AcceptWindow, LoopWatch, batch_bucket, speedup_estimate,
                                            trailing_period)
from vllm_platform_ext.guard.monitor import Guard


def brute_period(x: list[int], max_period: int, min_tokens: int) -> int:
    """The definition, position by position: smallest p <= max_period with x[i] == x[i-p] for each
    of the last min_tokens positions i (all of them must exist and have i - p >= 0)."""
    n = len(x)
    for p in range(1, max_period + 1):
        if n - min_tokens - p < 0 or n <= min_tokens:
            continue
        if all(x[i] == x[i - p] for i in range(n - min_tokens, n)):
            return p
    return 0


def _sequences(seed: int, count: int):
    r = random.Random(seed)
    for _ in range(count):
        alpha = r.choice([2, 3, 8, 50000])
        head = [r.randrange(alpha) for _ in range(r.randrange(0, 40))]
        p = r.randrange(1, 40)
        cyc = [r.randrange(alpha) for _ in range(p)]
        tail = (cyc * (200 // p + 2))[: r.randrange(0, 140)]
        if r.random() < 0.3 and tail:  # a break inside the cycle
            tail[r.randrange(len(tail))] = r.randrange(alpha)
        yield head + tail


@pytest.mark.parametrize("max_period,min_tokens", [(32, 64), (4, 8), (1, 5), (40, 20)])
def test_trailing_period_is_the_definition(max_period, min_tokens):
    hits = 0
    for x in _sequences(max_period * 1000 + min_tokens, 3000):
        want = brute_period(x, max_period, min_tokens)
        assert trailing_period(x, max_period, min_tokens) == want, (x, max_period, min_tokens)
        hits += bool(want)
    assert 100 < hits < 2900  # both outcomes are exercised


def test_loop_watch_matches_the_definition_at_every_check_and_is_late_by_less_than_its_stride():
    r = random.Random(7)
    checked = 0
    for x in _sequences(11, 600):
        w = LoopWatch(max_period=32, min_tokens=64, check_every=8)
        seen, first_found, first_true = 0, None, None
        while seen < len(x):
            chunk = x[seen: seen + r.randrange(1, 5)]  # 1 + accepted drafts a step
            seen += len(chunk)
            before = w.since
            got = w.add(chunk)
            if before + len(chunk) >= 8:  # a check ran: exact against the whole history
                assert got == brute_period(x[:seen], 32, 64)
            if got and first_found is None:
                first_found = seen
        for n in range(1, len(x) + 1):
            if brute_period(x[:n], 32, 64):
                first_true = n
                break
        lasting = first_true is not None and all(brute_period(x[:n], 32, 64) for n in range(first_true, len(x) + 1))
        if lasting and len(x) - first_true >= 8 + 3:  # found within the stride (+ the step that crosses it)
            assert first_found is not None and first_found - first_true < 8 + 4, (first_true, first_found)
            checked += 1
        assert len(w.ids) <= 2 * (64 + 32)  # bounded ring
    assert checked > 50


def test_loop_watch_rejects_bad_sizes():
    with pytest.raises(ValueError, match="positive sizes"):
        LoopWatch(max_period=0)


def test_accept_window_is_the_mean_of_the_last_w_steps():
    r = random.Random(3)
    w, steps = AcceptWindow(16), []
    for _ in range(500):
        n = r.randrange(1, 5)
        w.add(n)
        steps.append(n)
        last = steps[-16:]
        assert w.mean() == pytest.approx(sum(last) / len(last))
        assert w.full() == (len(steps) >= 16)
        assert w.overall() == pytest.approx(sum(steps) / len(steps))


def test_speedup_and_buckets():
    assert speedup_estimate(2.0, 0.03, 0.02) == pytest.approx(2.0 * 0.02 / 0.03)
    assert [batch_bucket(n) for n in (0, 1, 2, 3, 4, 5, 64, 65)] == [0, 1, 2, 4, 4, 8, 64, 128]
    with pytest.raises(ValueError, match="step times must be positive"):
        speedup_estimate(2.0, 0.0, 0.02)


# ---- the guard fed crafted steps ---------------------------------------------------------------------
class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def _out(rid, ids, done=False):
    return NS(request_id=rid, new_token_ids=list(ids), finish_reason="length" if done else None)


def _stats(drafts=0, draft_tokens=0, accepted=0, running=1):
    spec = NS(num_drafts=drafts, num_draft_tokens=draft_tokens, num_accepted_tokens=accepted) if drafts else None
    return NS(spec_decoding_stats=spec, num_running_reqs=running), NS(num_prompt_tokens=0)


class Log:
    def __init__(self):
        self.lines = []

    def warning(self, fmt, *args):
        self.lines.append(fmt % args)


def _run(guard, streams, clock=None, step_s=0.01, k=3):
    """Feed ``streams`` {rid: [tokens per step...]} step by step (all requests at once); each request's
    ids are a non-periodic stream. Returns the outputs as passed (to check they are untouched)."""
    r = random.Random(5)
    steps = max(len(s) for s in streams.values())
    passed = []
    for i in range(steps + 1):
        outs, drafts, acc = [], 0, 0
        for rid, s in streams.items():
            if i == 0:
                outs.append(_out(rid, [r.randrange(10**6)]))  # the prefill's token
            elif i <= len(s):
                outs.append(_out(rid, [r.randrange(10**6) for _ in range(s[i - 1])], done=i == len(s)))
                drafts, acc = drafts + 1, acc + s[i - 1] - 1
        frozen = copy.deepcopy(outs)
        guard.observe(outs, {})
        assert [vars(o) for o in outs] == [vars(o) for o in frozen]  # read, never changed
        passed.append(outs)
        if clock is not None:
            clock.t += step_s
        sched, it = _stats(drafts, drafts * k if k else 0, acc, running=len(outs))
        guard.end_step(sched, it)
    return passed


def test_healthy_streams_raise_nothing():
    log, clock = Log(), Clock()
    g = Guard(3, "mtp", log=log, clock=clock)
    r = random.Random(1)
    _run(g, {f"r{i}": [r.choice([1, 2, 3, 4, 4]) for _ in range(120)] for i in range(8)}, clock)
    assert g.incidents == [] and log.lines == []
    assert g.reqs == {}  # evicted on finish
    assert 2.0 < g.baseline.value < 3.6


def test_mtp_request_with_zero_accepted_warns_once_naming_it():
    log = Log()
    g = Guard(3, "mtp", log=log)
    _run(g, {"good": [3] * 40, "bad": [1] * 40})
    kinds = [(i.kind, i.request) for i in g.incidents]
    assert kinds.count(("acceptance_collapse", "bad")) == 1 and ("acceptance_collapse", "good") not in kinds
    assert "0 of its last 48 drafts accepted" in log.lines[0]


def test_drift_from_the_baseline_warns_where_the_drafter_proposes_only_sometimes():
    g = Guard(3, "ngram", log=Log())
    _run(g, {"a": [3] * 30, "b": [2] * 30})  # baseline 2.5
    assert g.incidents == []
    _run(g, {"c": [1] * 20 + [2] * 2 + [1] * 10})  # 1.06 over its window: collapsed against 2.5
    assert [(i.kind, i.request) for i in g.incidents] == [("acceptance_collapse", "c")]
    g2 = Guard(3, "ngram", log=Log())  # the same request without a baseline: ngram's 1-token steps may be draft-free
    _run(g2, {"c": [1] * 20 + [2] * 2 + [1] * 10})
    assert g2.incidents == []


def test_engine_zero_acceptance_episode_warns_once_and_rearms():
    g = Guard(3, "ngram", log=Log())
    _run(g, {"x": [1] * 30})  # 30 steps x 3 drafts, none accepted
    assert [i.kind for i in g.incidents] == ["zero_acceptance"]
    _run(g, {"y": [2] + [1] * 30})  # an accept re-arms, then a new episode
    assert [i.kind for i in g.incidents] == ["zero_acceptance", "zero_acceptance"]


def test_speculation_slower_than_its_draft_free_steps():
    clock = Clock()
    g = Guard(2, "ngram", log=Log(), clock=clock)
    # draft-free decode steps (no drafts proposed) at 10 ms, then speculative ones at 40 ms yielding 1.5 tokens
    _run(g, {"p": [1] * 20}, clock, step_s=0.010, k=0)
    assert len(g.plain_t[1]) >= 8
    _run(g, {"s": [2, 1] * 40}, clock, step_s=0.040)
    assert g.speedup == pytest.approx(1.5 * 0.010 / 0.040, rel=0.05)
    assert [i.kind for i in g.incidents] == ["spec_slower"]
    g2 = Guard(2, "ngram", log=Log(), clock=(c2 := Clock()))  # the same at 12 ms: 1.5 x 10 / 12 > 1, no warning
    _run(g2, {"p": [1] * 20}, c2, step_s=0.010, k=0)
    _run(g2, {"s": [2, 1] * 40}, c2, step_s=0.012)
    assert g2.speedup > 1.0 and g2.incidents == []


def test_speed_estimate_is_not_swayed_by_a_warm_up_step():
    """numba's first ngram call (seconds) on the first speculative step: the medians ignore it."""

    class Jit(Clock):
        def __init__(self, jump_at: int):
            super().__init__()
            self.n, self.jump_at = 0, jump_at

        def __call__(self):
            self.n += 1
            if self.n == self.jump_at:
                self.t += 30.0
            return self.t

    clock = Jit(jump_at=21 + 3)  # 21 plain steps (prefill + 20), the prefill of "s", then its 2nd decode step
    g = Guard(2, "ngram", log=Log(), clock=clock)
    _run(g, {"p": [1] * 20}, clock, step_s=0.010, k=0)
    _run(g, {"s": [2, 1] * 24}, clock, step_s=0.012)
    assert max(g.spec_t[1]) > 30 and g.speedup is not None  # judged with the slow step in the window
    assert g.speedup == pytest.approx(1.5 * 0.010 / 0.012, rel=0.05) and g.incidents == []


def test_loop_warns_once_per_request_with_its_cycle():
    g = Guard(0, "", log=(log := Log()))
    cyc = [11, 12, 13, 14, 15, 16, 17]
    g.observe([_out("q", [1])], {"q": NS(external_req_id="cmpl-q")})
    ids = [5, 9, 2, 8] + cyc * 20
    for i in range(0, len(ids), 3):
        g.observe([_out("q", ids[i:i + 3])], {})
        g.end_step(*_stats())
    assert [(i.kind, i.request) for i in g.incidents] == [("loop", "cmpl-q")]
    assert "7-token cycle" in log.lines[0]
    assert g.looping == 1
    g.observe([_out("q", [1], done=True)], {})
    assert len(g.incidents) == 1  # one warning per incident
    assert g.looping == 0 and g.reqs == {}


def test_aborted_requests_are_dropped_and_tracking_is_bounded(monkeypatch):
    from vllm_platform_ext.guard import monitor

    monkeypatch.setattr(monitor, "MAX_TRACKED", 50)
    g = Guard(3, "mtp", log=Log())
    g.observe([_out(f"r{i}", [1]) for i in range(80)], {})
    assert len(g.reqs) == 50
    for _ in range(monitor.STALE_STEPS + 256):
        g.end_step(*_stats())
    assert g.reqs == {}


def test_a_loop_in_the_last_ids_is_judged_when_the_request_finishes():
    g = Guard(0, "", log=Log())
    g.observe([_out("z", [1])], {})
    ids = [3, 1, 4] + [7, 8] * 40  # with the prefill's id: periodic (p=2) over the last 64 from 70 ids on
    g.observe([_out("z", ids[:64])], {})  # 65 ids: the stride's check runs, no loop yet
    assert g.incidents == []
    g.observe([_out("z", ids[64:71], done=True)], {})  # 72 ids, 7 since the check (under the stride); it ends
    assert [(i.kind, i.request) for i in g.incidents] == [("loop", "z")]
