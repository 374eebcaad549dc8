"""MTP acceptance of the kit's tiny models in the CPU engine: random vs distilled ``mtp.*``.

    PYTHONPATH=. VLLM_CPU_KVCACHE_SPACE=1 python benchmarks/mtp_acceptance.py \\
        --kinds qwen3_next qwen3_5_text --work /tmp/mtp_acc --out results/bench/new-mtp-acceptance/mtp_acceptance.json

Per kind: builds the kit checkpoint twice (``mtp="random"`` and ``mtp="distilled"``, cached in
``--work``), runs vLLM greedy on ``--prompts`` prompts x ``--max-tokens`` tokens with
``{"method": "mtp", "num_speculative_tokens": k}`` and once without speculation (the target is
the same checkpoint in both: the tokens must match). Reports drafts, draft tokens, accepted,
mean acceptance length (1 + accepted / drafts) and the per-position accepted counts.
The tokens of a speculative run need not equal plain decoding's (bf16 verification batches round
differently, and the kit's targets amplify any difference), so ``--audit`` scores them with the
float32 audit against transformers' bf16 floor instead, as ``verify`` does. ``--capture``: after the run, one prompt alone with the proposer's drafts recorded, compared
with :func:`mtp_distill.engine_drafts` (the torch mirror) on transformers' hidden states.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from vllm_platform_ext.testing.engine import EngineConfig, EngineSettings, apply_engine_env, run_engine
from vllm_platform_ext.testing.prompts import default_prompts

_CAPTURED: list = []


def _install_capture():
    from vllm.v1.spec_decode import llm_base_proposer as lbp

    orig = lbp.SpecDecodeBaseProposer.propose

    def propose(self, num_speculative_tokens, target_token_ids, target_positions, target_hidden_states,
                next_token_ids, token_indices_to_sample, *a, **kw):
        out = orig(self, num_speculative_tokens, target_token_ids, target_positions, target_hidden_states,
                   next_token_ids, token_indices_to_sample, *a, **kw)
        if _CAPTURED and _CAPTURED[0] == "on" and out.shape[0] == 1:
            i = int(token_indices_to_sample[0]) if token_indices_to_sample is not None else -1
            _CAPTURED.append((int(target_positions[..., i].reshape(-1)[0]), int(next_token_ids[0]),
                              out[0].tolist()))
        return out

    lbp.SpecDecodeBaseProposer.propose = propose


def per_pos(llm) -> list[int]:
    for m in llm.get_metrics():
        if m.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            return list(getattr(m, "values", []))
    return []


def measure(model: str, prompts, k: int, max_tokens: int, capture: bool, method: str = "mtp") -> dict:
    extra: dict = {}

    def then(llm, sp):
        extra["per_pos"] = per_pos(llm)
        if capture:
            from vllm import SamplingParams

            _CAPTURED[:] = ["on"]
            o = llm.generate([{"prompt_token_ids": prompts[0]}], SamplingParams(
                max_tokens=64, temperature=0.0, ignore_eos=True, detokenize=False), use_tqdm=False)
            extra["capture_tokens"] = list(o[0].outputs[0].token_ids)
            extra["captured"] = _CAPTURED[1:]
            _CAPTURED[:] = []

    settings = EngineSettings(max_tokens=max_tokens, max_num_batched_tokens=256, max_model_len=512, logprobs=0)
    run = run_engine(model, prompts, EngineConfig(mode=method, k=k), settings, then=then)
    al = 1 + run.num_accepted_tokens / run.num_drafts if run.num_drafts else 0.0
    return {"drafts": run.num_drafts, "draft_tokens": run.num_draft_tokens, "accepted": run.num_accepted_tokens,
            "mean_acceptance_length": round(al, 3), "per_pos": extra.get("per_pos", []),
            "tokens": run.tokens, "generate_s": round(run.generate_s, 1), **{k2: v for k2, v in extra.items()
                                                                          if k2 != "per_pos"}}


def compare_capture(model: str, prompt, res: dict, k: int) -> dict:
    """Drafts the engine proposed vs the torch mirror's on transformers float32 hidden states."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from vllm_platform_ext.testing.mtp_distill import MTPHead, engine_drafts

    seq = torch.tensor(list(prompt) + res["capture_tokens"])
    target = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    with torch.no_grad():
        hid = target.model(input_ids=seq[None]).last_hidden_state[0].float()
    cfg = target.config.to_dict()
    sd = load_file(os.path.join(model, "model.safetensors"))
    embed = next(v for n, v in sd.items() if n.endswith("embed_tokens.weight"))
    head = MTPHead(cfg, {n: v for n, v in sd.items() if n.startswith("mtp.")}, embed, sd["lm_head.weight"])
    same = [0] * k
    n = 0
    for pos, nxt, drafts in res["captured"]:
        if pos + 1 >= len(seq) or int(seq[pos + 1]) != nxt:
            continue
        ours = engine_drafts(head, seq, hid, pos, k)
        n += 1
        for s in range(k):
            same[s] += int(ours[s] == drafts[s])
    return {"compared": n, "same_per_step": same}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kinds", nargs="+", default=["qwen3_next", "qwen3_5_text"])
    ap.add_argument("--mtp", nargs="+", default=["random", "distilled"],
                    help="random / distilled (make_tiny_model's mtp=) or recall (target='recall': trained target + MTP)")
    ap.add_argument("--method", default="mtp", choices=("mtp", "ngram"))
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--work", default="/tmp/mtp_acceptance")
    ap.add_argument("--out", default="")
    ap.add_argument("--capture", action="store_true")
    ap.add_argument("--no-base", action="store_true", help="skip the plain-decoding token check")
    ap.add_argument("--audit", action="store_true",
                    help="the float32 audit (testing.audit) of each run's tokens against the bf16 floor")
    a = ap.parse_args(argv)
    apply_engine_env()
    if a.capture:
        _install_capture()
    from vllm_platform_ext.testing.tiny_models import make_tiny_model

    prompts = (default_prompts(0) + default_prompts(1))[: a.prompts]
    report = {"k": a.k, "prompts": len(prompts), "max_tokens": a.max_tokens, "kinds": {}}
    for kind in a.kinds:
        rows = report["kinds"][kind] = {}
        for mode in a.mtp:
            path = Path(a.work) / f"{kind}_{mode}"
            if not (path / "model.safetensors").is_file():
                t0 = time.time()
                make_tiny_model(kind, path, **({"target": "recall"} if mode == "recall" else {"mtp": mode}))
                print(f"[build] {kind} mtp={mode}: {time.time() - t0:.0f}s", file=sys.stderr, flush=True)
            res = measure(str(path), prompts, a.k, a.max_tokens, a.capture and a.method == "mtp", a.method)
            if a.capture and res.get("captured"):
                res["capture_check"] = compare_capture(str(path), prompts[0], res, a.k)
            res.pop("captured", None)
            res.pop("capture_tokens", None)
            rows[mode] = res
            print(f"[mtp] {kind} {mode}: " + json.dumps({x: y for x, y in res.items() if x != "tokens"}),
                  file=sys.stderr, flush=True)
        if not a.no_base:
            path = Path(a.work) / f"{kind}_{a.mtp[0]}"
            base = run_engine(str(path), prompts, EngineConfig(),
                              EngineSettings(max_tokens=a.max_tokens, max_num_batched_tokens=256, max_model_len=512, logprobs=0))
            rows["tokens_equal_base"] = {m: rows[m]["tokens"] == base.tokens for m in a.mtp}
            rows["positions_differing"] = {m: sum(x != y for r, b in zip(rows[m]["tokens"], base.tokens)
                                                  for x, y in zip(r, b)) for m in a.mtp}
            print(f"[base] {kind}: {rows['tokens_equal_base']} {rows['positions_differing']}", file=sys.stderr)
        if a.audit:
            from vllm_platform_ext.testing.audit import Reference, passes

            ref = Reference(str(Path(a.work) / f"{kind}_{a.mtp[0]}"), threads=1)
            floor = ref.floor(prompts, a.max_tokens).bad_fraction
            rows["audit"] = {"floor": round(floor, 4)}
            for m in a.mtp:
                bad = ref.audit(prompts, rows[m]["tokens"]).bad_fraction
                rows["audit"][m] = {"bad_fraction": round(bad, 4), "passes": passes(bad, floor)}
            print(f"[audit] {kind}: {rows['audit']}", file=sys.stderr, flush=True)
        for m in a.mtp:
            rows[m].pop("tokens", None)
    text = json.dumps(report, indent=1)
    print(text)
    if a.out:
        Path(a.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
