"""Tokens/s of vLLM (CPU engine) on a tiny kit model, with and without speculative decoding.

Not a test: it times, it does not judge. Each config gets its own LLM in one process (see
vllm_platform_ext.testing.engine), one untimed warm-up generate() and one timed one.

    vllm-platform-ext bench --kind qwen3_next \
        --modes base,ngram:2,ngram:4,mtp:1,mtp:2 --num-prompts 8 --max-tokens 64

Output: one row per config: generated tokens, seconds, tokens/s, speed-up over base,
draft acceptance and mean accepted tokens per draft. On a random tiny model acceptance is
low (drafts are right ~1 time in 8), so speculation mostly costs time here; the numbers show
the overhead of the spec path, not the gain on a real model.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="vllm-platform-ext bench", description=__doc__.splitlines()[0])
    ap.add_argument("--kind", default="qwen3_next")
    ap.add_argument("--model-dir", help="use this checkpoint instead of a fresh kit model")
    ap.add_argument("--modes", default="base,ngram:2,ngram:4,mtp:1,mtp:2")
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--max-num-batched-tokens", type=int, default=256)
    ap.add_argument("--json", help="write the rows here too")
    a = ap.parse_args(argv)

    from vllm_platform_ext.testing.engine import EngineSettings, apply_engine_env, run_many
    from vllm_platform_ext.verify.runner import parse_modes
    from vllm_platform_ext.testing.tiny_models import hot_token_ids, make_tiny_model

    apply_engine_env()
    r = random.Random(0)
    h = hot_token_ids()
    prompts = [[r.choice(h) for _ in range(a.prompt_len)] for _ in range(a.num_prompts)]
    settings = EngineSettings(max_tokens=a.max_tokens, logprobs=0, max_num_seqs=max(a.num_prompts, 1),
                              max_num_batched_tokens=max(a.max_num_batched_tokens, a.num_prompts),
                              max_model_len=a.prompt_len + a.max_tokens + 16, warmup_runs=1)
    with tempfile.TemporaryDirectory() as tmp:
        model = a.model_dir or str(make_tiny_model(a.kind, Path(tmp) / a.kind))
        runs = run_many(model, prompts, parse_modes(a.modes), settings,
                        log=lambda s: print(s, file=sys.stderr, flush=True))
    base = next((x.tokens_per_s for x in runs if x.mode == "base" and not x.error), 0.0)
    print(f"{'config':<10} {'tokens':>7} {'gen s':>7} {'tok/s':>8} {'vs base':>8} "
          f"{'accept':>7} {'acc/draft':>9}")
    for x in runs:
        if x.error:
            print(f"{x.label:<10} ERROR {x.error.splitlines()[0]}")
            continue
        per_draft = x.num_accepted_tokens / x.num_drafts if x.num_drafts else 0.0
        speed = f"{x.tokens_per_s / base:7.2f}x" if base else "      -"
        print(f"{x.label:<10} {x.num_generated:>7} {x.generate_s:>7.2f} {x.tokens_per_s:>8.1f} "
              f"{speed:>8} {x.acceptance:>7.2f} {per_draft:>9.2f}")
    if a.json:
        Path(a.json).write_text(json.dumps([{k: v for k, v in asdict(x).items() if k != "tokens"}
                                            for x in runs], indent=1))
    return 0 if all(not x.error for x in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
