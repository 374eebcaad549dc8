"""``vllm-platform-ext verify --model PATH [vLLM engine arguments]``: the user's own checkpoint, with the user's
engine settings, greedy with and without speculation (issue 54, part 1).

The engine arguments are vLLM's own: parsed by its ``FlexibleArgumentParser`` with ``EngineArgs.add_cli_args``,
as ``vllm serve`` parses them (``--speculative-config JSON``, ``--kv-cache-dtype``, ``--quantization``,
``--enforce-eager``, ``-cc``/``--compilation-config``, ``--max-model-len``, ... and every other engine argument
this vLLM line has); whatever differs from vLLM's defaults goes to both engines, ``--speculative-config`` to the
speculative one only. Without one, MTP k=3 where the checkpoint carries MTP weights, else ngram k=3.
verify sets only what it needs: vLLM's stats on (the spec-decode counters), ``max_model_len`` to what the
prompts need where not given (a model's own can be 256k tokens), ``language_model_only`` for a multimodal
checkpoint without vision weights (the kit's), and on the CPU engine a 1 GiB KV cache where
``VLLM_CPU_KVCACHE_SPACE`` is unset.

Two engines in turn in this process, plain then speculative: vLLM 0.32 has no switch that turns speculation off
for a request (``SamplingParams`` carries none, ``SpeculativeConfig`` no per-batch disable), so one engine
session cannot give both; a line that gains one could run both in one engine. The plain engine
also generates the prompts in the kit's other batch compositions (``engine.COMPOSITIONS``): its own spread,
the floor a speculative split is judged against. Where the model is small enough (``model_ref.audit_gate``),
every run is audited against float32 transformers in a separate process (``audit.reference_audits``), a
quantized checkpoint through its dequantized float32 twin. The verdict: ``model_judge``. Exit 0 on PASS and
WARN, 1 on FAIL, 2 on bad input.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

from vllm_platform_ext.verify import model_judge, model_ref
from vllm_platform_ext.verify.model_ref import ModelCheckError

TOP_LOGPROBS = 20  # audit.DRIFT_TOPK: the engine's top log-probabilities kept per position
DEFAULT_MAX_TOKENS = 32


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="vllm-platform-ext verify --model PATH", allow_abbrev=False,
        description="Your checkpoint, with your vLLM engine arguments: greedy with and without speculation, the "
                    "first position where they part, acceptance length, tokens/s, a float32 audit where the model "
                    "is small; PASS / WARN / FAIL.",
        epilog="Every other argument is vLLM's engine argument, as `vllm serve` takes it (e.g. --speculative-config "
               "'{\"method\": \"mtp\", \"num_speculative_tokens\": 3}' --kv-cache-dtype fp8 --enforce-eager).")
    ap.add_argument("--model", required=True, help="a local checkpoint folder (config.json, *.safetensors)")
    ap.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS, help="tokens generated per prompt "
                                                                                f"(default {DEFAULT_MAX_TOKENS})")
    ap.add_argument("--audit", choices=("auto", "on", "off"), default="auto",
                    help="the float32 transformers audit: auto (default: where the model is at most "
                         f"{model_ref.AUDIT_MAX_PARAMS / 1e9:g}B parameters and fits a quarter of free memory), "
                         "on, off")
    ap.add_argument("--json", help="write the whole record (runs, tokens, counters, verdict) to this file")
    ap.add_argument("--work-dir", help="where a quantized checkpoint's float32 twin is written (default: a temp dir)")
    return ap


def _vllm_parser():
    from vllm.engine.arg_utils import EngineArgs

    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:  # older lines
        from vllm.utils import FlexibleArgumentParser
    p = FlexibleArgumentParser(prog="vllm-platform-ext verify --model PATH (vLLM engine arguments)")
    EngineArgs.add_cli_args(p)
    return p, EngineArgs


def engine_kwargs(path: str, engine_argv: list[str]) -> dict:
    """The ``LLM(...)`` arguments of ``engine_argv`` that differ from vLLM's defaults (``model`` always), as
    this vLLM's own parser reads them; a bad argument exits 2 with vLLM's parser's message."""
    from dataclasses import fields

    p, ea_cls = _vllm_parser()
    given = ea_cls.from_cli_args(p.parse_args([*engine_argv, "--model", path]))
    default = ea_cls.from_cli_args(p.parse_args(["--model", path]))
    kw = {f.name: getattr(given, f.name) for f in fields(ea_cls) if getattr(given, f.name) != getattr(default, f.name)}
    kw["model"] = path
    return kw


