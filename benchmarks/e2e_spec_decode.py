"""End-to-end speed in the real vLLM engine (issue 24): step times, tokens/s and KV capacity for
bf16 KV vs TurboQuant KV, with and without MTP, with and without the plugin.

Configurations (each an engine started in its own process, plugin on unless named):

  A  bf16 KV, no speculation (the plain baseline)
  B  bf16 KV + MTP k=3                      (B-off: the same without the plugin, the GDN cost)
  C  TurboQuant k8v4 + MTP k=3, FULL_AND_PIECEWISE graphs
  C0 TurboQuant k8v4 without speculation, plugin on (plain decode against A; issue 53's 55K point)
  D  upstream's best TurboQuant + MTP k=3 without the plugin: FULL_AND_PIECEWISE, then
     PIECEWISE, then eager -- the first that starts and generates; if none does, TurboQuant
     without speculation
  D0 D straight to TurboQuant without speculation (lines where upstream's TurboQuant + MTP cannot
     start, 0.24+): no failed start-ups first
  R  C with vLLM PR #40914's routing of the verify: vLLM's single-token decode kernel on B x (K+1)
     synthetic rows instead of the plugin's K+1 kernel (VLLM_PLATFORM_EXT_TQ_VERIFY_ROUTE=upstream_rows)
  E  C with turboquant_4bit_nc and turboquant_3bit_nc

Models: ``qwen36_27b`` -- Qwen3.6-27B's shape (dense: hidden 5120, attention 24/4 heads of 256, GQA 6;
GDN 16/48 heads of 128; MLP 17408; 64 layers in the release), ``--layers`` cut as below.
``qwen36_a3b`` -- Qwen3.6-35B-A3B's shape, ``Qwen3_5MoeTextConfig``'s defaults (transformers' or
vLLM's own) (hidden 2048, Gated DeltaNet : gated attention 3:1, attention 16/2 heads of 256,
linear 16/32 heads of 128, 256 experts of 512 with 8 routed + 1 shared of 512, vocab 248320,
one MTP layer), ``--layers`` cut to a multiple of 4 (40 is the full depth), dummy weights
(``load_format=dummy``, no tokenizer). ``tiny`` -- the audited kit model (``--dims gpu``) with
real acceptance.

Scheduling: ``--scheduling default`` (the default, also for a job that names none) runs each engine as
the line resolves async scheduling (``async_scheduling`` left unset; the run header records the mode
asked and async as vLLM resolved it) -- on for MTP from vLLM 0.23, what users run; ``sync`` turns it off; ``both`` runs every
configuration in each mode and writes the two side by side (``e2e-scheduling.md``; each mode's
report in its own folder). Every row records the mode asked and async scheduling as vLLM resolved
it (the CPU platform always turns it off). Figures before 2026-12-06 were all measured ``sync``.

Timing: with async scheduling off every engine step is timed on the host around ``EngineCore.step``
(one step is one forward and its sampling); with it on, a step is the period between two batches'
results (``step_with_batch_queue`` overlaps the next batch's scheduling with this one's run). Each
step is classed from the ``SchedulerOutput`` whose results it applied:
*verify* (every request runs 1 + its drafts, some drafts), *plain* (every request one token) or
*mixed* (prefill in it; not reported). Medians per class. Dummy weights accept next to nothing,
so tokens/s is derived for stated mean tokens per verify step (1.0, 2.0, 2.5, 3.0, 4.0 for k=3):
``batch x tokens_per_step / median verify step``; the tiny model's measured tokens/s stands beside
it. KV capacity is what vLLM allocated at the same ``gpu_memory_utilization``: blocks x block size.

    python benchmarks/e2e_spec_decode.py --model qwen36_a3b --layers 8 --out DIR     # GPU machine
    python benchmarks/e2e_spec_decode.py --model tiny --out DIR
    python benchmarks/e2e_spec_decode.py --model tiny --configs A,B,B-off --graphs eager \\
        --kv-presets auto --batches 2 --contexts 64 --max-tokens 16 --out DIR        # CPU smoke
    python benchmarks/e2e_spec_decode.py --replot DIR/e2e.json --out DIR2   # md + plot again (matplotlib)

``--profile`` also writes, per run, a torch.profiler trace (``.trace.json``, for Perfetto / chrome
tracing) and an op table (``.ops.txt``) of one verify step (plain step without speculation):
where a goal is missed, this shows what holds it.

Output: ``e2e.md`` (run header, the table, issue 24's goals judged on this run's rows: C vs D
tokens/s, C / B verify step, KV capacity ratios, the GDN fix's cost), ``e2e.json`` (the same) and
``e2e.png`` (tokens/s per configuration and batch, per context) where matplotlib is installed.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
from bench_common import header_markdown, run_header, write_result  # noqa: E402
# the tables and goals, and what runs in the engine process: also read as E.<name> (e2e_paired.py, the tests)
from e2e_report import (  # noqa: E402,F401
    TOKENS_PER_VERIFY_STEP, goals, goals53, goals_markdown, main_cpu, merge_rounds, report, resolved_async,
    rounds_markdown, scheduling_markdown, summarize)
from e2e_setups import Setup, setups  # noqa: E402 (the configurations; also read as E.Setup, E.setups)
from e2e_worker import (  # noqa: E402,F401
    SCHEDULING, StepLog, _prompts, _step_class, engine_setup, gpu_local_cpus, install_step_timer, worker)


# Qwen3.6-27B (dense, GQA 6) as its released text config states it (model type qwen3_5_text; 64 layers
# in the release, 3 GDN : 1 gated attention; the values also in THUDM/slime scripts/models/qwen3.5-27B.sh)
QWEN36_27B_TEXT = dict(hidden_size=5120, intermediate_size=17408, num_attention_heads=24, num_key_value_heads=4,
                       head_dim=256, linear_num_key_heads=16, linear_num_value_heads=48, linear_key_head_dim=128,
                       linear_value_head_dim=128, linear_conv_kernel_dim=4, vocab_size=248320,
                       rope_parameters={"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25,
                                        "mrope_interleaved": True, "mrope_section": [11, 11, 10]})
MODELS = ("qwen36_a3b", "qwen36_27b", "tiny")


def _hybrid_config(kind: str, layers: int, shape: dict) -> dict:
    """A Qwen3.5/3.6 ``config.json`` (``kind``: qwen3_5_moe / qwen3_5) cut to ``layers``: the text
    config at its class's defaults (transformers' where it has the class, else vLLM's own: vLLM 0.23
    pins transformers 4.57) updated by ``shape``; vLLM 0.23-0.26 have no text-only class, the engine
    runs it with ``language_model_only=True``."""
    from vllm_platform_ext.testing.tiny_models import _config_class, conditional_config

    if layers % 4 or layers < 4:
        raise SystemExit(f"--layers {layers}: must be a positive multiple of 4 (3 GDN : 1 attention)")
    text = _config_class(f"{kind}_text")().to_dict()
    text.update(shape)
    text.update(model_type=f"{kind}_text", num_hidden_layers=layers,
                layer_types=(["linear_attention"] * 3 + ["full_attention"]) * (layers // 4),
                mtp_num_hidden_layers=1, bos_token_id=1, eos_token_id=2, max_position_embeddings=65536 + 1024)
    text.pop("transformers_version", None)
    return conditional_config(kind, text)


def qwen36_a3b_config(layers: int) -> dict:
    """Qwen3.6-35B-A3B's ``config.json`` cut to ``layers``: ``Qwen3_5MoeForConditionalGeneration``, the
    text config at ``Qwen3_5MoeTextConfig``'s defaults (hidden 2048, attention 16/2 heads of 256)."""
    return _hybrid_config("qwen3_5_moe", layers, {})


