"""Serving at a fixed memory budget (issue 53, goal 3): ``vllm serve`` once per configuration, every one
with the same ``--kv-cache-memory-bytes``, each driven over 127.0.0.1 by vLLM's own ``vllm bench serve``
(random dataset, ``--max-concurrency`` streams, ``--ignore-eos``, ``--save-result``); its JSON results
side by side: output tokens/s and its ratio to bf16, failed requests, TTFT / TPOT / ITL percentiles as
``vllm bench serve`` writes them, each server's KV capacity from its log, and a plot.

Configurations (MTP k=3 each; plugin on): ``bf16`` (KV auto), ``k8v4`` (turboquant_k8v4), ``3bit_nc``
(turboquant_3bit_nc). Goals: k8v4 output tokens/s >= 2.0x bf16's; no failed request; 3bit_nc reported.

Models: ``qwen36_a3b`` / ``qwen36_27b`` (dummy weights, ``e2e_spec_decode.py``'s shapes, with a word-level
tokenizer covering the whole 248320-token vocabulary, so random prompts round-trip exactly and every
generated id decodes), ``tiny`` (the kit model and its tokenizer: the CPU smoke).

    python benchmarks/serve_budget.py --model qwen36_a3b --layers 40 --out DIR           # GPU machine
    python benchmarks/serve_budget.py --model tiny --configs bf16 --concurrency 2 --num-prompts 2 \\
        --input-len 64 --output-len 8 --out DIR                                          # CPU smoke
    python benchmarks/serve_budget.py --report DIR --out DIR2     # the report again from DIR's bench JSON

``--kv-cache-memory-bytes`` 0 (default): sized so TurboQuant k8v4 holds every stream's prompt + output
(:func:`default_budget`); each server's log says how many tokens it got (the table's KV tokens), so
the run shows whether bf16 had to queue.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
from bench_common import markdown_table, run_header, write_result  # noqa: E402

CONFIGS = {"bf16": "auto", "k8v4": "turboquant_k8v4", "3bit_nc": "turboquant_3bit_nc"}
SPEC_K = 3
PERCENTILES = "50,90,99"
METRICS = "ttft,tpot,itl,e2el"
KV_TOKENS = re.compile(r"KV cache size: ([\d,]+) tokens")
MAX_CONCURRENCY = re.compile(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x")


def default_budget(text_cfg: dict, kv: str, streams: int, tokens: int, slack: float = 1.25) -> int:
    """Bytes for ``streams`` requests of ``tokens`` each in ``kv``'s cache: attention layers (+ the MTP
    layer) x KV heads x bytes per token (bf16 K+V or the TurboQuant slot), plus each request's GDN
    state (conv + float32 SSM per linear layer), times ``slack`` for vLLM's page rounding."""
    layers = text_cfg["layer_types"]
    attn = layers.count("full_attention") + text_cfg.get("mtp_num_hidden_layers", 0)
    hk, d = text_cfg["num_key_value_heads"], text_cfg["head_dim"]
    if kv == "auto":
        per_head = 2 * d * 2
    else:
        from vllm_platform_ext.ops.turboquant.layout import layout_for

        per_head = layout_for(kv, d).slot_size_aligned
    hv, nk = text_cfg["linear_num_value_heads"], text_cfg["linear_num_key_heads"]
    dk, dv = text_cfg["linear_key_head_dim"], text_cfg["linear_value_head_dim"]
    gdn = layers.count("linear_attention") * ((text_cfg["linear_conv_kernel_dim"] - 1) * (2 * nk * dk + hv * dv) * 2
                                              + hv * dk * dv * 4)
    return int(slack * (streams * tokens * attn * hk * per_head + streams * gdn))


def write_word_tokenizer(out: Path, vocab_size: int) -> None:
    """A word-level tokenizer with one word per id (``<pad> <s> </s> <unk>`` then ``t4`` ...), split on
    whitespace: ``decode`` then ``encode`` gives the same ids back, every id decodes."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    special = ["<pad>", "<s>", "</s>", "<unk>"]
    vocab = {t: i for i, t in enumerate(special + [f"t{i}" for i in range(len(special), vocab_size)])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                            pad_token="<pad>", model_max_length=1 << 20).save_pretrained(str(out))


def write_model(kind: str, layers: int, out: Path) -> Path:
    """The served model: the kit's tiny model (its tokenizer), or a dummy-weight shape + word tokenizer."""
    import e2e_spec_decode as E

    path = E.write_model(kind, layers, out)
    if kind != "tiny":
        write_word_tokenizer(path, json.loads((path / "config.json").read_text())["text_config"]["vocab_size"])
    return path