def _run_engine(kw: dict, prompts: list, max_tokens: int, compositions: tuple = ()) -> dict:
    """One engine: a short warm-up, the timed greedy batch (tokens, top log-probabilities, spec counters), then
    ``compositions``; the exception's message in ``error`` where it raised."""
    from vllm_platform_ext.testing import wna16_fallback
    from vllm_platform_ext.testing.engine import (_guard_vllm_kernel_rescan, _shutdown, _top_logprobs, engine_path,
                                                 plugin_patch_status, timed_generate)

    out = {"tokens": [], "logprobs": [], "error": "", "init_s": 0.0, "generate_s": 0.0, "tokens_per_s": 0.0,
           "num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0, "accepted_per_pos": [],
           "compositions": {}, "engine_path": {}, "patches": {}}
    try:
        from vllm import LLM, SamplingParams

        _guard_vllm_kernel_rescan()
        wna16_fallback.maybe_install()
        t0 = time.perf_counter()
        llm = LLM(**kw)
        out["init_s"] = round(time.perf_counter() - t0, 2)
        try:
            sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, detokenize=False,
                                logprobs=TOP_LOGPROBS)
            # warm-up, not timed (the counters are read around the timed batch): the first steps of a process
            # pay one-time costs (kernel selection, allocations) that would fall on the first engine alone. On a
            # GPU the whole timed batch: after a 4-token warm-up the speculative engine's timed batch ran 157 ms a
            # step against plain decoding's 14 (vLLM 0.26.0, H100, 2026-12-07; first-time costs of its shapes, likely)
            import torch

            llm.generate([{"prompt_token_ids": list(p)} for p in prompts], SamplingParams(
                max_tokens=max_tokens if torch.cuda.is_available() else 4, temperature=0.0, ignore_eos=True,
                detokenize=False), use_tqdm=False)
            outs, gen_s, counters = timed_generate(llm, prompts, sp)
            out["compositions"], out["composition_logprobs"] = _compositions(llm, prompts, sp, compositions)
            out["engine_path"] = engine_path(llm)
        finally:
            _shutdown(llm)
        out["tokens"] = [list(o.outputs[0].token_ids) for o in outs]
        out["logprobs"] = [_top_logprobs(o.outputs[0]) for o in outs]
        n = sum(len(t) for t in out["tokens"])
        out.update(counters, generate_s=round(gen_s, 3), tokens_per_s=round(n / gen_s, 2) if gen_s else 0.0)
    except Exception as exc:  # the verdict names it
        out["error"] = f"{type(exc).__name__}: {exc}".strip()
    out["patches"] = plugin_patch_status()
    return out


def _compositions(llm, prompts: list, sp, names) -> tuple[dict, dict]:
    """``engine.composition_outputs`` as ``({name: tokens per prompt}, {name: top log-probabilities per prompt})``."""
    from vllm_platform_ext.testing.engine import _top_logprobs, composition_outputs

    outs = composition_outputs(llm, prompts, sp, names)
    return ({n: [None if o is None else list(o.token_ids) for o in v] for n, v in outs.items()},
            {n: [None if o is None else _top_logprobs(o) for o in v] for n, v in outs.items()})


