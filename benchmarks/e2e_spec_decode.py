"""End-to-end speed in the real vLLM engine (issue 24): step times, tokens/s and KV capacity for
bf16 KV vs TurboQuant KV, with and without MTP, with and without the plugin.

Configurations (each an engine started in its own process, plugin on unless named):

  A  bf16 KV, no speculation (the plain baseline)
  B  bf16 KV + MTP k=3                      (B-off: the same without the plugin, the GDN cost)
  C  TurboQuant k8v4 + MTP k=3, FULL_AND_PIECEWISE graphs
  D  upstream's best TurboQuant + MTP k=3 without the plugin: FULL_AND_PIECEWISE, then
     PIECEWISE, then eager -- the first that starts and generates
  E  C with turboquant_4bit_nc and turboquant_3bit_nc

Models: ``qwen36_a3b`` -- Qwen3.6-35B-A3B's shape, transformers' ``Qwen3_5MoeTextConfig``
defaults (hidden 2048, Gated DeltaNet : gated attention 3:1, attention 16/2 heads of 256,
linear 16/32 heads of 128, 256 experts of 512 with 8 routed + 1 shared of 512, vocab 248320,
one MTP layer), ``--layers`` cut to a multiple of 4 (40 is the full depth), dummy weights
(``load_format=dummy``, no tokenizer). ``tiny`` -- the audited kit model (``--dims gpu``) with
real acceptance.

Timing: every engine step is timed on the host around ``EngineCore.step`` (async scheduling
off, so one step is one forward and its sampling) and classed from its ``SchedulerOutput``:
*verify* (every request runs 1 + its drafts, some drafts), *plain* (every request one token) or
*mixed* (prefill in it; not reported). Medians per class. Dummy weights accept next to nothing,
so tokens/s is derived for stated mean tokens per verify step (1.0, 2.0, 2.5, 3.0, 4.0 for k=3):
``batch x tokens_per_step / median verify step``; the tiny model's measured tokens/s stands beside
it. KV capacity is what vLLM allocated at the same ``gpu_memory_utilization``: blocks x block size.

    python benchmarks/e2e_spec_decode.py --model qwen36_a3b --layers 8 --out DIR     # GPU machine
    python benchmarks/e2e_spec_decode.py --model tiny --out DIR
    python benchmarks/e2e_spec_decode.py --model tiny --configs A,B,B-off --graphs eager \\
        --kv-presets auto --batches 2 --contexts 64 --max-tokens 16 --out DIR        # CPU smoke
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
from bench_common import header_markdown, run_header, write_result  # noqa: E402

TOKENS_PER_VERIFY_STEP = (1.0, 2.0, 2.5, 3.0, 4.0)


@dataclass(frozen=True)
class Setup:
    name: str
    mode: str = "base"
    k: int = 0
    kv: str = "auto"
    graphs: str = "full_and_piecewise"
    plugin: bool = True


def setups(names: list[str], graphs: str) -> list[list[Setup]]:
    """Each entry: the setups to try in order (the first that runs counts; D tries three)."""
    g = graphs
    table = {
        "A": [Setup("A", graphs=g)],
        "B": [Setup("B", "mtp", 3, graphs=g)],
        "B-off": [Setup("B-off", "mtp", 3, graphs=g, plugin=False)],
        "C": [Setup("C", "mtp", 3, "turboquant_k8v4", g)],
        "D": [Setup("D", "mtp", 3, "turboquant_k8v4", mode_g, plugin=False)
              for mode_g in dict.fromkeys((g, "piecewise", "eager"))],
        "E": [Setup("E-4bit_nc", "mtp", 3, "turboquant_4bit_nc", g)],
        "E3": [Setup("E-3bit_nc", "mtp", 3, "turboquant_3bit_nc", g)],
    }
    out = []
    for n in names:
        if n not in table:
            raise SystemExit(f"unknown configuration {n!r}; choose from {sorted(table)}")
        out.append(table[n])
        if n == "E":
            out.append(table["E3"])
    return out


def qwen36_a3b_config(layers: int) -> dict:
    from transformers import AutoConfig

    if layers % 4 or layers < 4:
        raise SystemExit(f"--layers {layers}: must be a positive multiple of 4 (3 GDN : 1 attention)")
    cfg = AutoConfig.for_model("qwen3_5_moe_text").to_dict()
    cfg.update(num_hidden_layers=layers, layer_types=(["linear_attention"] * 3 + ["full_attention"]) * (layers // 4),
               architectures=["Qwen3_5MoeForCausalLM"], mtp_num_hidden_layers=1, dtype="bfloat16",
               torch_dtype="bfloat16", bos_token_id=1, eos_token_id=2, max_position_embeddings=40960)
    cfg.pop("transformers_version", None)
    return cfg


def write_model(kind: str, layers: int, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    if kind == "tiny":
        from vllm_platform_ext.verify.tiny_models import make_tiny_model

        return make_tiny_model("qwen3_next", out, dims="gpu")
    (out / "config.json").write_text(json.dumps(qwen36_a3b_config(layers), indent=1))
    return out


# ------------------------------------------------------------------- the engine process

@dataclass
class StepLog:
    verify: list = field(default_factory=list)
    plain: list = field(default_factory=list)
    mixed: int = 0


def install_step_timer(log: StepLog) -> None:
    """Time ``EngineCore.step`` and class each step by the scheduler output it ran."""
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.engine.core import EngineCore

    last = {}
    schedule, step = Scheduler.schedule, EngineCore.step

    def timed_schedule(self, *a, **kw):
        out = schedule(self, *a, **kw)
        last["out"] = out
        return out

    def timed_step(self, *a, **kw):
        last.pop("out", None)
        t0 = time.perf_counter()
        res = step(self, *a, **kw)
        dt = time.perf_counter() - t0
        so = last.get("out")
        if so is not None and so.num_scheduled_tokens:
            spec = so.scheduled_spec_decode_tokens or {}
            lens = so.num_scheduled_tokens
            decode = not so.scheduled_new_reqs and all(n == 1 + len(spec.get(r, ())) for r, n in lens.items())
            if decode and any(spec.values()):
                log.verify.append(dt)
            elif decode:
                log.plain.append(dt)
            else:
                log.mixed += 1
        return res

    Scheduler.schedule, EngineCore.step = timed_schedule, timed_step


def worker(job_path: str, out_path: str) -> int:
    job = json.loads(Path(job_path).read_text())
    from vllm_platform_ext.verify.engine import EngineConfig, EngineSettings, apply_engine_env, run_engine

    apply_engine_env()
    log = StepLog()
    install_step_timer(log)
    s = job["setup"]
    cfg = EngineConfig(s["mode"], s["k"], kv_cache_dtype=s["kv"], graphs=s["graphs"])
    settings = EngineSettings(max_tokens=job["max_tokens"], max_num_seqs=max(job["batch"], 1),
                              max_num_batched_tokens=job["max_num_batched_tokens"],
                              max_model_len=job["context"] + job["max_tokens"] + 8,
                              gpu_memory_utilization=job["gpu_memory_utilization"], warmup_runs=1)
    extra = {"async_scheduling": False}
    if job["dummy"]:
        extra.update(load_format="dummy", skip_tokenizer_init=True)
    r = random.Random(0)
    prompts = [[r.randrange(4, job["vocab"]) for _ in range(job["context"])] for _ in range(job["batch"])]
    run = run_engine(job["model"], prompts, cfg, settings, llm_kwargs=extra)
    Path(out_path).write_text(json.dumps({"run": asdict(run) | {"tokens": []}, "steps": asdict(log)}))
    return 0


# ------------------------------------------------------------------- the driver

def run_setup(model: Path, setup: Setup, batch: int, context: int, a, timeout: float = 3600) -> dict:
    job = {"model": str(model), "setup": asdict(setup), "batch": batch, "context": context,
           "max_tokens": a.max_tokens, "max_num_batched_tokens": a.max_num_batched_tokens,
           "gpu_memory_utilization": a.gpu_memory_utilization, "dummy": a.model != "tiny",
           "vocab": 256 if a.model == "tiny" else 248320}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    if not setup.plugin:
        env["VLLM_PLUGINS"] = ""
    with tempfile.TemporaryDirectory() as tmp:
        jp, op = Path(tmp, "job.json"), Path(tmp, "out.json")
        jp.write_text(json.dumps(job))
        proc = subprocess.run([sys.executable, __file__, "--worker", str(jp), str(op)], env=env,
                              capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            tail = (proc.stdout + proc.stderr).strip().splitlines()[-3:]
            return {"error": " | ".join(tail)[-500:]}
        return json.loads(op.read_text())


def summarize(setup: Setup, batch: int, context: int, res: dict) -> dict:
    row = {"config": setup.name, "kv": setup.kv, "graphs": setup.graphs, "plugin": setup.plugin,
           "batch": batch, "context": context}
    if "error" in res:
        return row | {"error": res["error"]}
    run, steps = res["run"], res["steps"]
    med = lambda xs: statistics.median(xs) if xs else None  # noqa: E731
    row |= {"verify_ms": med(steps["verify"]) and 1e3 * med(steps["verify"]),
            "plain_ms": med(steps["plain"]) and 1e3 * med(steps["plain"]),
            "verify_steps": len(steps["verify"]), "plain_steps": len(steps["plain"]), "mixed_steps": steps["mixed"],
            "measured_tok_s": run["num_generated"] / run["generate_s"] if run["generate_s"] else None,
            "acceptance": run["num_accepted_tokens"] / run["num_draft_tokens"] if run["num_draft_tokens"] else None,
            "kv_capacity_tokens": run["engine_path"].get("kv_capacity_tokens"),
            "device": run["engine_path"].get("device") or run["engine_path"].get("cpu_path")}
    if row["verify_ms"]:
        row["derived_tok_s"] = {str(t): batch * t / (row["verify_ms"] / 1e3) for t in TOKENS_PER_VERIFY_STEP}
    elif row["plain_ms"]:
        row["derived_tok_s"] = {"1.0": batch / (row["plain_ms"] / 1e3)}
    return row


def markdown(rows: list[dict], header: str) -> str:
    lines = [header, "", "| config | KV | graphs | plugin | batch | context | verify step ms | plain step ms | "
             "tok/s at 1/2/2.5/3/4 per step | measured tok/s | acceptance | KV tokens |", "|" + "---|" * 12]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['config']} | {r['kv']} | {r['graphs']} | {r['plugin']} | {r['batch']} | "
                         f"{r['context']} | error: {r['error'][:160]} | | | | | |")
            continue
        f = lambda v, p=2: "—" if v is None else f"{v:.{p}f}"  # noqa: E731
        d = r.get("derived_tok_s", {})
        lines.append(f"| {r['config']} | {r['kv']} | {r['graphs']} | {r['plugin']} | {r['batch']} | {r['context']} | "
                     f"{f(r['verify_ms'])} | {f(r['plain_ms'])} | {' / '.join(f(v, 0) for v in d.values()) or '—'} | "
                     f"{f(r['measured_tok_s'], 0)} | {f(r['acceptance'])} | {r['kv_capacity_tokens'] or '—'} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", nargs=2, metavar=("JOB", "OUT"), help=argparse.SUPPRESS)
    ap.add_argument("--model", choices=("qwen36_a3b", "tiny"), default="qwen36_a3b")
    ap.add_argument("--layers", type=int, default=8, help="qwen36_a3b depth, a multiple of 4 (full: 40)")
    ap.add_argument("--configs", default="A,B,B-off,C,D,E")
    ap.add_argument("--graphs", default="full_and_piecewise")
    ap.add_argument("--kv-presets", default=None, help="restrict to these KV dtypes (e.g. auto on the CPU)")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--contexts", default="4096,32768")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--max-num-batched-tokens", type=int, default=8192)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    ap.add_argument("--out", default="e2e-results")
    a = ap.parse_args(argv)
    if a.worker:
        return worker(*a.worker)
    kv_only = set(a.kv_presets.split(",")) if a.kv_presets else None
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="vpe-e2e-") as tmp:
        model = write_model(a.model, a.layers, Path(tmp) / a.model)
        for batch in map(int, a.batches.split(",")):
            for context in map(int, a.contexts.split(",")):
                for tries in setups(a.configs.split(","), a.graphs):
                    tries = [s for s in tries if kv_only is None or s.kv in kv_only]
                    for s in tries:  # D: the first upstream mode that runs
                        row = summarize(s, batch, context, run_setup(model, s, batch, context, a))
                        print(json.dumps(row), flush=True)
                        if "error" not in row or s is tries[-1]:
                            rows.append(row)
                            break
    title = f"End-to-end speculative decoding, model {a.model}" + (
        f" ({a.layers} layers, dummy weights)" if a.model != "tiny" else "")
    head = run_header(device=next((r["device"] for r in rows if r.get("device")), None) or "?")
    body = markdown(rows, "").lstrip("\n")
    write_result(out / "e2e.md", title, head, body, rows)
    print(f"# {title}\n\n{header_markdown(head)}\n\n{body}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