def serve_args(model: Path, kv: str, a, budget: int) -> list[str]:
    """``vllm serve``'s arguments for one configuration (the same budget and sizes for every one)."""
    from vllm_platform_ext.testing.engine import model_engine_kwargs

    args = ["--kv-cache-memory-bytes", str(budget), "--kv-cache-dtype", kv, "--seed", "0",
            "--max-model-len", str(a.input_len + a.output_len + 64), "--max-num-seqs", str(a.concurrency),
            "--speculative-config", json.dumps({"method": "mtp", "num_speculative_tokens": SPEC_K})]
    if a.model != "tiny":
        args += ["--load-format", "dummy", "--gpu-memory-utilization", str(a.gpu_memory_utilization)]
    if a.enforce_eager:
        args.append("--enforce-eager")
    if model_engine_kwargs(str(model)).get("language_model_only"):
        args.append("--language-model-only")
    return args + a.serve_arg


def bench_args(model: Path, port: int, a, result_dir: Path, name: str) -> list[str]:
    """``vllm bench serve``'s arguments (the same flags on vLLM 0.26, 0.32 and 0.33)."""
    return [sys.executable, "-m", "vllm.entrypoints.cli.main", "bench", "serve", "--backend", "vllm",
            "--base-url", f"http://127.0.0.1:{port}", "--endpoint", "/v1/completions", "--model", str(model),
            "--served-model-name", "tiny", "--tokenizer", str(model), "--dataset-name", "random",
            "--random-input-len", str(a.input_len), "--random-output-len", str(a.output_len),
            "--random-range-ratio", "0", "--num-prompts", str(a.num_prompts), "--max-concurrency",
            str(a.concurrency), "--request-rate", "inf", "--ignore-eos", "--seed", "0", "--percentile-metrics",
            METRICS, "--metric-percentiles", PERCENTILES, "--save-result", "--result-dir", str(result_dir),
            "--result-filename", f"{name}.json", "--disable-tqdm"]


def server_capacity(log_text: str) -> dict:
    """The KV tokens and the maximum concurrency a server's log states (None where it states none)."""
    tokens, conc = KV_TOKENS.findall(log_text), MAX_CONCURRENCY.findall(log_text)
    return {"kv_tokens": int(tokens[-1].replace(",", "")) if tokens else None,
            "kv_max_concurrency": float(conc[-1][1]) if conc else None}


def run_config(name: str, model: Path, a, budget: int, out: Path) -> dict:
    """One server for ``name``, one ``vllm bench serve`` against it; the bench's JSON + the server's figures."""
    from vllm_platform_ext.testing.serve_load import start_server, stop_server

    log = out / f"serve-{name}.log"
    env = {} if a.model == "tiny" else {"VLLM_ENABLE_V1_MULTIPROCESSING": "1"}  # the GPU server as users run it
    t0 = time.time()
    proc, port = start_server(str(model), serve_args(model, CONFIGS[name], a, budget), str(log), env)
    started = time.time() - t0
    try:
        bench = subprocess.run(bench_args(model, port, a, out, name), capture_output=True, text=True,
                               timeout=a.bench_timeout, env={**os.environ, "NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1"})
    finally:
        stop_server(proc)
    (out / f"bench-{name}.log").write_text(bench.stdout + bench.stderr)
    if bench.returncode != 0 or not (out / f"{name}.json").exists():
        tail = (bench.stdout + bench.stderr).strip().splitlines()[-5:]
        return {"config": name, "error": f"vllm bench serve rc={bench.returncode}: " + " | ".join(tail)[-600:]}
    meta = {"config": name, "kv": CONFIGS[name], "budget_bytes": budget, "server_start_s": round(started, 1),
            **server_capacity(log.read_text(errors="replace"))}
    (out / f"{name}.server.json").write_text(json.dumps(meta))
    return load_result(out, name)