def qwen36_27b_config(layers: int) -> dict:
    """Qwen3.6-27B's ``config.json`` cut to ``layers``: ``Qwen3_5ForConditionalGeneration``, dense,
    attention 24/4 heads of 256 (GQA 6), GDN 16/48 heads of 128 (:data:`QWEN36_27B_TEXT`)."""
    return _hybrid_config("qwen3_5", layers, QWEN36_27B_TEXT)


def write_model(kind: str, layers: int, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    if kind == "tiny":
        from vllm_platform_ext.testing.tiny_models import make_tiny_model

        return make_tiny_model("qwen3_next", out, dims="gpu")
    cfg = qwen36_27b_config(layers) if kind == "qwen36_27b" else qwen36_a3b_config(layers)
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    return out


# ------------------------------------------------------------------- the driver

def engine_job(model: Path, setup: Setup, pairs: list[tuple[int, int]], a) -> dict:
    """What an engine process is told (``worker`` / ``engine_setup``): the setup, its pairs, the sizes."""
    return {"model": str(model), "setup": asdict(setup), "pairs": [list(p) for p in pairs], "tp": a.tp,
            "max_tokens": a.max_tokens, "max_num_batched_tokens": a.max_num_batched_tokens,
            "gpu_memory_utilization": a.gpu_memory_utilization, "dummy": a.model != "tiny",
            "kv_cache_memory_bytes": a.kv_cache_memory_bytes,
            "vocab": 256 if a.model == "tiny" else 248320, "scheduling": getattr(a, "mode", "default")}


def engine_env(setup: Setup) -> dict:
    """An engine process's environment: this repository importable, the plugin off where the setup
    says so (``VLLM_PLUGINS=""``), the setup's own variables."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    if not setup.plugin:
        env["VLLM_PLUGINS"] = ""
    env.update(dict(setup.env))
    return env


def run_setup(model: Path, setup: Setup, pairs: list[tuple[int, int]], a, timeout: float | None = None) -> list[dict]:
    """One engine process for ``setup`` over the (batch, context) ``pairs``; one result per pair
    (each ``{"error": ...}`` where the engine failed)."""
    batch, context = pairs[0]
    job = engine_job(model, setup, pairs, a)
    if a.profile:  # one step of the class the setup runs most: verify with speculation, plain without
        job["profile"] = "verify" if setup.mode != "base" else "plain"
        job["profile_to"] = str(Path(a.out).resolve() / f"{setup.name}-{setup.graphs}-b{batch}-c{context}-{job['profile']}")
    env = engine_env(setup)
    with tempfile.TemporaryDirectory() as tmp:
        jp, op = Path(tmp, "job.json"), Path(tmp, "out.json")
        jp.write_text(json.dumps(job))
        from vllm_platform_ext.testing.subproc import run_group

        limit = timeout or a.timeout
        proc = run_group([sys.executable, __file__, "--worker", str(jp), str(op)], env, limit)
        if proc.returncode == "timeout":  # its process group killed: the engine's workers do not hold the GPU on
            return [{"error": f"timed out after {limit:.0f}s (engine process group killed)", "tp": a.tp}] * len(pairs)
        if proc.returncode != 0:
            tail = (proc.stdout + proc.stderr).strip().splitlines()[-3:]
            return [{"error": " | ".join(tail)[-500:], "tp": a.tp}] * len(pairs)
        done = json.loads(op.read_text())
        return [{**r, "tp": a.tp} for r in done["results"]]


def _host_load(rnd: int) -> dict:
    """What the host was doing as a row's engine finished: its 1-minute load average and the CPUs
    this process may use (a row measured beside other engines' start-ups says so)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count()
    return {"round": rnd, "load_1m": round(os.getloadavg()[0], 1), "cpus": cpus}


def run_round(model: Path, order: list[list[Setup]], groups: list, kv_only: set | None, a, out: Path,
              rnd: int) -> list[dict]:
    """One engine per configuration (and per group of pairs), in ``order``; D keeps the first of its
    setups that runs. Each row is printed and appended to rows.jsonl as its engine finishes."""
    rows = []
    for tries in order:
        tries = [s for s in tries if kv_only is None or s.kv in kv_only]
        for group in groups:
            for s in tries:  # D: the first upstream mode that runs
                got = [summarize(s, b, c, res) | _host_load(rnd)
                       for (b, c), res in zip(group, run_setup(model, s, group, a))]
                for row in got:
                    print(json.dumps(row), flush=True)
                    with open(out / "rows.jsonl", "a") as f:  # kept as it goes: a call cut short keeps its rows
                        f.write(json.dumps(row) + "\n")
                if not any("error" in row for row in got) or s is tries[-1]:
                    rows += got
                    break
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", nargs=2, metavar=("JOB", "OUT"), help=argparse.SUPPRESS)
    ap.add_argument("--model", choices=MODELS, default="qwen36_a3b")
    ap.add_argument("--layers", type=int, default=8,
                    help="depth of the dummy-weight shapes, a multiple of 4 (35B-A3B's full depth: 40; 27B's: 64)")
    ap.add_argument("--configs", default="A,B,B-off,C,D,E")
    ap.add_argument("--graphs", default="full_and_piecewise")
    ap.add_argument("--kv-presets", default=None, help="restrict to these KV dtypes (e.g. auto on the CPU)")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--contexts", default="4096,32768")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--max-num-batched-tokens", type=int, default=8192)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    ap.add_argument("--kv-cache-memory-bytes", type=int, default=0,
                    help="the KV cache in bytes (vLLM skips its memory profiling, so the engine can start beside "
                         "other engines on its GPUs); KV capacity then compares tokens per byte, not per GPU")
    ap.add_argument("--tp", type=int, default=1, help="tensor_parallel_size (2: a 2-GPU machine)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run every configuration N times, every other round in reverse order; the table and "
                         "goals take each row's median over the rounds, and every row records the host's load")
    ap.add_argument("--profile", action="store_true",
                    help="also write a torch.profiler trace + op table of one verify (or plain) step per run "
                         "(the profiler stays initialised afterwards: take timings from a run without it)")
    ap.add_argument("--scheduling", choices=("default", "sync", "both"), default="default",
                    help="default: async scheduling as the line resolves it (users' mode); sync: off; both: each "
                         "configuration in each mode, side by side")
    ap.add_argument("--out", default="results/gpu/new-e2e")
    ap.add_argument("--timeout", type=float, default=3600,
                    help="seconds per engine; past it its process group is killed and the row is an error")
    ap.add_argument("--replot", metavar="E2E_JSON", help="re-render e2e.md / e2e.png of a finished run into --out")
    a = ap.parse_args(argv)
    if a.worker:
        return worker(*a.worker)
    if a.replot:
        done = json.loads(Path(a.replot).read_text())
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        title = Path(a.replot).with_suffix(".md").read_text().splitlines()[0].removeprefix("# ")
        body = report(done["data"]["rows"], out, title, done["header"])
        print(f"# {title}\n\n{header_markdown(done['header'])}\n\n{body}")
        return 0
    if a.rounds < 1:
        ap.error(f"--rounds takes a count >= 1; got {a.rounds}")
    kv_only = set(a.kv_presets.split(",")) if a.kv_presets else None
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    modes = ("default", "sync") if a.scheduling == "both" else (a.scheduling,)
    by_mode = {}
    with tempfile.TemporaryDirectory(prefix="vpe-e2e-") as tmp:
        model = write_model(a.model, a.layers, Path(tmp) / a.model)
        pairs = [(b, c) for b in map(int, a.batches.split(",")) for c in map(int, a.contexts.split(","))]
        # one engine per configuration for all (batch, context) pairs (one start-up each); with
        # --profile one per pair, since each profiles its own first step
        groups = [[p] for p in pairs] if a.profile else [pairs]
        order = setups(a.configs.split(","), a.graphs)
        for mode in modes:
            a.mode, rows = mode, []
            for rnd in range(1, a.rounds + 1):  # every other round in reverse order: C,B then B,C
                rows += run_round(model, order if rnd % 2 else order[::-1], groups, kv_only, a, out, rnd)
            by_mode[mode] = rows
    title = f"End-to-end speculative decoding, model {a.model}" + (
        f" ({a.layers} layers, dummy weights)" if a.model != "tiny" else "") + (f", TP={a.tp}" if a.tp > 1 else "")
    every = [r for rows in by_mode.values() for r in rows]
    head = run_header(device=next((r["device"] for r in every if r.get("device")), None) or "?",
                      scheduling=a.scheduling, async_scheduling=resolved_async(every), benchmark="e2e",
                      model=a.model, layers=a.layers if a.model != "tiny" else None)
    for mode, rows in by_mode.items():
        where = out / mode if len(by_mode) > 1 else out
        where.mkdir(parents=True, exist_ok=True)
        body = report(rows, where, f"{title}, scheduling {mode}", head)
        print(f"# {title}, scheduling {mode}\n\n{header_markdown(head)}\n\n{body}")
    if len(by_mode) > 1:
        body = scheduling_markdown(merge_rounds(by_mode["default"]), merge_rounds(by_mode["sync"]))
        write_result(out / "e2e-scheduling.md", f"{title}: the line's default scheduling against async off", head,
                     body, {"default": by_mode["default"], "sync": by_mode["sync"]})
        print(body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
