"""The guard's detectors: pure Python over token ids and step counts, no vLLM, no torch.

Each is bounded in memory (a ring of the last tokens / steps of one request) and in time per
token (a few C-level list operations), so the guard's cost per engine step stays a small
fraction of the step (``benchmarks/bench_guard_overhead.py``). Definitions (the docs,
``docs/live_guard.md``, quote them):

* **loop**: the generated ids end in a period-``p`` cycle, ``p <= max_period``, over the last
  ``min_tokens`` ids: ``x[i] == x[i - p]`` for each of the last ``min_tokens`` positions ``i``
  (so the last ``min_tokens + p`` ids are ``p``-periodic). The smallest such ``p`` is reported.
* **acceptance length** of a request: the ids it gained per decode step (``1 + accepted drafts``
  of that step; a step whose drafts were all rejected gives 1). Its window is its last
  ``window`` decode steps; its prefill step and its last step (which a stop or ``max_tokens`` may
  cut short) are not decode steps here.
"""
from __future__ import annotations

from collections import deque

LOOP_MAX_PERIOD = 32  # the longest cycle looked for, in tokens
LOOP_MIN_TOKENS = 64  # the cycle must cover this many trailing generated ids
LOOP_CHECK_EVERY = 8  # a request's ids are looked at once per this many new ids (detection delay <= this)
ACCEPT_WINDOW = 16  # decode steps of a request whose acceptance length is judged


def trailing_period(ids: list[int], max_period: int = LOOP_MAX_PERIOD, min_tokens: int = LOOP_MIN_TOKENS) -> int:
    """The smallest ``p <= max_period`` such that ``ids`` ends in a period-``p`` cycle over its
    last ``min_tokens`` positions, else 0. Cost: one C-level scan of the last ``max_period`` ids
    for the last id, then one slice compare (early exit) per candidate period."""
    n = len(ids)
    if n <= min_tokens:
        return 0
    last = ids[-1]
    lo = max(0, n - 1 - max_period)  # candidates: positions j in [lo, n-1) with ids[j] == last, p = n-1-j
    cands = []  # found from the farthest position, so the periods come largest first
    try:
        while True:
            j = ids.index(last, lo, n - 1)
            cands.append(n - 1 - j)
            lo = j + 1
    except ValueError:
        pass
    for p in reversed(cands):
        if n - min_tokens - p < 0:
            break
        if ids[n - min_tokens:] == ids[n - min_tokens - p:n - p]:
            return p
    return 0


class LoopWatch:
    """The last ``keep`` generated ids of one request and whether they end in a loop.

    ``add`` takes a step's new ids and returns the loop's period once it is found (0 before); the
    check runs once per ``check_every`` new ids, so at most ``check_every - 1`` ids late."""

    __slots__ = ("ids", "since", "max_period", "min_tokens", "check_every", "period")

    def __init__(self, max_period: int = LOOP_MAX_PERIOD, min_tokens: int = LOOP_MIN_TOKENS,
                 check_every: int = LOOP_CHECK_EVERY) -> None:
        if max_period < 1 or min_tokens < 1 or check_every < 1:
            raise ValueError(f"LoopWatch needs positive sizes (max_period={max_period}, min_tokens={min_tokens}, "
                             f"check_every={check_every})")
        self.ids: list[int] = []
        self.since = 0
        self.max_period = max_period
        self.min_tokens = min_tokens
        self.check_every = check_every
        self.period = 0

    def add(self, new_ids) -> int:
        ids = self.ids
        ids.extend(new_ids)
        keep = self.min_tokens + self.max_period
        if len(ids) > 2 * keep:  # amortised trim: the ring never holds more than 2 * keep ids
            del ids[:-keep]
        self.since += len(new_ids)
        if self.since >= self.check_every:
            self.since = 0
            self.period = trailing_period(ids, self.max_period, self.min_tokens)
        return self.period


class AcceptWindow:
    """A request's ids per decode step over its last ``window`` decode steps."""

    __slots__ = ("steps", "total", "window", "all_steps", "all_tokens")

    def __init__(self, window: int = ACCEPT_WINDOW) -> None:
        if window < 1:
            raise ValueError(f"AcceptWindow needs window >= 1 (got {window})")
        self.steps: deque = deque()
        self.total = 0
        self.window = window
        self.all_steps = 0  # every decode step of the request (for its mean at the end)
        self.all_tokens = 0

    def add(self, n: int) -> None:
        self.steps.append(n)
        self.total += n
        self.all_steps += 1
        self.all_tokens += n
        if len(self.steps) > self.window:
            self.total -= self.steps.popleft()

    def full(self) -> bool:
        return len(self.steps) >= self.window

    def mean(self) -> float:
        return self.total / len(self.steps) if self.steps else 0.0

    def overall(self) -> float:
        return self.all_tokens / self.all_steps if self.all_steps else 0.0


class Ewma:
    """An exponentially weighted mean (``None`` until the first value)."""

    __slots__ = ("alpha", "value", "count")

    def __init__(self, alpha: float) -> None:
        self.alpha = alpha
        self.value: float | None = None
        self.count = 0

    def add(self, x: float) -> None:
        self.count += 1
        self.value = x if self.value is None else self.value + self.alpha * (x - self.value)


def batch_bucket(n: int) -> int:
    """The power-of-two bucket of a batch of ``n`` running requests (1, 2, 4, ...): step times are
    compared within one bucket only."""
    return 1 << max(0, int(n) - 1).bit_length() if n > 0 else 0


def speedup_estimate(tokens_per_req_step: float, spec_step_s: float, plain_step_s: float) -> float:
    """Speculative decoding's speed over plain decoding at the same batch: each request gains
    ``tokens_per_req_step`` ids per speculative step of ``spec_step_s`` seconds, against 1 id per
    plain step of ``plain_step_s``. Below 1.0: speculation is slower than its plain estimate."""
    if spec_step_s <= 0 or plain_step_s <= 0:
        raise ValueError(f"step times must be positive (spec {spec_step_s}, plain {plain_step_s})")
    return tokens_per_req_step * plain_step_s / spec_step_s
