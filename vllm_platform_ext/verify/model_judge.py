"""The verdict of ``verify --model PATH``: PASS / WARN / FAIL with the reasons, from the plain run (its
tokens, top log-probabilities and the same prompts in other batch compositions), the speculative run (tokens,
vLLM's spec-decode counters) and, where it ran, the float32 audit.

FAIL (the setup is wrong):
- an engine raised, or a plugin patch group failed in it (a fix its probe said was needed did not land);
- the speculative run proposed no draft, or accepted none: the speculative path proved nothing, or the draft
  is not this target's (a mis-loaded or missing MTP layer);
- MTP whose first draft position is accepted on fewer than :data:`MTP_FAIL_RATE` of the verify steps: the draft
  agrees with its target no better than a bad guess (Qwen3.5's MTP: a mean acceptance length of 2.9-3.5 at k=3,
  ``testing.acceptance``, so its first draft is accepted on at least (2.9 - 1) / 3 = 63% of steps; the recall
  kit's: 80%, its MTP layer's fc read with its halves swapped: 6%); greedy verification keeps the tokens right,
  so a mis-loaded MTP layer shows here and only here (vLLM #36872, #55357);
- engine drift: the speculative run's top-20 log-probabilities against plain decoding's while their tokens agree
  (the same context), positions past 0.2 nats held to the binomial limit of plain decoding's own count across
  batch compositions: a state that is off before a token is, with no float32 reference (not judged where the
  engine quantizes activations: the compressed-tensors W8A8 kit's verify step drifts 6 of 112 positions past it,
  max 0.28 nats, with plain decoding's own 11 of 112 past it against float32, 2026-12-07);
- a prompt where speculative and plain decoding part with the speculative token worse than plain's by more
  than the floor: :data:`identity.SPLIT_NATS` (0.5 nats), or plain decoding's own largest split across batch
  compositions (the kit's identity floor, ``identity.floor``) where that is larger. The two tokens share the
  prefix, so one distribution scores both: float32 transformers' where the audit ran, else the plain engine's
  own top-20 log-probabilities at that position;
- the float32 audit (where it ran): plain decoding, each batch composition and the speculative run counted as
  the kit counts them (``bounds.judged``: bad positions at 0.5 and 0.1 nats against transformers bf16 greedy's
  floor, the speculative run's floor raised to plain decoding's capped at plain's own limit; drift where the
  engine's activations are not quantized). A quantized KV cache (fp8, TurboQuant) is not what the reference
  computes: there plain decoding is its own floor and its counts are shown, not judged (as the kit's cells).

WARN (right tokens, a setup worth a look): MTP first-position acceptance under :data:`MTP_WARN_RATE`; speculative
decoding slower than plain on the same prompts (vLLM #47277); plain decoding parting from itself across batch
compositions by more than 0.5 nats (not batch-invariant: spec splits are then judged against that spread).
"""
from __future__ import annotations

from vllm_platform_ext.testing.acceptance import mean_length
from vllm_platform_ext.testing.identity import SPLIT_NATS, UNQUANTIZED_KV, first_difference

MTP_FAIL_RATE = 0.3
MTP_WARN_RATE = 0.6


def engine_gap(top: list, chosen: int, other: int) -> tuple[float, bool]:
    """``(logprob(chosen) - logprob(other), exact)`` at one position from an engine's top log-probabilities
    (``[[token, logprob], ...]``); where ``other`` is not among them, the gap to the lowest one listed, a lower
    bound (``exact`` False)."""
    lp = {int(t): float(v) for t, v in top}
    if chosen not in lp:
        return float("nan"), False
    if other in lp:
        return lp[chosen] - lp[other], True
    return lp[chosen] - min(lp.values()), False


def split(spec_tokens: list, plain_tokens: list, plain_top: list, regrets: tuple | None = None) -> dict | None:
    """The first position where ``spec_tokens`` leave ``plain_tokens`` and how much worse the speculative token
    is there (``worse``, nats; negative: better): float32's regrets ``(spec, plain)`` where given, else the
    plain engine's ``plain_top``. None where they agree."""
    i = first_difference(spec_tokens, plain_tokens)
    if i is None:
        return None
    out = {"pos": i}
    if i >= min(len(spec_tokens), len(plain_tokens)):
        return out
    if regrets is not None:
        rs, rp = float(regrets[0][i]), float(regrets[1][i])
        out.update(worse=round(rs - rp, 4), by="float32")
    elif plain_top and i < len(plain_top):
        gap, exact = engine_gap(plain_top[i], plain_tokens[i], spec_tokens[i])
        out.update(worse=round(gap, 4), by="plain engine" + ("" if exact else " (lower bound: not in its top)"))
    return out


