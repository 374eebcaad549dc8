"""The plugin's ``VLLM_PLATFORM_EXT_*`` switches: names, valid values, and one validation.

:func:`problems` checks every ``VLLM_PLATFORM_EXT_*`` variable of the environment and returns
one message per bad switch, each naming the variable, the value and the valid values:

* an unknown variable name (a typo such as ``VLLM_PLATFORM_EXT_DISABLED``);
* ``VLLM_PLATFORM_EXT_PLATFORM`` not ``auto|maca|none``, or ``maca`` forced on a host with no
  MetaX runtime and no device for ``torch.cuda`` to stand in with (the engine would otherwise
  fail later with vLLM's "out of bounds for 0 devices", which never names the override);
* a boolean switch that is not ``1|0|true|false|yes|no|on|off``;
* ``VLLM_PLATFORM_EXT_DISABLE`` with a separator other than ``,``, an unknown patch-group name,
  a name in the wrong case or a prefix (``gdn``): names are matched exactly.

``bootstrap()`` records the problems as failed ``switches`` items and raises
:class:`SwitchError` before anything is applied (so vLLM never starts with a switch the user
set but the plugin ignored); ``doctor`` prints them and exits 1; ``verify --disable`` rejects a
bad list with a usage error.
"""
from __future__ import annotations

import difflib
import os
import re
from typing import Mapping, Sequence

PREFIX = "VLLM_PLATFORM_EXT_"
PLATFORM = "VLLM_PLATFORM_EXT_PLATFORM"
MXSML_LIB = "VLLM_PLATFORM_EXT_MXSML_LIB"
STRICT = "VLLM_PLATFORM_EXT_STRICT"
DISABLE = "VLLM_PLATFORM_EXT_DISABLE"
GDN_VALIDATE = "VLLM_PLATFORM_EXT_GDN_VALIDATE"
FORCED_CPU_PATH = "VLLM_PLATFORM_EXT_FORCED_CPU_PATH"
TQ_VERIFY_ROUTE = "VLLM_PLATFORM_EXT_TQ_VERIFY_ROUTE"
TQ_VERIFY_ROUTES = ("kernel", "upstream_rows")
TQ_ROUTE_CHECK = "VLLM_PLATFORM_EXT_TQ_ROUTE_CHECK"
LOAD_CHECK = "VLLM_PLATFORM_EXT_LOAD_CHECK"
LOAD_CHECK_MODES = ("error", "warn", "off")
GUARD = "VLLM_PLATFORM_EXT_GUARD"

PLATFORM_CHOICES = ("auto", "maca", "none")
TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off")
BOOL_CHOICES = "1|0|true|false|yes|no|on|off"

# name -> (valid values, what it does): the user switches, the switch table of docs/architecture.md
SWITCHES: dict[str, tuple[str, str]] = {
    PLATFORM: ("auto|maca|none", "override the MetaX probe (maca forces MetaX; needs a MetaX runtime or a "
                                 "device torch.cuda sees)"),
    MXSML_LIB: ("a path", "the libmxsml.so the probe loads (only that path)"),
    STRICT: (BOOL_CHOICES, "a failed item, or a patch group whose target is missing, raises instead of "
                           "being reported"),
    DISABLE: ("comma list of patch-group names", "skip these patch groups"),
    GDN_VALIDATE: (BOOL_CHOICES, "the GDN ops' host-side metadata checks (default on)"),
    LOAD_CHECK: ("error|warn|off", "a parameter no checkpoint tensor reached refuses the load (error, the default), "
                                   "is logged (warn), or is not looked for (off): patch/load_check.py"),
    GUARD: (BOOL_CHOICES, "the live guard in `vllm serve` (default off): loop, acceptance-collapse and "
                          "slower-than-plain warnings and vllm_platform_ext:guard_* metrics in /metrics "
                          "(patch group guard.live; docs/live_guard.md)"),
}
# the same for the switches that the benchmarks and the testing kit set, not users; read and checked as the others
DEV_SWITCHES: dict[str, tuple[str, str]] = {
    TQ_VERIFY_ROUTE: ("kernel|upstream_rows", "uniform K+1 TurboQuant verify batches: the plugin's K+1 kernel "
                                              "(default), or vLLM's decode kernel over B x (K+1) synthetic rows "
                                              "(vLLM PR #40914's routing; a benchmark baseline, config R)"),
    TQ_ROUTE_CHECK: (BOOL_CHOICES, "every call the TurboQuant verify route serves is also run through vLLM's own "
                                   "decode kernel on the same cache, one row per token, and the largest relative "
                                   "difference is kept (patch/turboquant/route_check.py; the GPU cells' audit; "
                                   "doubles the routed attention work)"),
    FORCED_CPU_PATH: ("avx512bf16|no-avx512bf16", "set by verify's force_no_avx512bf16 sitecustomize; not "
                                                  "for users"),
}
# every VLLM_PLATFORM_EXT_* variable the plugin reads: problems() knows these names, vLLM's env validation learns them
KNOWN: dict[str, tuple[str, str]] = {**SWITCHES, **DEV_SWITCHES}
_BOOLEANS = (STRICT, GDN_VALIDATE, TQ_ROUTE_CHECK, GUARD)
_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")