def load_result(d: Path, name: str) -> dict:
    """A configuration's row from ``d``: ``vllm bench serve``'s saved JSON (``NAME.json``) and the
    server's figures (``NAME.server.json``)."""
    bench = json.loads((d / f"{name}.json").read_text())
    meta_path = d / f"{name}.server.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {"config": name}
    keep = {k: v for k, v in bench.items() if k in ("completed", "failed", "num_prompts", "duration", "output_throughput",
                                                     "request_throughput", "total_token_throughput", "total_input_tokens",
                                                     "total_output_tokens", "max_concurrent_requests",
                                                     "spec_decode_acceptance_length")
            or re.fullmatch(r"(mean|median|std|p[\d.]+)_(ttft|tpot|itl|e2el)_ms", k)}
    failed = keep.get("failed")
    if failed is None:  # a line that writes no "failed": the prompts that did not complete
        failed = bench.get("num_prompts", 0) - bench.get("completed", 0)
    return meta | keep | {"failed": failed, "bench_max_concurrency": bench.get("max_concurrency")}


def judge(rows: list[dict]) -> list[dict]:
    """Issue 53's goal 3 on the rows: k8v4 / bf16 output tokens/s >= 2.0; 3bit_nc / bf16 reported;
    no failed request in any configuration (None: not measured)."""
    by = {r["config"]: r for r in rows if "error" not in r}
    base = by.get("bf16", {}).get("output_throughput")
    out = []
    for name, target in (("k8v4", 2.0), ("3bit_nc", None)):
        x = by.get(name, {}).get("output_throughput")
        ratio = x / base if x and base else None
        out.append({"goal": f"{name} / bf16 output tok/s", "measured": ratio,
                    "target": f">= {target}" if target else "(reported)",
                    "met": None if ratio is None or not target else ratio >= target,
                    "reported": target is None and ratio is not None})
    for r in rows:
        bad = r.get("failed") if "error" not in r else None
        out.append({"goal": f"{r['config']}: failed requests", "measured": bad, "target": "0",
                    "met": None if bad is None else bad == 0})
    return out


def report(rows: list[dict], out: Path, head: dict) -> str:
    """serve-budget.md / .json (header, table, goals) and serve-budget.png where matplotlib is installed."""
    cols = [("config", "config"), ("kv", "KV"), ("kv_tokens", "KV tokens"),
            ("kv_max_concurrency", "streams the KV holds (server log)"),
            ("max_concurrent_requests", "most requests in flight"), ("completed", "completed"), ("failed", "failed"),
            ("spec_decode_acceptance_length", "acceptance length"), ("output_throughput", "output tok/s"),
            ("ratio", "/ bf16")]
    for m in METRICS.split(",")[:3]:
        cols += [(f"median_{m}_ms", f"{m.upper()} p50 ms")] + [(f"p{p}_{m}_ms", f"{m.upper()} p{p} ms")
                                                               for p in PERCENTILES.split(",")[1:]]
    base = next((r.get("output_throughput") for r in rows if r["config"] == "bf16" and "error" not in r), None)
    shown = [r | {"ratio": r["output_throughput"] / base if base and r.get("output_throughput") else None}
             for r in rows if "error" not in r]
    fmt = {c: ".1f" for c, _ in cols if c.endswith("_ms")} | {"output_throughput": ".1f", "ratio": ".2f",
                                                             "spec_decode_acceptance_length": ".2f"}
    goals = [g | {"measured_cell": "n/a" if g["measured"] is None else
                  (f"{g['measured']:.2f}" if isinstance(g["measured"], float) else str(g["measured"])),
                  "met_cell": "reported" if g.get("reported") else
                  {True: "met", False: "**not met**", None: "not measured"}[g["met"]]} for g in judge(rows)]
    body = (markdown_table(shown, cols, fmt) + "".join(f"\n\nerror ({r['config']}): {r['error']}" for r in rows
                                                       if "error" in r)
            + "\n\n## Goals (issue 53, goal 3)\n\n"
            + markdown_table(goals, [("goal", "goal"), ("measured_cell", "measured"), ("target", "target"),
                                     ("met_cell", "met")]) + "\n")
    try:
        body += f"\n![serving]({plot(shown, out / 'serve-budget.png').name})\n"
    except ImportError:
        body += "\n(no plot: matplotlib is not installed here; `--report` on a machine that has it)\n"
    write_result(out / "serve-budget.md", "Serving at a fixed KV memory budget: vllm bench serve", head, body,
                 {"rows": rows, "goals": judge(rows)})
    return body


