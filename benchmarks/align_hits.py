"""Prefix-cache hits of a hybrid model under mixed load on the CPU engine (issue 51), against prefix caching off.

    PYTHONPATH=. VLLM_CPU_KVCACHE_SPACE=1 python benchmarks/align_hits.py --modes base mtp \\
        --out results/cpu/new-align-hits/RESULTS.md

The Qwen3-Next recall kit (max positions 4096), six 1.5-3K-token prompts arriving while others decode
(steps 0, 0, 3, 6, 9, 12), three of them (1, 3, 5) sharing a ``--prefix``-token prefix, a step budget of
one block (``max_num_batched_tokens`` = the block vLLM resolves: 640 on the avx512bf16 path, ``--budget``
to change), vLLM's defaults otherwise. Per mode (plain, MTP k=3) three runs of the same requests, each in
its own engine process: prefix caching off; on with the plugin's ``mamba.align_prefill_budget``; on with
it disabled (vLLM's own scheduling). Reported per run: prefix-cache hit tokens (all, and of requests that
joined a batch with decoding ones), prompt tokens the engine computed, steps, the most requests in one
step, time to first token per request (from its arrival; seconds and steps), wall time, and for the runs
with the fix the float32 audit of every generated token against transformers' bf16 floor (bad, limit).
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_common import markdown_table, run_header, write_result  # noqa: E402

LENGTHS = (2000, 1500, 2600, 1800, 3000, 1700)
ARRIVALS = [0, 0, 3, 6, 9, 12]
GROUP = "mamba.align_prefill_budget"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--modes", nargs="+", default=["base", "mtp"], choices=["base", "mtp"])
    p.add_argument("--prefix", type=int, default=1400)
    p.add_argument("--share", default="1,3,5")
    p.add_argument("--budget", type=int, default=640)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--work", default="/tmp/align_hits")
    p.add_argument("--out", default="results/cpu/new-align-hits/RESULTS.md")
    a = p.parse_args(argv)
    from vllm_platform_ext.testing.audit import reference_audits
    from vllm_platform_ext.testing.bounds import limit
    from vllm_platform_ext.testing.mixed_load import run_in_subprocess, shared_prefix_prompts
    from vllm_platform_ext.testing.tiny_models import make_tiny_model

    model = str(make_tiny_model("qwen3_next", os.path.join(a.work, "qn4k"), max_positions=4096, target="recall"))
    share = tuple(int(x) for x in a.share.split(","))
    prompts = shared_prefix_prompts(LENGTHS, share, a.prefix)
    runs, rows = {}, []
    for mode in a.modes:
        kw = {"max_model_len": 4096, "max_num_seqs": 8, "max_num_batched_tokens": a.budget,
              "enable_chunked_prefill": True}
        if mode == "mtp":
            kw["speculative_config"] = {"method": "mtp", "num_speculative_tokens": 3}
        for name, caching, env in (("caching off", False, {}), ("caching on, plugin", True, {}),
                                   ("caching on, group disabled", True, {"VLLM_PLATFORM_EXT_DISABLE": GROUP})):
            print(f"[align_hits] {mode} {name}", file=sys.stderr, flush=True)
            runs[(mode, name)] = run_in_subprocess(model, prompts, ARRIVALS, a.max_tokens,
                                                   {**kw, "enable_prefix_caching": caching}, env=env, timeout=3600)
    # the fixed runs' tokens are audited (the others are vLLM's own scheduling, measured for hits and time)
    floor, audits = reference_audits(model, prompts, {f"{m}|{n}": r.tokens for (m, n), r in runs.items()
                                                      if n == "caching on, plugin"}, a.max_tokens)
    for (mode, name), r in runs.items():
        au = audits.get(f"{mode}|{name}")
        rows.append({"mode": "MTP k=3" if mode == "mtp" else "plain", "run": name,
                     "block": r.settings["block_size"], "hits": r.hit_tokens, "hits_under_load": r.hits_joining_decodes,
                     "computed": r.prefill_tokens, "steps": len(r.steps), "max_req_step": r.max_requests_per_step,
                     "ttft_mean_s": sum(r.ttft_s) / len(r.ttft_s), "ttft_s": " ".join(f"{t:.1f}" for t in r.ttft_s),
                     "ttft_steps": " ".join(str(s - a_) for s, a_ in zip(r.first_token_step, r.arrival_step)),
                     "wall_s": r.wall_s, "bad": f"{au.bad}/{au.positions} (limit {limit(floor.bad, au.positions)})" if au else "not audited",
                     "group": r.patches.get(GROUP, "?")})
    cols = [("mode", "mode"), ("run", "run"), ("block", "block"), ("hits", "hit tokens"),
            ("hits_under_load", "hits joining decodes"), ("computed", "prompt tokens computed"), ("steps", "steps"),
            ("max_req_step", "most requests in a step"), ("ttft_mean_s", "mean TTFT s"), ("ttft_s", "TTFT s per request"),
            ("ttft_steps", "TTFT steps per request"), ("wall_s", "wall s"), ("bad", "bad positions (fp32 audit)"),
            ("group", GROUP)]
    body = (f"Prompts {list(LENGTHS)} tokens ({sum(LENGTHS)} in all), arriving before steps {ARRIVALS}; prompts "
            f"{list(share)} share a {a.prefix}-token prefix; {a.max_tokens} generated tokens each; step budget "
            f"{a.budget}; vLLM's defaults otherwise (resolved, caching on: "
            f"{next(r for (m, n), r in runs.items() if n == 'caching on, plugin').settings}).\n\n"
            + markdown_table(rows, cols, {"ttft_mean_s": ".1f", "wall_s": ".0f"}))
    print(write_result(a.out, "Prefix-cache hits under mixed load, mamba 'align' mode (CPU engine)", run_header(), body,
                       rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
