"""What runs inside an engine process of the end-to-end benchmark (``e2e_spec_decode.py --worker``,
``e2e_paired.py --serve``): the step timer that times and classes every ``EngineCore.step``, where
the steps ran (CPU), one profiled step, the job's engine settings and prompts, and ``worker``, one
engine over a job's (batch, context) pairs."""
from __future__ import annotations

import ctypes
import functools
import json
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass
class StepLog:
    verify: list = field(default_factory=list)
    plain: list = field(default_factory=list)
    mixed: int = 0
    profile: str | None = None  # "verify" / "plain": profile one step of that class (torch.profiler)
    profile_to: str | None = None  # path prefix of the trace (.trace.json) and the op table (.ops.txt)
    profiled: str | None = None  # the trace written
    cpus: dict = field(default_factory=dict)  # CPU -> timed steps that ended on it (the step's thread)
    last_result_t: float | None = None  # async scheduling: when the last batch's results were applied

    def take(self) -> dict:
        """The steps logged so far (as a dict), the log emptied for the next timed run (whose first
        async period starts at its own first result, not at this run's last)."""
        steps = asdict(self)
        steps.pop("last_result_t")
        self.verify, self.plain, self.mixed, self.cpus, self.last_result_t = [], [], 0, {}, None
        return steps


@functools.cache
def _sched_getcpu():
    try:
        return ctypes.CDLL(None).sched_getcpu
    except (OSError, AttributeError):  # no glibc
        return None


def this_cpu() -> int | None:
    """The CPU the calling thread runs on now (glibc's ``sched_getcpu``), None where there is none.
    An engine's step at batch 1 is host work: window 9 saw one configuration at 5.6 or 9.4 ms from
    one engine instance to the next, on a quiet host; each row says where its steps ran."""
    getcpu = _sched_getcpu()
    cpu = getcpu() if getcpu else -1
    return cpu if cpu >= 0 else None


