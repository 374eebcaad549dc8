"""The audit's drift (``testing/audit.py``): each position's largest ``|engine logprob - float32
logprob|`` over the engine's top tokens, checked against a float64 recomputation from the same
checkpoint; the bf16 floor's own drift; the drift criterion in ``bounds.judged`` (counted apart from
regret, judged against the floor and a plain run that has drift, a problem where required and
missing); bad input named."""
from __future__ import annotations

import pytest
import torch

from vllm_platform_ext.testing.audit import DRIFT_NATS, DRIFT_TOPK, AuditResult, Reference, drift
from vllm_platform_ext.testing.bounds import judged
from vllm_platform_ext.testing.kit_tokens import hot_token_ids
from vllm_platform_ext.testing.tiny_models import make_tiny_model


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    return Reference(str(make_tiny_model("qwen3_5_text", tmp_path_factory.mktemp("drift") / "m", target="recall")))


def _prompt():
    h = hot_token_ids()
    return [h[1], h[4], h[2], h[6], h[1], h[4], h[2], h[6], h[1]]


def _float64_rows(ref, prompt, gen):
    """The same positions' log-probabilities from a float64 copy of the float32 model."""
    import copy

    m64 = copy.deepcopy(ref.fp32).double()
    with torch.inference_mode():
        x = torch.tensor([prompt + gen[:-1]])
        return torch.log_softmax(m64(input_ids=x, use_cache=False).logits[0].double(), -1)[len(prompt) - 1:]


def test_drift_of_the_references_own_logprobs_is_float_noise_and_a_shift_is_seen(ref):
    prompt = _prompt()
    gen = ref.greedy(prompt, 12, dtype="fp32")
    rows64 = _float64_rows(ref, prompt, gen)
    top = [[[int(t), float(rows64[j, t])] for t in rows64[j].topk(DRIFT_TOPK).indices] for j in range(len(gen))]
    a = ref.audit([prompt], [gen], [top])
    assert a.has_drift and len(a.drift[0]) == len(gen) and a.max_drift < 1e-3
    # one position's logprobs moved by 0.3 nats (a dict, as vLLM gives them): that position alone drifts
    moved = [dict(row) for row in top]
    moved[5] = {t: v + (0.3 if i == 3 else 0.0) for i, (t, v) in enumerate(top[5])}
    b = ref.audit([prompt], [gen], [moved])
    assert abs(b.drift[0][5] - 0.3) < 1e-3 and b.drift_count(DRIFT_NATS) == 1 and b.drift_count(0.31) == 0
    assert b.regrets == a.regrets  # drift leaves the regret alone


def test_floor_has_drift_of_bf16_against_float32(ref):
    prompt = _prompt()
    floor = ref.floor([prompt, prompt[:5]], 8)
    assert floor.has_drift and [len(d) for d in floor.drift] == [8, 8]
    # bf16 rounding moves the recall kit's log-probabilities, but by less than the threshold
    assert 0 < floor.max_drift < DRIFT_NATS, floor.drift


def _audit(regret_bad: int, drift_bad: int, n: int = 224, drift_on: bool = True) -> AuditResult:
    regrets = [[1.0] * regret_bad + [0.0] * (n - regret_bad)]
    return AuditResult(regrets, drift=[[0.5] * drift_bad + [0.01] * (n - drift_bad)] if drift_on else [])


def test_judged_adds_the_drift_criterion_where_both_have_drift():
    floor = _audit(0, 0)
    crit, problems = judged(_audit(0, 12), floor)
    assert not problems and [c.measure for c in crit] == ["regret", "regret", "drift"]
    d = crit[2]
    assert d.nats == DRIFT_NATS and d.count == 12 and d.floor_bf16 == 0 and not d.ok and "drift > 0.2 nats" in d.text()
    assert all(c.ok for c in crit[:2])  # no token moved: only drift sees it
    # a plain run with drift raises the floor (capped at its own limit), one without is left out of drift
    with_plain = judged(_audit(0, 12), floor, _audit(0, 2))[0][2]
    assert with_plain.floor_plain == 2 and with_plain.limit > d.limit
    assert judged(_audit(0, 12), floor, _audit(0, 2, drift_on=False))[0][2].floor_plain is None


def test_judged_without_drift_keeps_two_criteria_unless_drift_is_required():
    crit, problems = judged(_audit(0, 0, drift_on=False), _audit(0, 0))
    assert [c.measure for c in crit] == ["regret", "regret"] and not problems
    _, problems = judged(_audit(0, 0, drift_on=False), _audit(0, 0), require_drift=True)
    assert problems == ["no drift judged: the engine's logprobs were not recorded"]
    _, problems = judged(_audit(0, 0), _audit(0, 0, drift_on=False), require_drift=True)
    assert problems == ["no drift judged: the bf16 floor has no drift"]


def test_bad_input_is_named(ref):
    prompt = _prompt()
    gen = ref.greedy(prompt, 4, dtype="fp32")
    rows = ref.logprobs(prompt + gen[:-1])[len(prompt) - 1:]
    with pytest.raises(ValueError, match="logprobs for 3 positions, 4 generated"):
        drift(rows, [[[1, 0.0]]] * 3, "request 0")
    with pytest.raises(ValueError, match="position 1 has no logprobs"):
        drift(rows, [[[1, 0.0]], [], [[1, 0.0]], [[1, 0.0]]], "request 0")
    with pytest.raises(ValueError, match="outside the vocabulary"):
        drift(rows, [[[10 ** 6, 0.0]]] * 4, "request 0")
    with pytest.raises(ValueError, match="1 generations but logprobs for 2"):
        ref.audit([prompt], [gen], [[], []])
    with pytest.raises(ValueError, match="no drift recorded"):
        AuditResult([[0.0]]).drift_count()


def test_reference_process_audits_drift_beside_regret(ref):
    """The reference in its own process (audit.reference_audits, as the cells and verify call it):
    drift for the entries with logprobs, none for the others, the floor's own drift."""
    from vllm_platform_ext.testing.audit import reference_audits

    prompt = _prompt()
    gen = ref.greedy(prompt, 6, dtype="fp32")
    rows = ref.logprobs(prompt + gen[:-1])[len(prompt) - 1:]
    top = [[[int(t), float(rows[j, t]) + (0.5 if j == 2 else 0.0)] for t in rows[j].topk(5).indices] for j in range(6)]
    floor, audits = reference_audits(ref.model_dir, [prompt], {"a": [gen], "b": [gen]}, 6, logprobs={"a": [top]})
    assert floor.has_drift and audits["a"].has_drift and not audits["b"].has_drift
    assert audits["a"].drift_count(DRIFT_NATS) == 1 and abs(audits["a"].drift[0][2] - 0.5) < 1e-4
    assert audits["a"].regrets == audits["b"].regrets
    with pytest.raises(ValueError, match="logprobs for entries not generated"):
        reference_audits(ref.model_dir, [prompt], {"a": [gen]}, 6, logprobs={"c": [top]})
