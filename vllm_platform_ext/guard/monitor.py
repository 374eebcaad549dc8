"""The guard's state in the API server process: one :class:`Guard`, fed by two hooks.

* :meth:`Guard.observe` sees every ``EngineCoreOutput`` of a step (``request_id``,
  ``new_token_ids``, ``finish_reason``) as vLLM's ``OutputProcessor.process_outputs`` gets them
  (patch group ``guard.live``): per request a loop watch and an acceptance window, evicted when the
  request finishes. It reads the outputs and never changes them.
* :meth:`Guard.end_step` runs from the stat logger's ``record`` (vLLM calls it once per engine
  step, after the outputs): the engine's speculative-decoding counters of the step
  (``SchedulerStats.spec_decoding_stats``), the step's wall time, the metrics.

Per-request speculative counters are not in a stat logger's inputs on any line served
(``FinishedRequestStats`` has ``num_generation_tokens`` only; 0.32+ can attach
``RequestSpecDecodeMetrics`` to a request's *last* output, opt-in by
``--per-request-spec-decode-metrics``), so a request's acceptance length here is the ids it gains
per decode step, seen live in its outputs: ``1 + accepted`` when drafts were proposed.

Each incident (one per request and kind, or per engine episode) logs one warning naming the
request and the likely cause and counts in ``vllm_platform_ext:guard_incidents_total``.
"""
from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass
from statistics import median

from vllm_platform_ext.guard.detect import (ACCEPT_WINDOW, AcceptWindow, Ewma, LoopWatch, batch_bucket,
                                            speedup_estimate)

KINDS = ("loop", "acceptance_collapse", "zero_acceptance", "spec_slower")
COLLAPSE_AL = 1.1  # a request's window mean at or below this is a collapse ...
BASELINE_MIN_AL = 1.5  # ... when the finished requests' mean acceptance length is at least this
ZERO_DRAFTS = 64  # engine-wide: this many draft tokens in a row with none accepted is an episode
SPEED_WINDOW = 64  # the last decode steps of a batch bucket whose medians are compared
SPEED_MIN_SPEC_STEPS = 32  # decode steps with drafts in the window before the speed estimate is judged ...
SPEED_MIN_PLAIN_STEPS = 8  # ... and draft-free decode steps of the same batch bucket
SPEED_EVERY = 16  # judged once per this many speculative steps of a bucket
MAX_TRACKED = 4096  # requests tracked at once (the oldest is dropped beyond it)
STALE_STEPS = 1024  # a request not seen for this many steps (aborted by the client) is dropped
# drafters that propose k drafts at every decode step: an all-1 window is 0 accepted of window * k drafts
MODEL_DRAFTERS = ("mtp", "eagle", "eagle3", "draft_model", "medusa", "mlp_speculator", "dflash")


def _logger():
    try:
        from vllm.logger import init_logger

        return init_logger("vllm.vllm_platform_ext.guard")
    except Exception:
        return logging.getLogger("vllm_platform_ext.guard")


@dataclass
class Incident:
    kind: str
    request: str  # the external request id, or "engine"
    message: str


class _Req:
    __slots__ = ("name", "loop", "acc", "seen", "reported")

    def __init__(self, name: str, step: int) -> None:
        self.name = name
        self.loop = LoopWatch()
        self.acc = AcceptWindow()
        self.seen = step
        self.reported: set = set()