def gpu_local_cpus() -> str | None:
    """The CPUs local to this process's GPU (its PCI device's ``local_cpulist``), None without one."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        p = torch.cuda.get_device_properties(torch.cuda.current_device())
        bus = f"{p.pci_domain_id:04x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0"
        return Path(f"/sys/bus/pci/devices/{bus}/local_cpulist").read_text().strip()
    except Exception:  # noqa: BLE001 -- a diagnostic: absent rather than a failed row
        return None


def _step_class(so) -> str | None:
    """"verify" (every request runs 1 + its drafts, some drafts), "plain" (one token each),
    "mixed" (a prefill in it) or None (nothing scheduled)."""
    if so is None or not so.num_scheduled_tokens:
        return None
    spec = so.scheduled_spec_decode_tokens or {}
    decode = not so.scheduled_new_reqs and all(n == 1 + len(spec.get(r, ())) for r, n in so.num_scheduled_tokens.items())
    if decode and any(spec.values()):
        return "verify"
    return "plain" if decode else "mixed"


def _profiler():
    import torch
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    return profile(activities=acts)


def _write_profile(prof, prefix: str) -> str:
    import torch

    trace = prefix + ".trace.json"
    prof.export_chrome_trace(trace)
    key = "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
    Path(prefix + ".ops.txt").write_text(prof.key_averages().table(sort_by=key, row_limit=40))
    return trace


def install_step_timer(log: StepLog, profile_after: int = 3) -> None:
    """Time the engine's steps and class each by the scheduler output whose results it applied
    (``Scheduler.update_from_output``'s).

    * Async scheduling off (``EngineCore.step``): one step is one forward and its sampling, timed
      around the call. With ``log.profile`` set, steps after the first ``profile_after`` of that
      class run under torch.profiler until one of that class is caught (its trace and op table are
      written; those steps are left out of the timings).
    * Async scheduling on (``EngineCore.step_with_batch_queue``, vLLM's default for MTP from 0.23):
      the next batch is scheduled and launched while the last one runs, so a step's time is the
      period between two batches' results (one ``update_from_output`` to the next): what a user's
      tokens/s sees. Not profiled (one call does not hold one batch)."""
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.engine.core import EngineCore

    last = {}
    update, step = Scheduler.update_from_output, EngineCore.step
    queued = getattr(EngineCore, "step_with_batch_queue", None)

    def timed_update(self, scheduler_output, *a, **kw):
        last["out"] = scheduler_output
        return update(self, scheduler_output, *a, **kw)

    def record(kind, dt):
        if kind in ("verify", "plain"):
            getattr(log, kind).append(dt)
            cpu = this_cpu()
            if cpu is not None:
                log.cpus[str(cpu)] = log.cpus.get(str(cpu), 0) + 1
        elif kind == "mixed":
            log.mixed += 1

    def timed_step(self, *a, **kw):
        last.pop("out", None)
        prof = None
        if log.profile and not log.profiled and len(getattr(log, log.profile)) >= profile_after:
            prof = _profiler()
            prof.__enter__()
        t0 = time.perf_counter()
        try:
            res = step(self, *a, **kw)
        finally:
            if prof is not None:
                prof.__exit__(None, None, None)
        dt = time.perf_counter() - t0
        kind = _step_class(last.get("out"))
        if prof is not None and kind == log.profile:
            log.profiled = _write_profile(prof, log.profile_to)
        elif prof is None:
            record(kind, dt)
        return res

    def timed_queued_step(self, *a, **kw):
        last.pop("out", None)
        res = queued(self, *a, **kw)
        if "out" in last:  # a batch's results were applied in this call
            now = time.perf_counter()
            prev, log.last_result_t = log.last_result_t, now
            kind = _step_class(last["out"])
            if prev is not None or kind == "mixed":  # a timed run's first result has no period yet
                record(kind, None if prev is None else now - prev)
        return res

    Scheduler.update_from_output, EngineCore.step = timed_update, timed_step
    if queued is not None:
        EngineCore.step_with_batch_queue = timed_queued_step


SCHEDULING = ("default", "sync")


def resolved_async_scheduling(llm) -> bool | None:
    """Async scheduling as the engine resolved it (the front end's VllmConfig), None where unread."""
    engine = getattr(llm, "llm_engine", None)
    cfg = getattr(engine, "vllm_config", None)
    sched = getattr(cfg, "scheduler_config", None)
    value = getattr(sched, "async_scheduling", None)
    return None if value is None else bool(value)


def _prompts(batch: int, context: int, vocab: int) -> list[list[int]]:
    r = random.Random(0)
    return [[r.randrange(4, vocab) for _ in range(context)] for _ in range(batch)]


def engine_setup(job: dict):
    """The job's ``(EngineConfig, EngineSettings, LLM kwargs)``: sized for its largest (batch, context)
    pair, dummy weights unless tiny. ``job["scheduling"]``: ``"default"`` (also when absent) leaves
    async scheduling unset, as the line resolves it (on for MTP from 0.23, what users run);
    ``"sync"`` turns it off (one step is one forward and its sampling; every e2e figure before
    2026-12-06 ran so)."""
    from vllm_platform_ext.testing.engine import EngineConfig, EngineSettings

    s = job["setup"]
    pairs = [tuple(p) for p in job["pairs"]]
    cfg = EngineConfig(s["mode"], s["k"], kv_cache_dtype=s["kv"], graphs=s["graphs"], tp=job.get("tp", 1))
    settings = EngineSettings(max_tokens=job["max_tokens"], logprobs=0, max_num_seqs=max(max(b for b, _ in pairs), 1),
                              max_num_batched_tokens=job["max_num_batched_tokens"],
                              max_model_len=max(c for _, c in pairs) + job["max_tokens"] + 8,
                              gpu_memory_utilization=job["gpu_memory_utilization"], warmup_runs=1,
                              kv_cache_memory_bytes=job.get("kv_cache_memory_bytes", 0))
    scheduling = job.get("scheduling", "default")
    if scheduling not in SCHEDULING:
        raise ValueError(f"job scheduling takes one of {', '.join(SCHEDULING)}; got {scheduling!r}")
    extra = {"async_scheduling": False} if scheduling == "sync" else {}
    if job["dummy"]:
        extra.update(load_format="dummy", skip_tokenizer_init=True)
    return cfg, settings, extra


def worker(job_path: str, out_path: str) -> int:
    """One engine for all of the job's (batch, context) pairs: the first through ``run_engine``,
    the others on the same engine afterwards (each: one warm-up generate, then the timed one, its
    steps logged apart). Sized for the largest pair."""
    job = json.loads(Path(job_path).read_text())
    from vllm_platform_ext.testing.engine import apply_engine_env, engine_path, run_engine, timed_generate

    apply_engine_env()
    log = StepLog(profile=job.get("profile"), profile_to=job.get("profile_to"))
    install_step_timer(log)
    pairs = [tuple(p) for p in job["pairs"]]
    cfg, settings, extra = engine_setup(job)
    results = []

    resolved = {}

    def more(llm, sp):
        resolved["async_scheduling"] = resolved_async_scheduling(llm)
        results.append({"steps": log.take()})  # the first pair's steps (run_engine's warm-up and timed run)
        for batch, context in pairs[1:]:  # one warm-up each, logged as run_engine's is
            outs, gen_s, spec = timed_generate(llm, _prompts(batch, context, job["vocab"]), sp, settings.warmup_runs)
            results.append({"run": {"generate_s": gen_s, "num_generated": sum(len(o.outputs[0].token_ids) for o in outs),
                                    "engine_path": engine_path(llm), **spec},
                            "steps": log.take()})

    first_batch, first_context = pairs[0]
    run = run_engine(job["model"], _prompts(first_batch, first_context, job["vocab"]), cfg, settings,
                     llm_kwargs=extra, then=more)
    results[0]["run"] = asdict(run) | {"tokens": []}
    for r in results[1:]:
        r["run"]["init_s"] = run.init_s  # the one start-up they shared
    for r in results:  # the mode each row ran in, as asked and as vLLM resolved it
        r["run"] |= {"scheduling": job.get("scheduling", "default"), "async_scheduling": resolved.get("async_scheduling")}
    local = gpu_local_cpus()
    for r in results:
        r["steps"]["gpu_local_cpus"] = local
    Path(out_path).write_text(json.dumps({"pairs": [list(p) for p in pairs], "results": results}))
    return 0
