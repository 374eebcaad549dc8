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

    def take(self) -> dict:
        """The steps logged so far (as a dict), the log emptied for the next timed run."""
        steps = asdict(self)
        self.verify, self.plain, self.mixed, self.cpus = [], [], 0, {}
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
    """Time ``EngineCore.step`` and class each step by the scheduler output it ran. With
    ``log.profile`` set, steps after the first ``profile_after`` of that class run under
    torch.profiler until one of that class is caught (its trace and op table are written; those
    steps are left out of the timings)."""
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
        elif kind in ("verify", "plain") and prof is None:
            getattr(log, kind).append(dt)
            cpu = this_cpu()
            if cpu is not None:
                log.cpus[str(cpu)] = log.cpus.get(str(cpu), 0) + 1
        elif kind == "mixed":
            log.mixed += 1
        return res

    Scheduler.schedule, EngineCore.step = timed_schedule, timed_step


def _prompts(batch: int, context: int, vocab: int) -> list[list[int]]:
    r = random.Random(0)
    return [[r.randrange(4, vocab) for _ in range(context)] for _ in range(batch)]


def engine_setup(job: dict):
    """The job's ``(EngineConfig, EngineSettings, LLM kwargs)``: sized for its largest (batch, context)
    pair, async scheduling off (one step is one forward and its sampling), dummy weights unless tiny."""
    from vllm_platform_ext.testing.engine import EngineConfig, EngineSettings

    s = job["setup"]
    pairs = [tuple(p) for p in job["pairs"]]
    cfg = EngineConfig(s["mode"], s["k"], kv_cache_dtype=s["kv"], graphs=s["graphs"], tp=job.get("tp", 1))
    settings = EngineSettings(max_tokens=job["max_tokens"], logprobs=0, max_num_seqs=max(max(b for b, _ in pairs), 1),
                              max_num_batched_tokens=job["max_num_batched_tokens"],
                              max_model_len=max(c for _, c in pairs) + job["max_tokens"] + 8,
                              gpu_memory_utilization=job["gpu_memory_utilization"], warmup_runs=1,
                              kv_cache_memory_bytes=job.get("kv_cache_memory_bytes", 0))
    extra = {"async_scheduling": False}
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

    def more(llm, sp):
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
    local = gpu_local_cpus()
    for r in results:
        r["steps"]["gpu_local_cpus"] = local
    Path(out_path).write_text(json.dumps({"pairs": [list(p) for p in pairs], "results": results}))
    return 0
