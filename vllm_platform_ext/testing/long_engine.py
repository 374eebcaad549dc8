"""The engine side of the ``long`` cells (:mod:`.long_cells`): one in-process ``LLM`` per cell, requests
added between ``LLMEngine.step()`` calls (staggered arrivals: prefills and chunked prefills join the
batches of requests already decoding or verifying), and what the engine did, read from the engine:

- its settings as vLLM resolved them (:func:`resolved_settings`, from the engine's ``VllmConfig``
  after construction, not from what was passed): async scheduling, prefix caching, the mamba cache
  mode, chunked prefill, the step budget, the block size and the number of KV blocks;
- vLLM's own counters over the cell (``LLM.get_metrics()``, deltas): ``vllm:num_preemptions``,
  ``vllm:prefix_cache_queries`` / ``vllm:prefix_cache_hits``, the speculative counters;
- every scheduler step (:class:`StepRecorder`, on the in-process engine core's scheduler,
  ``VLLM_ENABLE_V1_MULTIPROCESSING=0``): rows and tokens scheduled, which rows were prefills (new, a
  prompt chunk, a resumed request's recompute) and which decode / verify rows, requests resumed
  after preemption. A step with both is a *mixed* step: a late arrival joined a decode batch.
"""
from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field

from vllm_platform_ext.testing.acceptance import counter_delta, spec_counters
from vllm_platform_ext.testing.engine import (EngineConfig, _guard_vllm_kernel_rescan, _shutdown, _top_logprobs,
                                              accelerator_engine_kwargs, apply_engine_env, engine_path,
                                              model_engine_kwargs, plugin_patch_status)

COUNTERS = {  # vLLM's Prometheus counters a cell records (summed over engines), by the name kept
    "vllm:num_preemptions": "preemptions",
    "vllm:prefix_cache_queries": "prefix_cache_queries",
    "vllm:prefix_cache_hits": "prefix_cache_hits",
    "vllm:spec_decode_num_drafts": "num_drafts",
    "vllm:spec_decode_num_draft_tokens": "num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "num_accepted_tokens",
}


def counters(llm) -> dict:
    return spec_counters(llm, COUNTERS)


def resolved_settings(llm) -> dict:
    """The engine's settings as vLLM resolved them (its ``VllmConfig`` after construction)."""
    cfg = llm.llm_engine.vllm_config
    sc, cc, mc = cfg.scheduler_config, cfg.cache_config, cfg.model_config
    spec = cfg.speculative_config
    comp = getattr(cfg, "compilation_config", None)
    return {
        "async_scheduling": bool(sc.async_scheduling),
        "enable_prefix_caching": bool(cc.enable_prefix_caching),
        "mamba_cache_mode": str(getattr(cc, "mamba_cache_mode", "n/a")),
        "enable_chunked_prefill": bool(sc.enable_chunked_prefill),
        "max_num_batched_tokens": int(sc.max_num_batched_tokens),
        "max_num_seqs": int(sc.max_num_seqs),
        "block_size": int(cc.block_size),
        "num_blocks": int(cc.num_gpu_blocks or 0),
        "kv_cache_size_tokens": int(getattr(cc, "kv_cache_size_tokens", 0) or 0),  # what the pool holds (all groups)
        "kv_cache_dtype": str(cc.cache_dtype),
        "max_model_len": int(mc.max_model_len),
        "enforce_eager": bool(mc.enforce_eager),
        "cudagraph_mode": str(getattr(comp, "cudagraph_mode", None)),
        "speculative": None if spec is None else {"method": str(spec.method),
                                                  "num_speculative_tokens": int(spec.num_speculative_tokens)},
    }


def scheduler_of(llm):
    """The in-process engine core's scheduler (``VLLM_ENABLE_V1_MULTIPROCESSING=0``); a clear error where
    the engine core runs in another process."""
    client = llm.llm_engine.engine_core
    core = getattr(client, "engine_core", None)
    sched = getattr(core, "scheduler", None)
    if sched is None:
        raise RuntimeError(f"the engine core is not in this process ({type(client).__name__}): the long cells read "
                           "its scheduler, set VLLM_ENABLE_V1_MULTIPROCESSING=0")
    return sched


class StepRecorder:
    """Wraps the scheduler's ``schedule`` (this engine's instance only) and keeps one row per step:
    ``[rows, tokens, prefill rows, prefill tokens, decode/verify rows, resumed rows]``."""

    def __init__(self, scheduler):
        self.scheduler, self.steps = scheduler, []
        self._orig = scheduler.schedule
        scheduler.schedule = self._schedule

    def close(self) -> None:
        self.scheduler.schedule = self._orig

    def _schedule(self, *args, **kwargs):
        out = self._orig(*args, **kwargs)
        self.steps.append(step_row(out))
        return out