class SwitchError(ValueError):
    """One or more ``VLLM_PLATFORM_EXT_*`` switches are set to something the plugin cannot do."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("bad vllm-platform-ext switch(es): " + "; ".join(problems))
        self.problems = problems


def parse_bool(name: str, default: bool, env: Mapping[str, str] | None = None) -> bool:
    """The boolean switch ``name``; unset or empty is ``default``, a bad value is ``default``
    too (:func:`problems` reports it)."""
    raw = (os.environ if env is None else env).get(name, "").strip().lower()
    return True if raw in TRUE else False if raw in FALSE else default


def disable_problems(text: str, known: Sequence[str]) -> list[str]:
    """What is wrong with a ``VLLM_PLATFORM_EXT_DISABLE`` value (empty list: nothing); ``known`` is
    every patch-group name (``vllm_platform_ext.patch.group_names()``, which the caller passes: this
    module imports no patch group)."""
    known = list(known)
    valid = f"valid names: {', '.join(known)}"
    out = []
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        if not _NAME.match(item):
            seps = sorted({c for c in item if not _NAME.match(c)})
            out.append(f"{DISABLE}: {item!r} is not a patch-group name (found {' '.join(map(repr, seps))}; "
                       f"separate names with ','); {valid}")
        elif item not in known:
            same_case = [k for k in known if k.lower() == item.lower()]
            prefixed = [k for k in known if k.startswith(item + ".") or k.startswith(item + "_")]
            if same_case:
                hint = f"names are case-sensitive: did you mean {same_case[0]!r}?"
            elif prefixed:
                hint = f"prefixes are not expanded: name each group ({', '.join(prefixed)})"
            else:
                near = difflib.get_close_matches(item, known, n=2)
                hint = f"did you mean {' or '.join(map(repr, near))}?" if near else "no such group"
            out.append(f"{DISABLE}: unknown patch group {item!r} ({hint}); {valid}")
    return out


def forced_platform_problem() -> str | None:
    """Why ``VLLM_PLATFORM_EXT_PLATFORM=maca`` cannot run here, or ``None``.

    MetaX needs its runtime (``libmxsml.so`` reporting a device, or MetaX's torch); on NVIDIA
    the platform runs as a stand-in through ``torch.cuda``. With neither, vLLM's first device
    query finds 0 devices."""
    from vllm_platform_ext import detect

    hw = detect.hardware_probe()
    if hw.platform == "maca":
        return None
    try:
        import torch

        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        torch_version = torch.__version__
    except Exception as exc:  # no torch: no device either
        n, torch_version = 0, f"unavailable ({type(exc).__name__})"
    if n:
        return None
    return (f"{PLATFORM}=maca forces the MetaX platform, but the MetaX probe finds none "
            f"({hw.reason}) and torch {torch_version} sees no CUDA/MACA device to run it on; vLLM would stop at its first "
            f"device query ('... out of bounds for 0 devices'). Unset {PLATFORM} or set it to auto (probe "
            "the hardware) or none (plugin platform off); valid values: auto|maca|none")


def problems(env: Mapping[str, str] | None, groups: Sequence[str], check_runtime: bool = True) -> list[str]:
    """One message per bad ``VLLM_PLATFORM_EXT_*`` variable of ``env`` (``None``: the process's);
    ``groups``: every patch-group name, for ``VLLM_PLATFORM_EXT_DISABLE``."""
    env = os.environ if env is None else env
    out = []
    for name in sorted(k for k in env if k.startswith(PREFIX)):
        if name not in KNOWN:
            near = difflib.get_close_matches(name, KNOWN, n=1)
            out.append(f"{name} is not a variable of this plugin" + (f" (did you mean {near[0]}?)" if near else "")
                       + f"; it reads: {', '.join(KNOWN)}")
    if PLATFORM in env:
        raw = env[PLATFORM]
        choice = raw.strip().lower() or "auto"
        if choice not in PLATFORM_CHOICES:
            out.append(f"{PLATFORM}={raw!r} is not one of auto|maca|none")
        elif choice == "maca" and check_runtime:
            problem = forced_platform_problem()
            if problem:
                out.append(problem)
    for name in _BOOLEANS:
        raw = env.get(name)
        if raw is not None and raw.strip() and raw.strip().lower() not in TRUE + FALSE:
            out.append(f"{name}={raw!r} is not a boolean; valid values: {BOOL_CHOICES}")
    if env.get(DISABLE, "").strip():
        out += disable_problems(env[DISABLE], groups)
    mode = env.get(LOAD_CHECK)
    if mode is not None and mode.strip() and mode.strip().lower() not in LOAD_CHECK_MODES:
        out.append(f"{LOAD_CHECK}={mode!r} is not one of {'|'.join(LOAD_CHECK_MODES)}")
    route = env.get(TQ_VERIFY_ROUTE)
    if route is not None and route.strip() and route.strip().lower() not in TQ_VERIFY_ROUTES:
        out.append(f"{TQ_VERIFY_ROUTE}={route!r} is not one of {'|'.join(TQ_VERIFY_ROUTES)}")
    cpu_path = env.get(FORCED_CPU_PATH)
    if cpu_path is not None and cpu_path not in ("avx512bf16", "no-avx512bf16"):
        out.append(f"{FORCED_CPU_PATH}={cpu_path!r} is not avx512bf16|no-avx512bf16 (set by verify's "
                   "force_no_avx512bf16 folder, not by hand)")
    return out


def tq_verify_route(env: Mapping[str, str] | None = None) -> str:
    """``kernel`` (unset, empty or bad: :func:`problems` reports a bad value) or ``upstream_rows``."""
    raw = (os.environ if env is None else env).get(TQ_VERIFY_ROUTE, "").strip().lower()
    return raw if raw in TQ_VERIFY_ROUTES else "kernel"


def load_check_mode(env: Mapping[str, str] | None = None) -> str:
    """``error`` (unset, empty or bad: :func:`problems` reports a bad value), ``warn`` or ``off``."""
    raw = (os.environ if env is None else env).get(LOAD_CHECK, "").strip().lower()
    return raw if raw in LOAD_CHECK_MODES else "error"


def variable_of(problem: str) -> str:
    """The variable a :func:`problems` message is about (each one starts with its name)."""
    m = re.match(r"VLLM_PLATFORM_EXT_[A-Za-z0-9_]*", problem)
    return m.group(0) if m else "switches"


def check(env: Mapping[str, str] | None, groups: Sequence[str]) -> None:
    """Raise :class:`SwitchError` listing every bad switch."""
    found = problems(env, groups)
    if found:
        raise SwitchError(found)