def _act_quant(cfg: dict) -> bool:
    """The engine quantizes activations, which the float32 reference does not: its drift is shown, not judged
    (compressed-tensors with input activations; GPTQ on vllm-cpu's W4A8 default, AMX hosts)."""
    qc = cfg.get("quantization_config") or {}
    method = model_ref.quant_method(cfg)
    if method == "compressed-tensors":
        return any((g or {}).get("input_activations") for g in (qc.get("config_groups") or {}).values())
    if "fp8" in method:
        return True
    if method in ("gptq", "auto-round", "intel/auto-round"):
        from vllm_platform_ext.testing.wna16_fallback import W4A8_ENV

        return accelerator() == "cpu" and os.environ.get(W4A8_ENV, "1") != "0"
    return False


def accelerator() -> str:
    from vllm.platforms import current_platform

    return "cpu" if current_platform.is_cpu() else str(current_platform.device_name or "gpu")


def _describe_engine(run: dict) -> str:
    import vllm

    path = run.get("engine_path") or {}
    if not path:
        return f"vLLM {vllm.__version__}; no engine started (see the reasons)"
    where = (f"CPU (vllm-cpu path {path.get('cpu_path')})" if path.get("cpu_path") else
             f"{path.get('platform', '?')} {path.get('device', '')}".strip())
    return f"vLLM {vllm.__version__} on {where}; SSM cache {path.get('ssm_cache_dtype', '?')}"


def _audit(path: str, cfg: dict, tensors: dict, mode: str, work: Path, prompts: list, max_tokens: int,
           plain: dict, spec: dict) -> tuple[dict | None, str]:
    """``(audit or None, one line saying what ran or why not)``."""
    from vllm_platform_ext.testing.audit import AuditResult, reference_audits, reference_device

    why = model_ref.audit_gate(cfg, tensors, mode)
    if why:
        return None, f"float32 transformers audit not run: {why}"
    if plain["error"] or spec["error"]:
        return None, "float32 transformers audit not run: an engine raised"
    try:
        ref = model_ref.reference_dir(path, cfg, work)
        problem = model_ref.loading_problem(ref)
        if problem:
            return None, f"float32 transformers audit not run: {problem}"
        # a composition whose tokens are plain decoding's has plain's audit: not run again
        same = [k for k, v in plain["compositions"].items() if v == plain["tokens"]]
        gen = {"plain": plain["tokens"], "spec": spec["tokens"],
               **{f"c:{k}": v for k, v in plain["compositions"].items() if k not in same}}
        floor, audits = reference_audits(str(ref), prompts, gen, max_tokens,
                                         logprobs={"plain": plain["logprobs"], "spec": spec["logprobs"]})
        audits.update({f"c:{k}": AuditResult(audits["plain"].regrets) for k in same})
    except Exception as exc:
        return None, f"float32 transformers audit failed: {type(exc).__name__}: {str(exc)[-500:]}"
    twin = "" if str(ref) == str(path) else " (its dequantized float32 twin)"
    return ({"floor": floor, "audits": audits},
            f"float32 transformers on {reference_device()}{twin}, {floor.positions} positions a run; floor = "
            "transformers bf16 greedy")


def given_spec(engine_argv: list[str]):
    """``--speculative-config``'s JSON where it is given whole (``--speculative-config JSON`` or ``=JSON``), read
    before vLLM is imported so a checkpoint that cannot run it is refused at once; None otherwise (vLLM's parser
    reads it, dotted forms included)."""
    for i, a in enumerate(engine_argv):
        for flag in ("--speculative-config", "--speculative_config"):
            text = a[len(flag) + 1:] if a.startswith(flag + "=") else (
                engine_argv[i + 1] if a == flag and i + 1 < len(engine_argv) else None)
            if text is not None:
                try:
                    return json.loads(text)
                except ValueError:
                    return None
    return None