def engine_drift(tokens: list, top: list, ref_tokens: list, ref_top: list) -> dict:
    """Two runs of the same engine settings on the same prompts, position by position while their tokens agree
    (the same context): the largest ``|logprob - ref logprob|`` over the tokens both top lists hold. ``count``:
    positions past :data:`audit.DRIFT_NATS` of ``positions`` compared; ``max``: the largest drift."""
    from vllm_platform_ext.testing.audit import DRIFT_NATS

    n = count = 0
    worst = 0.0
    for t, lp, rt, rlp in zip(tokens, top or [], ref_tokens, ref_top or []):
        stop = first_difference(t, rt)
        for j in range(min(len(lp), len(rlp), len(t) if stop is None else stop + 1)):
            a, b = {int(x): float(v) for x, v in lp[j]}, {int(x): float(v) for x, v in rlp[j]}
            both = set(a) & set(b)
            if not both:
                continue
            d = max(abs(a[x] - b[x]) for x in both)
            n, count, worst = n + 1, count + (d > DRIFT_NATS), max(worst, d)
    return {"count": count, "positions": n, "max": round(worst, 4)}


def drift_check(plain: dict, spec: dict, alpha: float) -> tuple[dict, str | None]:
    """Speculative decoding's top log-probabilities against plain decoding's at the positions they share, held
    to plain decoding's own drift across batch compositions (the larger count of any composition) through the
    kit's binomial limit (``bounds.limit``); the float32-free check of a state that is wrong before a token is."""
    from vllm_platform_ext.testing.bounds import limit

    own = {name: engine_drift(toks, (plain.get("composition_logprobs") or {}).get(name), plain["tokens"],
                              plain.get("logprobs")) for name, toks in (plain.get("compositions") or {}).items()}
    got = engine_drift(spec["tokens"], spec.get("logprobs"), plain["tokens"], plain.get("logprobs"))
    floor = max([0] + [d["count"] for d in own.values()])
    rec = {"spec": got, "plain_spread": own, "floor": floor}
    if not got["positions"]:
        return rec, None
    rec["limit"] = limit(min(floor, got["positions"]), got["positions"], alpha)
    if got["count"] > rec["limit"]:
        return rec, (f"speculative decoding's log-probabilities leave plain decoding's by > 0.2 nats at "
                     f"{got['count']} of {got['positions']} shared positions (largest {got['max']:.2f}), limit "
                     f"{rec['limit']} (plain decoding against itself in other batches: {floor})")
    return rec, None


def spread(plain: dict, f32: dict | None) -> list[dict | None]:
    """Per prompt, the earliest split of plain decoding from itself over its batch compositions
    (``plain["compositions"]``), with the composition's name."""
    out = []
    for p, toks in enumerate(plain["tokens"]):
        best = None
        for name, comp in (plain.get("compositions") or {}).items():
            regs = None
            if f32 is not None and f"c:{name}" in f32 and "plain" in f32:
                regs = (f32[f"c:{name}"].regrets[p], f32["plain"].regrets[p])
            s = split(comp[p], toks, (plain.get("logprobs") or [[]] * len(toks))[p], regs)
            if s is not None and (best is None or s["pos"] < best["pos"]):
                best = {**s, "composition": name}
        out.append(best)
    return out


def first_rate(run: dict) -> float:
    per = run.get("accepted_per_pos") or []
    return per[0] / run["num_drafts"] if per and run.get("num_drafts") else 0.0


def acceptance(run: dict, k: int) -> dict:
    drafts = run.get("num_drafts", 0)
    per = list(run.get("accepted_per_pos") or [])
    return {"k": k, "drafts": drafts, "draft_tokens": run.get("num_draft_tokens", 0),
            "accepted": run.get("num_accepted_tokens", 0),
            "mean_length": round(mean_length(run.get("num_accepted_tokens", 0), drafts), 3),
            "per_position": [round(c / drafts, 3) if drafts else 0.0 for c in per[:k]]}