def plot(rows: list[dict], path: Path) -> Path:
    """Output tokens/s, TTFT and TPOT percentiles per configuration (one panel each)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["config"] for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    axes[0].bar(names, [r.get("output_throughput") or 0 for r in rows])
    axes[0].set_title("output tokens/s")
    for ax, m in zip(axes[1:], ("ttft", "tpot")):
        ps = ["median"] + [f"p{p}" for p in PERCENTILES.split(",")[1:]]
        w = 0.8 / len(ps)
        for i, p in enumerate(ps):
            ax.bar([j + (i - (len(ps) - 1) / 2) * w for j in range(len(rows))],
                   [r.get(f"{p}_{m}_ms") or 0 for r in rows], w, label=p.replace("median", "p50"))
        ax.set_xticks(range(len(rows)), names)
        ax.set_title(f"{m.upper()} ms")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=("qwen36_a3b", "qwen36_27b", "tiny"), default="qwen36_a3b")
    ap.add_argument("--layers", type=int, default=40)
    ap.add_argument("--configs", default="bf16,k8v4,3bit_nc", help=f"of {', '.join(CONFIGS)}")
    ap.add_argument("--kv-cache-memory-bytes", type=int, default=0, help="0: default_budget for k8v4")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--num-prompts", type=int, default=0, help="0: 2 x concurrency")
    ap.add_argument("--input-len", type=int, default=16384)
    ap.add_argument("--output-len", type=int, default=512)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    ap.add_argument("--enforce-eager", action="store_true")
    ap.add_argument("--serve-arg", action="append", default=[], help="one more `vllm serve` argument (repeatable)")
    ap.add_argument("--bench-timeout", type=float, default=3600)
    ap.add_argument("--report", metavar="DIR", help="the report again from DIR's saved bench JSON")
    ap.add_argument("--out", default="results/gpu/new-serve-budget")
    a = ap.parse_args(argv)
    names = [n for n in a.configs.split(",") if n]
    unknown = [n for n in names if n not in CONFIGS]
    if unknown or not names:
        ap.error(f"--configs {a.configs!r}: unknown {unknown}; choose from {', '.join(CONFIGS)}")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.report:
        src = Path(a.report)
        rows = [load_result(src, n) for n in names if (src / f"{n}.json").exists()]
        head = json.loads((src / "serve-budget.json").read_text())["header"] if (src / "serve-budget.json").exists() \
            else run_header()
        head = head | {"report": run_header()["command"], "configs": ",".join(r["config"] for r in rows)}
        print(report(rows, out, head))
        return 0
    a.num_prompts = a.num_prompts or 2 * a.concurrency
    rows = []
    with tempfile.TemporaryDirectory(prefix="vpe-serve-budget-") as tmp:
        model = write_model(a.model, a.layers, Path(tmp) / a.model)
        cfg = json.loads((model / "config.json").read_text())
        text = cfg.get("text_config", cfg)
        budget = a.kv_cache_memory_bytes or (1 << 30 if a.model == "tiny" else default_budget(  # CPU: 1 GiB
            text, CONFIGS["k8v4"], a.concurrency, a.input_len + a.output_len + SPEC_K + 1))
        for name in names:
            try:
                rows.append(run_config(name, model, a, budget, out))
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                rows.append({"config": name, "error": str(exc)[-600:]})
            print(json.dumps(rows[-1]), flush=True)
    head = run_header(benchmark="serve-budget", model=a.model, layers=a.layers if a.model != "tiny" else None,
                      kv_cache_memory_bytes=budget, concurrency=a.concurrency, num_prompts=a.num_prompts,
                      input_len=a.input_len, output_len=a.output_len, speculative=f"mtp k={SPEC_K}")
    print(report(rows, out, head))
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