def run(args: argparse.Namespace, engine_argv: list[str]) -> dict:
    """The whole check: the record ``format_report`` prints and ``--json`` writes. Raises ModelCheckError."""
    if args.max_tokens < 1:
        raise ModelCheckError(f"--max-tokens {args.max_tokens}: give at least 1")
    cfg, tensors = model_ref.read(args.model)
    path = str(Path(args.model).resolve())
    early = given_spec(engine_argv)
    if early is not None:
        model_ref.check_spec(early, cfg, tensors, args.model)
    prompts, prompts_text = model_ref.prompts(path, cfg)
    from vllm_platform_ext.testing.engine import COMPOSITIONS, apply_engine_env, model_engine_kwargs

    apply_engine_env()  # offline, in-process engine core, the CPU engine's 1 GiB KV where unset
    kw = engine_kwargs(path, engine_argv)
    spec_cfg = kw.pop("speculative_config", None)
    source = "given"
    if spec_cfg is None:
        spec_cfg, source = model_ref.default_spec(tensors), "default: none given"
    model_ref.check_spec(spec_cfg, cfg, tensors, args.model)
    settings = sorted(f"{k}={v}" for k, v in kw.items() if k != "model")
    kw["disable_log_stats"] = False  # the spec-decode counters
    if "max_model_len" not in kw:
        need = max(len(p) for p in prompts) + args.max_tokens + int(spec_cfg.get("num_speculative_tokens", 0)) + 8
        kw["max_model_len"] = max(256, -(-need // 128) * 128)
        settings.append(f"max_model_len={kw['max_model_len']} (verify's: what the prompts need)")
    if not any(n.startswith(("visual.", "model.visual.")) for n in tensors):
        kw.update(model_engine_kwargs(path))  # the kit's multimodal form: no vision weights
    phases, t0 = {}, time.perf_counter()
    plain = _run_engine(kw, prompts, args.max_tokens, tuple(COMPOSITIONS))
    phases["plain engine"], t0 = round(time.perf_counter() - t0, 1), time.perf_counter()
    spec = _run_engine({**kw, "speculative_config": spec_cfg}, prompts, args.max_tokens)
    phases["speculative engine"], t0 = round(time.perf_counter() - t0, 1), time.perf_counter()
    work, made = model_ref.work_dir(args.work_dir)
    try:
        audit, audit_text = _audit(path, cfg, tensors, args.audit, work, prompts, args.max_tokens, plain, spec)
    finally:
        if made:
            shutil.rmtree(work, ignore_errors=True)
    phases["audit"] = round(time.perf_counter() - t0, 1)
    kv = str(kw.get("kv_cache_dtype") or "auto")
    verdict = model_judge.judge(plain, spec, spec_cfg, kv, audit, _act_quant(cfg))
    if audit is None and "failed" in audit_text:
        verdict["reasons"].append(f"note: {audit_text}")
    on_cpu = accelerator() == "cpu"
    return {"model": args.model, "checkpoint": model_ref.describe(cfg, tensors),
            "engine": _describe_engine(plain if plain.get("engine_path") else spec),
            "settings_text": ", ".join(settings) or "vLLM's defaults",
            "engine_kwargs": {k: repr(v) for k, v in kw.items()},
            "speculative": spec_cfg, "speculative_text": f"{json.dumps(spec_cfg)} ({source})",
            "prompts_text": prompts_text, "prompts": prompts, "max_tokens": args.max_tokens,
            "audit_text": audit_text, "seconds": phases, "plain": plain, "spec": spec, "verdict": verdict,
            "not_run": ("the CUDA/MACA engine and graph modes (this host's engine is the CPU one)" if on_cpu else "")}


def main(argv: list[str]) -> int:
    ap = build_parser()
    if any(a in ("-h", "--help") for a in argv):
        ap.print_help()
        return 0
    args, engine_argv = ap.parse_known_args(argv)
    model_ref.env_kv_space()
    try:
        rep = run(args, engine_argv)
    except ModelCheckError as exc:
        print(f"verify: {exc}", file=sys.stderr)
        return 2
    print(model_judge.format_report(rep))
    if args.json:
        Path(args.json).write_text(json.dumps(rep, indent=1, default=str))
    return 1 if rep["verdict"]["status"] == "FAIL" else 0


def wants(argv: list[str]) -> bool:
    """``verify`` arguments that name ``--model`` (not the kit's ``--model-dir``)."""
    return any(a == "--model" or a.startswith("--model=") for a in argv)