def _audit_lines(audit: dict, kv: str, act_quant: bool) -> tuple[list[str], list[str], list[dict]]:
    """(fails, notes, judged rows) of the float32 audit."""
    from vllm_platform_ext.testing.bounds import judged

    floor, a = audit["floor"], audit["audits"]
    fails, notes, rows = [], [], []
    kv_quant = kv not in UNQUANTIZED_KV
    keys = ["plain"] + sorted(k for k in a if k.startswith("c:")) + ["spec"]
    for key in keys:
        if key not in a:
            continue
        plain = a["plain"] if key == "spec" and "plain" in a else None
        crit, problems = judged(a[key], floor, plain)
        if act_quant or kv_quant:  # the reference computes neither: drift shown, not judged
            shown = [c for c in crit if c.measure == "drift"]
            crit = [c for c in crit if c.measure != "drift"]
        else:
            shown = []
        judged_here = not (kv_quant and key != "spec")
        over = [c.text() for c in crit if not c.ok] + problems
        rows.append({"run": key, "judged": judged_here, "criteria": [c.as_dict() for c in crit + shown],
                     "problems": problems})
        name = {"plain": "plain decoding", "spec": "speculative decoding"}.get(key, f"plain decoding ({key[2:]})")
        if over and judged_here:
            fails.append(f"float32 audit, {name}: {'; '.join(over)}")
        elif over:
            notes.append(f"float32 audit, {name} (KV {kv}: shown, not judged): {'; '.join(over)}")
    return fails, notes, rows


def judge(plain: dict, spec: dict, spec_cfg: dict, kv: str = "auto", audit: dict | None = None,
          act_quant: bool = False, spread_nats: float = SPLIT_NATS, alpha: float = 0.01) -> dict:
    """The verdict (``status``, ``reasons``) with what it rests on (``prompts``, ``acceptance``, ``audit``)."""
    fails, warns, notes = [], [], []
    for name, run in (("plain", plain), ("speculative", spec)):
        if run.get("error"):
            fails.append(f"the {name} engine raised: {run['error']}")
        bad = sorted(g for g, s in (run.get("patches") or {}).items() if s == "failed")
        if bad:
            fails.append(f"plugin patch group(s) failed in the {name} engine: {', '.join(bad)}")
    k = int(spec_cfg.get("num_speculative_tokens") or 0)
    method = str(spec_cfg.get("method"))
    out = {"status": "FAIL", "reasons": [], "prompts": [], "acceptance": acceptance(spec, k), "audit": []}
    if plain.get("error") or spec.get("error"):
        out["reasons"] = [f"FAIL: {x}" for x in fails]
        return out
    f32 = audit["audits"] if audit else None
    if not spec.get("num_drafts"):
        fails.append("no draft proposed: the speculative path was not exercised")
    elif not spec.get("num_accepted_tokens"):
        fails.append(f"no draft accepted of {spec.get('num_draft_tokens', 0)}: the draft is not this model's "
                     "(mis-loaded or missing draft/MTP weights)")
    elif "mtp" in method:
        rate = first_rate(spec)
        if rate < MTP_FAIL_RATE:
            fails.append(f"MTP acceptance collapse: the first draft accepted on {rate:.0%} of verify steps "
                         f"(< {MTP_FAIL_RATE:.0%}; a trained one: >= 65%): a mis-loaded MTP layer")
        elif rate < MTP_WARN_RATE:
            warns.append(f"low MTP acceptance: the first draft accepted on {rate:.0%} of verify steps "
                         f"(< {MTP_WARN_RATE:.0%})")
    own = spread(plain, f32)
    floor = max([spread_nats] + [s["worse"] for s in own if s and "worse" in s and s["worse"] == s["worse"]])
    if floor > spread_nats:
        warns.append(f"plain decoding parts from itself across batch compositions by up to {floor:.2f} nats: this "
                     "engine is not batch-invariant here; speculative splits are judged against that spread")
    wrong = []
    for p, (st, pt) in enumerate(zip(spec["tokens"], plain["tokens"])):
        regs = (f32["spec"].regrets[p], f32["plain"].regrets[p]) if f32 and "spec" in f32 and "plain" in f32 else None
        s = split(st, pt, (plain.get("logprobs") or [[]] * len(plain["tokens"]))[p], regs)
        out["prompts"].append({"prompt": p + 1, "split": s, "plain_spread": own[p]})
        if s and s.get("worse", 0) > floor:
            wrong.append(f"prompt {p + 1} at {s['pos']} ({s['worse']:.2f} nats worse by the {s['by']})")
    out["engine_drift"], drifted = drift_check(plain, spec, alpha)
    if drifted and act_quant:  # quantized activations: int8/fp8 GEMMs of the verify step's shape round otherwise
        notes.append(f"{drifted} (activations quantized: shown, not judged)")
    elif drifted:
        fails.append(drifted)
    if wrong:
        fails.append(f"speculative decoding parts from plain decoding with a worse token (> {floor:.2f} nats, plain "
                     f"decoding's own floor): {', '.join(wrong)}")
    if audit:
        f, n, rows = _audit_lines(audit, kv, act_quant)
        fails += f
        notes += n
        out["audit"] = rows
    tp, ts = plain.get("tokens_per_s", 0.0), spec.get("tokens_per_s", 0.0)
    if tp and ts and ts < tp:
        warns.append(f"speculative decoding is slower than plain: {ts:.1f} against {tp:.1f} tokens/s")
    out["status"] = "FAIL" if fails else "WARN" if warns else "PASS"
    out["reasons"] = [f"FAIL: {x}" for x in fails] + [f"WARN: {x}" for x in warns] + [f"note: {x}" for x in notes]
    return out


