"""How many bad positions a run may have beside its floor, in positions: a binomial upper quantile.

The floor (transformers' own bf16 greedy tokens under the float32 audit, :mod:`.audit`) has
``floor_bad`` bad positions of ``positions``. A run that is as good as the floor has bad
positions at the floor's rate ``p``, estimated with one pseudo-count each way,
``p = (floor_bad + 1) / (positions + 2)`` (a floor of 0 still allows a position or two). Its
*limit* is the ``(1 - alpha)`` upper quantile of Binomial(positions, p): the smallest ``k`` with
``P(X <= k) >= 1 - alpha``, so a run at the floor's rate exceeds it with probability at most
``alpha``. A run passes at ``count <= limit``. Computed exactly in integers (``math.comb``), no
floating point: at 896 positions, a floor of 0 gives a limit of 4, a floor of 4 a limit of 11.

The binomial treats positions as independent; they are not quite (a wrong token changes the
context of the next ones), which is one reason the cells also check token identity
(:mod:`.identity`) and a second, stricter threshold.

:class:`Criterion` is one such judgement at one regret threshold, with its parts kept apart so a
reader can recompute it: the run's count, the bf16 floor's count, the same-KV plain-decoding count
a speculative run is also held to (capped at that plain run's own limit against the bf16 floor: a
plain run that is itself wrong cannot raise the floor), and the limit of the larger. Its
``measure`` is ``"regret"`` (the emitted token's, :mod:`.audit`) or ``"drift"`` (how far the
engine's top log-probabilities sit from float32's, where the engine returned them).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from fractions import Fraction
from math import comb

from vllm_platform_ext.testing.audit import DRIFT_NATS, THRESHOLDS

ALPHA = 0.01
MEASURES = ("regret", "drift")


def _count(name: str, value, low: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer count, got {value!r}")
    if value < low:
        raise ValueError(f"{name} must be >= {low}, got {value}")
    return value


def limit(floor_bad: int, positions: int, alpha: float = ALPHA) -> int:
    """The largest bad count of ``positions`` consistent with a floor of ``floor_bad`` bad of
    ``positions``: the ``(1 - alpha)`` quantile of Binomial(positions, (floor_bad + 1) / (positions + 2))."""
    n = _count("positions", positions, 1)
    f = _count("floor_bad", floor_bad)
    if f > n:
        raise ValueError(f"floor_bad {f} exceeds positions {n}")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float, Fraction)) or not 0 < alpha < 1:
        raise ValueError(f"alpha must be a probability strictly between 0 and 1, got {alpha!r}")
    a, b = f + 1, n + 2  # p = a / b
    conf = 1 - (Fraction(str(alpha)) if isinstance(alpha, float) else Fraction(alpha))
    # P(X <= k) >= conf  <=>  sum_{j <= k} C(n, j) a^j (b - a)^(n - j) >= conf * b^n, all in integers
    target, total = conf.numerator * b ** n, 0
    for k in range(n + 1):
        total += comb(n, k) * a ** k * (b - a) ** (n - k)
        if total * conf.denominator >= target:
            return k
    return n  # not reached: the sum over every k is b^n


@dataclass(frozen=True)
class Criterion:
    """One threshold's judgement of a run: ``count`` positions with regret > ``nats`` of ``positions``
    against ``limit`` = :func:`limit` of max(``floor_bf16``, ``floor_plain``) at ``alpha``.
    ``floor_plain``: the same-KV plain-decoding count capped at its own limit (``plain_raw``
    uncapped); both None when no plain run counts."""
    nats: float
    count: int
    positions: int
    floor_bf16: int
    limit: int
    alpha: float = ALPHA
    floor_plain: int | None = None
    plain_raw: int | None = None
    measure: str = "regret"

    @property
    def ok(self) -> bool:
        return self.count <= self.limit

    @property
    def floor(self) -> int:
        """The count the limit was computed from."""
        return max(self.floor_bf16, self.floor_plain or 0)

    def text(self) -> str:
        """``"9 of 224 positions > 0.5 nats, limit 4 (bf16 floor 0)"``; with a plain run, its count
        and, where capped, its raw count."""
        plain = ""
        if self.floor_plain is not None:
            raw = f" capped from {self.plain_raw}" if self.plain_raw != self.floor_plain else ""
            plain = f", plain decoding {self.floor_plain}{raw}"
        what = "drift" if self.measure == "drift" else ""
        return (f"{self.count} of {self.positions} positions{' ' + what if what else ''} > {self.nats:g} nats, "
                f"limit {self.limit} "
                f"(bf16 floor {self.floor_bf16}{plain})")

    def as_dict(self) -> dict:
        return asdict(self)


def _counted(audit, nats: float, measure: str) -> int:
    return audit.drift_count(nats) if measure == "drift" else audit.count(nats)


def criterion(nats: float, run, bf16, plain=None, alpha: float = ALPHA, measure: str = "regret") -> Criterion:
    """``run``, ``bf16`` (the floor), ``plain`` (the same-KV plain decoding, or None): audits with
    ``positions`` and ``count(nats)`` (:class:`audit.AuditResult`; ``measure="drift"``:
    ``drift_count(nats)``). Raises ``ValueError`` when they audited different numbers of positions
    (the same prompts and max_tokens give the same)."""
    if measure not in MEASURES:
        raise ValueError(f"measure {measure!r} not in {MEASURES}")
    n = run.positions
    for name, other in (("the bf16 floor", bf16), ("the plain-decoding run", plain)):
        if other is not None and other.positions != n:
            raise ValueError(f"{name} audited {other.positions} positions, the run {n}: "
                             "compare audits of the same prompts and max_tokens")
    f = _counted(bf16, nats, measure)
    raw = None if plain is None else _counted(plain, nats, measure)
    capped = None if raw is None else min(raw, limit(f, n, alpha))
    return Criterion(nats, _counted(run, nats, measure), n, f, limit(max(f, capped or 0), n, alpha), alpha,
                     capped, raw, measure)


def judged(audit, bf16, plain=None, alpha: float = ALPHA, thresholds: tuple = THRESHOLDS,
           require_drift: bool = False) -> tuple[list, list[str]]:
    """(criteria, problems) of one audited run against the bf16 floor (and ``plain``, the same-KV
    plain decoding, or None): an audit of no position, or of other positions than the floor's (an
    engine that returned fewer tokens than asked), is a problem, not a verdict. A ``plain`` audit of
    other positions is left out: its own cell fails on it.

    The regret criteria at each of ``thresholds``, then, where the run and the floor both recorded
    drift (:attr:`audit.AuditResult.has_drift`), the drift criterion at :data:`audit.DRIFT_NATS`
    (a plain run without drift is left out of it). ``require_drift``: a run without drift is a
    problem (a caller whose engine returns its logprobs)."""
    if audit.positions == 0:
        return [], ["no position audited: the engine returned no tokens"]
    if audit.positions != bf16.positions:
        return [], [f"the engine returned {audit.positions} positions where the bf16 floor has {bf16.positions} "
                    "(prompts x max_tokens)"]
    if plain is not None and plain.positions != audit.positions:
        plain = None
    crit = [criterion(t, audit, bf16, plain, alpha) for t in thresholds]
    problems = []
    if audit.has_drift and bf16.has_drift:
        crit.append(criterion(DRIFT_NATS, audit, bf16, plain if plain is not None and plain.has_drift else None,
                              alpha, "drift"))
    elif require_drift:
        problems.append("no drift judged: " + ("the engine's logprobs were not recorded" if not audit.has_drift
                                                else "the bf16 floor has no drift"))
    return crit, problems