class Guard:
    """Per-request watches and engine counters; ``sink(incident)`` gets each incident (the stat
    logger's metrics), ``log`` each warning."""

    def __init__(self, spec_k: int = 0, method: str | None = None, sink=None, log=None, clock=time.monotonic) -> None:
        self.clock = clock  # the step timer (a test's own clock)
        self.spec_k = int(spec_k or 0)
        self.method = method or ""
        self.sink = sink
        self.log = log or _logger()
        self.reqs: dict[str, _Req] = {}
        self.step = 0
        self.incidents: list[Incident] = []  # the last 256, for tests and doctor-like readers
        self.counts = {k: 0 for k in KINDS}
        self.baseline = Ewma(0.2)  # finished requests' acceptance length (>= ACCEPT_WINDOW decode steps)
        self.finished_al: list[float] = []  # finished requests' acceptance length since the last end_step
        self.step_tokens = 0
        self.step_reqs = 0
        self.drafts_since_accept = 0
        self.engine_al = Ewma(0.05)
        self.last_t: dict[int, float] = {}
        # per batch bucket, the last SPEED_WINDOW decode steps: draft-free step times, speculative step times
        # and ids per request of those (medians: a warm-up step -- numba's first ngram call, a first graph
        # capture -- or a preempted one does not sway them)
        self.plain_t: dict[int, deque] = {}
        self.spec_t: dict[int, deque] = {}
        self.spec_tok: dict[int, deque] = {}
        self.speedup: float | None = None
        self.slow_buckets: set = set()
        self.seconds = 0.0  # the guard's own time: observe (the output hook) + the stat logger's record
        self.looping = 0
        self.reported_zero = False

    # -- incidents ---------------------------------------------------------------------------
    def _incident(self, kind: str, request: str, message: str) -> None:
        inc = Incident(kind, request, message)
        self.incidents.append(inc)
        del self.incidents[:-256]
        self.counts[kind] += 1
        self.log.warning("vllm-platform-ext guard: %s: %s: %s", kind,
                         "engine" if request == "engine" else f"request {request}", message)
        if self.sink is not None:
            self.sink(inc)

    # -- per step, from OutputProcessor.process_outputs ----------------------------------------
    def observe(self, outputs, request_states=None) -> None:
        t0 = time.perf_counter()
        reqs, step = self.reqs, self.step
        for o in outputs:
            new = o.new_token_ids
            rid = o.request_id
            st = reqs.get(rid)
            if st is None:  # its first output: the prefill's token, not a decode step
                state = request_states.get(rid) if request_states is not None else None
                st = reqs[rid] = _Req(getattr(state, "external_req_id", None) or rid, step)
                if len(reqs) > MAX_TRACKED:  # the oldest goes (its looping count with it)
                    oldest = next(iter(reqs))
                    self._finish(oldest, reqs[oldest])
                if new:
                    st.loop.add(new)
            elif new:
                st.seen = step
                n = len(new)
                if o.finish_reason is None:  # a last step may be cut short by a stop or max_tokens
                    st.acc.add(n)
                    self.step_tokens += n
                    self.step_reqs += 1
                    if (self.spec_k and st.acc.total <= COLLAPSE_AL * st.acc.window and st.acc.full()
                            and "acceptance_collapse" not in st.reported):  # both rules need a mean <= COLLAPSE_AL
                        self._check_collapse(st)
                if o.finish_reason is not None:  # its last ids: judged now, not at the next stride
                    st.loop.since = st.loop.check_every
                if st.loop.add(new) and "loop" not in st.reported:
                    st.reported.add("loop")
                    self.looping += 1
                    p = st.loop.period
                    self._incident("loop", st.name, f"its last {st.loop.min_tokens} generated tokens repeat a "
                                   f"{p}-token cycle {list(st.loop.ids[-p:])}; likely cause: greedy/low-temperature "
                                   "decoding stuck in a repetition (raise repetition_penalty / temperature, or check "
                                   "the model's output against `vllm-platform-ext verify --model`)")
            if o.finish_reason is not None:
                self._finish(rid, st)
        self.seconds += time.perf_counter() - t0

    def _check_collapse(self, st: _Req) -> None:
        m = st.acc.mean()
        w = len(st.acc.steps)
        if st.acc.total == w and self.method in MODEL_DRAFTERS:
            why = (f"0 of its last {w * self.spec_k} drafts accepted ({w} decode steps of {self.spec_k} {self.method} "
                   "drafts, 1 token each); likely cause: a draft head that does not match the target (a mis-loaded or "
                   "quantized MTP layer, a stale draft state after a partial accept) or sampling far from greedy")
        elif m <= COLLAPSE_AL and self.baseline.value is not None and self.baseline.value >= BASELINE_MIN_AL:
            why = (f"acceptance length {m:.2f} over its last {w} decode steps against {self.baseline.value:.2f} of the "
                   "requests before it; likely cause: drafts that stopped matching the target (a state carried wrongly "
                   "between requests, a changed sampling setting, or a prompt the drafter cannot predict)")
        else:
            return
        st.reported.add("acceptance_collapse")
        self._incident("acceptance_collapse", st.name, why)

    def _finish(self, rid: str, st: _Req | None) -> None:
        if st is None:
            return
        if st.acc.all_steps >= ACCEPT_WINDOW and self.spec_k:
            al = st.acc.overall()
            self.baseline.add(al)
            self.finished_al.append(al)
        if "loop" in st.reported:
            self.looping -= 1
        self.reqs.pop(rid, None)

    # -- per step, from the stat logger's record ----------------------------------------------
    def end_step(self, scheduler_stats, iteration_stats, engine_idx: int = 0) -> None:
        """The step's engine counters and wall time (its own cost is counted by the caller, the stat
        logger's ``record``, with the metric updates)."""
        self.step += 1
        tokens, nreq = self.step_tokens, self.step_reqs
        self.step_tokens = self.step_reqs = 0
        spec = getattr(scheduler_stats, "spec_decoding_stats", None) if scheduler_stats is not None else None
        drafted = int(getattr(spec, "num_draft_tokens", 0) or 0)
        if spec is not None and drafted:
            accepted = int(spec.num_accepted_tokens)
            self.engine_al.add(1.0 + accepted / max(1, int(spec.num_drafts)))
            if accepted:
                self.drafts_since_accept = 0
                self.reported_zero = False
            else:
                self.drafts_since_accept += drafted
                if self.drafts_since_accept >= ZERO_DRAFTS and not self.reported_zero:
                    self.reported_zero = True
                    ones = [r.name for r in self.reqs.values() if r.acc.steps and r.acc.steps[-1] == 1][:8]
                    self._incident("zero_acceptance", "engine",
                                   f"0 of the last {self.drafts_since_accept} draft tokens accepted, engine-wide "
                                   f"(requests decoding 1 token a step: {', '.join(ones) or 'none left'}); likely "
                                   "cause: a broken drafter (wrong draft ids, a mis-loaded MTP layer) or a target "
                                   "whose outputs went wrong while the drafter's did not")
        self._time_step(engine_idx, scheduler_stats, iteration_stats, tokens, nreq, drafted, spec)
        if self.step % 256 == 0:
            stale = [rid for rid, r in self.reqs.items() if self.step - r.seen > STALE_STEPS]
            for rid in stale:
                self._finish(rid, self.reqs[rid])

    def _time_step(self, engine_idx, scheduler_stats, iteration_stats, tokens, nreq, drafted, spec) -> None:
        now = self.clock()
        last = self.last_t.get(engine_idx)
        running = int(getattr(scheduler_stats, "num_running_reqs", 0) or 0) if scheduler_stats is not None else 0
        self.last_t[engine_idx] = now if running else None
        prefill = int(getattr(iteration_stats, "num_prompt_tokens", 0) or 0) if iteration_stats is not None else 0
        if last is None or not nreq or prefill or not self.spec_k:
            return
        dt, b = now - last, batch_bucket(nreq)
        if not drafted:  # a decode step that verified no draft: what plain decoding costs at this batch
            self.plain_t.setdefault(b, deque(maxlen=SPEED_WINDOW)).append(dt)
            return
        st = self.spec_t.setdefault(b, deque(maxlen=SPEED_WINDOW))
        st.append(dt)
        tok = self.spec_tok.setdefault(b, deque(maxlen=SPEED_WINDOW))
        tok.append(tokens / nreq)
        pt = self.plain_t.get(b)
        if pt is None or len(pt) < SPEED_MIN_PLAIN_STEPS or len(st) < SPEED_MIN_SPEC_STEPS or self.step % SPEED_EVERY:
            return
        al, spec_s, plain_s = sum(tok) / len(tok), median(st), median(pt)
        est = speedup_estimate(al, spec_s, plain_s)
        self.speedup = est
        if est < 1.0 and b not in self.slow_buckets:
            self.slow_buckets.add(b)
            self._incident("spec_slower", "engine",
                           f"at batch {b // 2 + 1}-{b}: {al:.2f} tokens per request per {spec_s * 1e3:.1f} ms "
                           f"speculative step (median of {len(st)}) against 1 per {plain_s * 1e3:.1f} ms draft-free "
                           f"step (median of {len(pt)}): {est:.2f}x of plain decoding; likely cause: acceptance too "
                           "low for the drafter's cost at this batch (lower num_speculative_tokens, or turn "
                           "speculation off above this batch with disable_by_batch_size)")
        elif est >= 1.05:
            self.slow_buckets.discard(b)


_GUARD: Guard | None = None


def current() -> Guard | None:
    """The process's guard (``None`` until the guard's stat logger is built)."""
    return _GUARD


def install(guard: Guard | None) -> Guard | None:
    global _GUARD
    _GUARD = guard
    return guard


def disable(exc: BaseException) -> None:
    """Turn the guard off after an error of its own (logged once): serving goes on unwatched."""
    if _GUARD is not None:
        _logger().error("vllm-platform-ext guard: disabled after an error of its own (%s: %s); serving goes on "
                        "unwatched", type(exc).__name__, exc)
    install(None)