def _split_text(s: dict | None) -> str:
    if s is None:
        return "-"
    text = str(s["pos"])
    if "worse" in s:
        text += f" ({s['worse']:+.2f})"
    return text + (f" {s['composition']}" if "composition" in s else "")


def format_report(rep: dict) -> str:
    """The printed report (``rep``: :func:`model_check.run`'s record)."""
    plain, spec, v = rep["plain"], rep["spec"], rep["verdict"]
    acc = v["acceptance"]
    lines = [f"model: {rep['model']} ({rep['checkpoint']})",
             f"engine: {rep['engine']}",
             f"settings: {rep['settings_text']}",
             f"speculative: {rep['speculative_text']}",
             f"prompts: {rep['prompts_text']}, {rep['max_tokens']} tokens each, greedy; plain decoding also in "
             f"batch compositions {', '.join(plain.get('compositions') or {}) or '(none)'}",
             "",
             f"{'':<22}{'plain':>10}{'speculative':>14}",
             f"{'tokens/s':<22}{plain.get('tokens_per_s', 0):>10.1f}{spec.get('tokens_per_s', 0):>14.1f}",
             f"{'engine start s':<22}{plain.get('init_s', 0):>10.1f}{spec.get('init_s', 0):>14.1f}",
             f"{'acceptance length':<22}{'-':>10}{acc['mean_length']:>14.2f}"
             f"   (k={acc['k']}; {acc['accepted']}/{acc['draft_tokens']} drafts accepted; per position "
             f"{' '.join(f'{x:.2f}' for x in acc['per_position'])})",
             "",
             "prompt  first split spec vs plain (nats worse)   plain vs itself, other batches"]
    for row in v["prompts"]:
        lines.append(f"{row['prompt']:>6}  {_split_text(row['split']):<38} {_split_text(row['plain_spread'])}")
    d = v.get("engine_drift") or {}
    if d.get("spec"):
        lines.append(f"engine drift (top-20 log-probabilities > 0.2 nats apart, while the tokens agree): speculative "
                     f"vs plain {d['spec']['count']}/{d['spec']['positions']} (max {d['spec']['max']:.3f}, limit "
                     f"{d.get('limit', '-')}); plain vs itself in other batches: " + ", ".join(
                         f"{k} {x['count']}/{x['positions']}" for k, x in d["plain_spread"].items()))
    lines.append(f"audit: {rep['audit_text']}")
    for row in v["audit"]:
        crit = "; ".join(f"{c['count']}/{c['positions']} {'drift' if c['measure'] == 'drift' else ''}>"
                         f"{c['nats']:g} (limit {c['limit']})" for c in row["criteria"])
        lines.append(f"  {row['run']:<12} {crit}{'' if row['judged'] else '  (shown, not judged)'}")
    lines += [f"  {r}" for r in v["reasons"]]
    if rep.get("not_run"):
        lines.append(f"not run here: {rep['not_run']}")
    head = {"PASS": "speculative decoding matches plain decoding and the floors",
            "WARN": "tokens right, see the warnings", "FAIL": "see the reasons"}[v["status"]]
    lines.append(f"verify --model: {v['status']} ({head})")
    return "\n".join(lines)