def step_row(out) -> list[int]:
    """One scheduler step: a row is a prefill when it is new, a prompt chunk (no output token yet), a
    resumed request, or more tokens than one plus its drafts (a recompute); else a decode / verify row."""
    new = {r.req_id for r in out.scheduled_new_reqs}
    cached = out.scheduled_cached_reqs
    outputs = dict(zip(cached.req_ids, getattr(cached, "num_output_tokens", []) or []))
    resumed = set(getattr(cached, "resumed_req_ids", set()) or set())
    spec = out.scheduled_spec_decode_tokens or {}
    pre_rows = pre_tok = dec_rows = 0
    for rid, n in out.num_scheduled_tokens.items():
        if rid in new or rid in resumed or outputs.get(rid, 1) == 0 or n > 1 + len(spec.get(rid, ())):
            pre_rows, pre_tok = pre_rows + 1, pre_tok + n
        else:
            dec_rows += 1
    return [len(out.num_scheduled_tokens), int(out.total_num_scheduled_tokens), pre_rows, pre_tok, dec_rows,
            len(resumed & set(out.num_scheduled_tokens))]


def step_summary(steps: list) -> dict:
    busy = [s for s in steps if s[1] > 0]
    mixed = [s for s in busy if s[2] and s[4]]
    return {
        "engine_steps": len(busy),
        "idle_steps": len(steps) - len(busy),
        "tokens_per_step": round(sum(s[1] for s in busy) / len(busy), 2) if busy else 0.0,
        "max_requests_per_step": max((s[0] for s in busy), default=0),
        "steps_with_several_requests": sum(1 for s in busy if s[0] > 1),
        "mixed_steps": len(mixed),  # a prefill row beside decode / verify rows
        "mixed_prefill_tokens": sum(s[3] for s in mixed),
        "verify_steps": sum(1 for s in busy if s[4]),
        "resumed_rows": sum(s[5] for s in busy),
    }


@dataclass
class CellRun:
    name: str
    tokens: list = field(default_factory=list)
    logprobs: list = field(default_factory=list)
    requests: list = field(default_factory=list)  # per request: arrival / first-token / finish step, cached tokens
    settings: dict = field(default_factory=dict)  # resolved_settings
    counters: dict = field(default_factory=dict)  # vLLM's counters over the cell (deltas)
    steps: dict = field(default_factory=dict)  # step_summary
    engine_path: dict = field(default_factory=dict)
    patches: dict = field(default_factory=dict)
    init_s: float = 0.0
    generate_s: float = 0.0
    error: str = ""


def engine_kwargs(model: str, cell: dict) -> dict:
    """The ``LLM`` arguments of a cell: vLLM's defaults except what the cell names (``engine``), the
    speculative config, graphs and KV cache dtype (:class:`engine.EngineConfig`), and what the kit needs."""
    cfg = EngineConfig(cell["mode"], cell["k"], kv_cache_dtype=cell.get("kv", "auto"), graphs=cell.get("graphs", "eager"))
    kw = cfg.engine_kwargs()
    kw.pop("enable_prefix_caching")  # vLLM's default unless the cell names it
    kw.update(model=str(model), dtype="bfloat16", seed=0, disable_log_stats=False, **accelerator_engine_kwargs())
    kw.update(model_engine_kwargs(model))
    kw.update(cell.get("engine") or {})
    return kw


def drive(llm, prompts: list, arrivals: list, sp) -> tuple[dict, list]:
    """Add request ``i`` once the engine has run ``arrivals[i]`` steps (at once where it idles), step until
    all finish; ({index: final RequestOutput}, per-request step records)."""
    eng = llm.llm_engine
    pending = sorted(range(len(prompts)), key=lambda i: (arrivals[i], i))
    done, first, added, finish, step = {}, {}, {}, {}, 0
    while pending or eng.has_unfinished_requests():
        if pending and not eng.has_unfinished_requests():
            step = max(step, arrivals[pending[0]])
        while pending and arrivals[pending[0]] <= step:
            i = pending.pop(0)
            eng.add_request(f"long-{i}", {"prompt_token_ids": list(prompts[i])}, sp)
            added[i] = step
        for o in eng.step():
            i = int(o.request_id.split("-")[1])
            if o.outputs and o.outputs[0].token_ids and i not in first:
                first[i] = step
            if o.finished:
                done[i], finish[i] = o, step
        step += 1
    reqs = [{"prompt_tokens": len(prompts[i]), "arrival_step": added[i], "first_token_step": first.get(i),
             "finish_step": finish[i], "num_cached_tokens": int(getattr(done[i], "num_cached_tokens", 0) or 0)}
            for i in range(len(prompts))]
    return done, reqs


def pool_facts(model: str, cell: dict) -> dict:
    """The resolved settings of an engine built with this cell's arguments and vLLM's KV size, shut down again:
    what a block holds (``kv_cache_size_tokens / num_blocks``) and the block size, for cells given in tokens."""
    from vllm import LLM

    kw = engine_kwargs(model, cell)
    kw.pop("num_gpu_blocks_override", None)
    _guard_vllm_kernel_rescan()
    llm = LLM(**kw)
    try:
        return resolved_settings(llm)
    finally:
        _shutdown(llm)


def resolve_cell(model: str, cell: dict, facts: dict) -> dict:
    """A cell whose ``engine`` names ``kv_tokens`` gets ``num_gpu_blocks_override`` holding that many tokens, one
    naming ``budget_blocks`` a ``max_num_batched_tokens`` of that many blocks (``facts``: by speculative method, the
    resolved settings of a cell that ran before in this process without an override; else a calibration engine)."""
    eng = dict(cell.get("engine") or {})
    want, blocks = eng.pop("kv_tokens", None), eng.pop("budget_blocks", None)
    if want is None and blocks is None:
        return cell
    key = cell["mode"]
    if key not in facts:
        facts[key] = pool_facts(model, {**cell, "engine": eng})
    f = facts[key]
    if want is not None:
        if not f["kv_cache_size_tokens"] or not f["num_blocks"]:
            raise RuntimeError("this vLLM reports no kv_cache_size_tokens: give the cell num_gpu_blocks_override")
        eng["num_gpu_blocks_override"] = max(1, round(int(want) * f["num_blocks"] / f["kv_cache_size_tokens"]))
    if blocks is not None:
        eng["max_num_batched_tokens"] = int(blocks) * f["block_size"]
    return {**cell, "engine": eng}


def run_cell(model: str, prompts: list, cell: dict, max_tokens: int, logprobs: int = 20) -> CellRun:
    apply_engine_env()
    from vllm import LLM, SamplingParams

    _guard_vllm_kernel_rescan()
    t0 = time.perf_counter()
    llm = LLM(**engine_kwargs(model, cell))
    run = CellRun(name=cell["name"], init_s=time.perf_counter() - t0, settings=resolved_settings(llm),
                  engine_path=engine_path(llm))
    try:
        rec = StepRecorder(scheduler_of(llm))
        sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, detokenize=False,
                            logprobs=logprobs or None)
        before = counters(llm)
        t0 = time.perf_counter()
        done, run.requests = drive(llm, prompts, cell["arrivals"], sp)
        run.generate_s = time.perf_counter() - t0
        run.counters = counter_delta(before, counters(llm))
        rec.close()
        run.steps = step_summary(rec.steps)
    finally:
        _shutdown(llm)
    run.tokens = [list(done[i].outputs[0].token_ids) for i in range(len(prompts))]
    run.logprobs = [_top_logprobs(done[i].outputs[0]) for i in range(len(prompts))] if logprobs else []
    run.patches = plugin_patch_status()
    return run


def _worker(job_path: str, out_path: str) -> int:
    with open(job_path) as f:
        job = json.load(f)
    apply_engine_env()
    runs, facts = [], {}
    for cell in job["cells"]:
        try:
            cell = resolve_cell(job["model"], cell, facts)
            run = run_cell(job["model"], job["prompts"], cell, job["max_tokens"], job.get("logprobs", 20))
            s = run.settings
            if "num_gpu_blocks_override" not in cell["engine"]:
                facts.setdefault(cell["mode"], s)
        except Exception as exc:  # the next cell still runs: the results say which broke
            import traceback

            run = CellRun(name=cell["name"], error=f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=-4)}",
                          patches=plugin_patch_status())
        print(f"[long] {run.name}: init {run.init_s:.1f}s generate {run.generate_s:.1f}s {run.steps} "
              f"{ {k: v for k, v in run.counters.items() if k != 'accepted_per_pos'} } {run.error[:200]}",
              file=sys.stderr, flush=True)
        runs.append(asdict(run))
        with open(out_path, "w") as f:  # what finished is kept if a later cell kills the process
            json.dump(runs, f)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    raise SystemExit(_worker(sys.argv[1], sys.argv[2]))
