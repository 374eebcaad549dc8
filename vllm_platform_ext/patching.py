"""The one patch primitive of the plugin.

A :class:`Patch` replaces one attribute (``"package.module:Class.attr"``) in memory. Rules:

* the target must exist, else :class:`PatchTargetMissing`. A group's ``skip_if`` probe decides
  first whether the fix is needed on this vLLM; a missing target of a group the probe calls
  needed is reported *failed* (a renamed target must not silently lose the fix and still read
  "0 failed"), while "not needed" stays a skip with the probe's reason;
* the original is kept (:func:`original`) and can be put back (:func:`restore`);
* patching a target twice is an error (:class:`PatchConflict`);
* a group of patches applies whole or not at all: every target is resolved and checked
  before the first is set, and a failure while setting rolls back what was set;
* nothing is written to files: only module and class attributes change, in this process.

``staticmethod``/``classmethod`` targets keep their kind: the replacement factory gets the
underlying function and its result is wrapped again.
"""
from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from vllm_platform_ext.report import Report

MARK = "__vllm_platform_ext_patch__"
from vllm_platform_ext.envs import DISABLE as DISABLE_ENV  # comma-separated patch-group names
from vllm_platform_ext.envs import STRICT as STRICT_ENV
from vllm_platform_ext.envs import parse_bool


class PatchError(RuntimeError):
    pass


class PatchTargetMissing(PatchError):
    pass


class PatchConflict(PatchError):
    pass


def disabled_groups() -> set[str]:
    """The names of ``VLLM_PLATFORM_EXT_DISABLE`` (``switches.problems`` rejects unknown ones)."""
    return {n.strip() for n in os.environ.get(DISABLE_ENV, "").split(",") if n.strip()}


def strict_mode() -> bool:
    return parse_bool(STRICT_ENV, False)


@dataclass(frozen=True)
class Patch:
    """Replace ``target`` with ``factory(original)``.

    ``add_missing``: the attribute must NOT exist yet (its owner must); it is added as
    ``factory(None)`` and removed again by :func:`restore`. For fields a vLLM line dropped while
    other code still reads them; the group's ``skip_if`` says "not needed" where it exists."""

    target: str  # "package.module:Attr" or "package.module:Class.attr"
    factory: Callable[[Any], Any]
    add_missing: bool = False


@dataclass(frozen=True)
class PatchGroup:
    """Patches that only make sense together, with the reason they exist.

    ``build`` is called at apply time (it may import vLLM); ``skip_if`` returns a reason
    when the group is not needed on this vLLM (e.g. upstream already has the fix).
    ``upstream`` names the upstream issue/PR and its status; ``retire`` says which probe (or
    which upstream change) retires the group. ``doctor`` prints all three for every group.
    ``targets``: every ``package.module:Attr`` the group may patch on a line served, named without
    importing vLLM (the ledger, ``patch/README.md``); ``build`` picks this line's among them (a
    vendor's copy of a patched class, which a group lands on at run time, is not listed).
    """

    name: str
    why: str
    build: Callable[[], Sequence[Patch]]
    skip_if: Callable[[], str | None] = lambda: None
    upstream: str = ""
    retire: str = ""
    targets: tuple[str, ...] = ()


@dataclass
class _Applied:
    group: str
    target: str
    owner: Any
    attr: str
    raw: Any  # the attribute as stored on the owner (descriptor included)
    owned: bool  # was the attribute defined on the owner itself (not inherited)?


_APPLIED: dict[str, _Applied] = {}
_ABSENT = object()  # the "original" of an attribute a patch added


def resolve(target: str, attr_may_be_missing: bool = False) -> tuple[Any, str]:
    """Return ``(owner, attribute name)`` of ``target``; raise :class:`PatchTargetMissing`."""
    module_name, sep, path = target.partition(":")
    if not sep or not path:
        raise PatchError(f"patch target {target!r} must look like 'package.module:Attr[.attr]'")
    try:
        owner: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise PatchTargetMissing(f"{target}: module {module_name} cannot be imported ({exc})") from exc
    *parents, attr = path.split(".")
    walked = module_name
    for part in parents:
        walked += "." + part if walked != module_name else ":" + part
        if not hasattr(owner, part):
            raise PatchTargetMissing(f"{target}: {walked} does not exist")
        owner = getattr(owner, part)
    if not attr_may_be_missing and not hasattr(owner, attr):
        raise PatchTargetMissing(f"{target}: attribute {attr!r} does not exist on {owner!r}")
    return owner, attr


def _raw(owner: Any, attr: str) -> tuple[Any, bool]:
    own = vars(owner) if hasattr(owner, "__dict__") else {}
    if attr in own:
        return own[attr], True
    if isinstance(owner, type):
        for klass in owner.__mro__[1:]:
            if attr in vars(klass):
                return vars(klass)[attr], False
    return getattr(owner, attr), False


def _make(factory: Callable[[Any], Any], raw: Any) -> Any:
    for kind in (staticmethod, classmethod):
        if isinstance(raw, kind):
            new = factory(raw.__func__)
            return new if isinstance(new, kind) else kind(new)
    return factory(raw)


def _mark(obj: Any, group: str) -> None:
    fn = obj.__func__ if isinstance(obj, (staticmethod, classmethod)) else obj
    try:
        setattr(fn, MARK, group)
    except (AttributeError, TypeError):
        pass


def carries(cls: type, attr: str, group: str) -> bool:
    """``cls.attr`` (own or inherited, read without binding) is already ``group``'s replacement:
    how a group that lands on several classes (vendor copies of a backend) skips one it reached."""
    import inspect

    raw = inspect.getattr_static(cls, attr, None)
    return getattr(getattr(raw, "__func__", raw), MARK, None) == group


def apply(group: str, patches: Sequence[Patch]) -> list[str]:
    """Apply ``patches`` as one unit named ``group``; return the patched targets."""
    plan = []
    seen = set()
    for p in patches:
        if p.target in _APPLIED:
            raise PatchConflict(f"{p.target} is already patched by {_APPLIED[p.target].group!r}")
        if p.target in seen:
            raise PatchConflict(f"{p.target} appears twice in patch group {group!r}")
        seen.add(p.target)
        owner, attr = resolve(p.target, attr_may_be_missing=p.add_missing)
        if p.add_missing:
            if hasattr(owner, attr):
                raise PatchConflict(f"{p.target} exists: a patch that adds a missing attribute does not replace it")
            raw, owned = _ABSENT, True
        else:
            raw, owned = _raw(owner, attr)
        plan.append((p, owner, attr, raw, owned))
    # Build every replacement before touching anything, so a factory error leaves no trace.
    built = [(p, owner, attr, raw, owned, p.factory(None) if p.add_missing else _make(p.factory, raw))
             for p, owner, attr, raw, owned in plan]
    done: list[_Applied] = []
    try:
        for p, owner, attr, raw, owned, new in built:
            _mark(new, group)
            setattr(owner, attr, new)
            rec = _Applied(group, p.target, owner, attr, raw, owned)
            _APPLIED[p.target] = rec
            done.append(rec)
    except BaseException:
        for rec in reversed(done):
            _undo(rec)
        raise
    return [p.target for p in patches]


def _undo(rec: _Applied) -> None:
    if rec.raw is _ABSENT:
        delattr(rec.owner, rec.attr)
    elif rec.owned:
        setattr(rec.owner, rec.attr, rec.raw)
    else:
        delattr(rec.owner, rec.attr)
    _APPLIED.pop(rec.target, None)


def original(target: str) -> Any:
    """The attribute that ``target`` held before it was patched (descriptor included)."""
    try:
        raw = _APPLIED[target].raw
    except KeyError:
        raise PatchError(f"{target} is not patched") from None
    if raw is _ABSENT:
        raise PatchError(f"{target} was added by the patch: it had no original")
    return raw


def is_patched(target: str) -> bool:
    return target in _APPLIED


def applied_targets(group: str | None = None) -> list[str]:
    return [t for t, r in _APPLIED.items() if group is None or r.group == group]


def group_of(target: str) -> str | None:
    """The group whose patch holds ``target``, None where it is not patched."""
    rec = _APPLIED.get(target)
    return rec.group if rec else None


def restore(group: str) -> list[str]:
    """Undo every patch of ``group``; return the targets restored."""
    recs = [r for r in _APPLIED.values() if r.group == group]
    for rec in reversed(recs):
        _undo(rec)
    return [r.target for r in recs]


def restore_all() -> None:
    for rec in reversed(list(_APPLIED.values())):
        _undo(rec)


def apply_group(group: PatchGroup, report: Report, step: str = "patch") -> bool:
    """Apply ``group`` and record the outcome in ``report``. Returns True when applied.

    ``skip_if`` reasons (the group's probe: not needed / not applicable here) and
    ``VLLM_PLATFORM_EXT_DISABLE`` are reported as skipped. Past the probe the fix is needed, so
    a missing target is *failed* ("needed but target missing"), as is any other error. Strict
    mode raises after recording a failure.
    """
    strict = strict_mode()
    if group.name in disabled_groups():
        report.skipped(step, group.name, f"disabled by {DISABLE_ENV}")
        return False
    try:
        reason = group.skip_if()
        if reason:
            report.skipped(step, group.name, reason)
            return False
        targets = apply(group.name, list(group.build()))
    except PatchTargetMissing as exc:
        report.failed(step, group.name, f"needed (its probe gave no reason to skip) but target missing: {exc}")
        if strict:
            raise
        return False
    except Exception as exc:
        report.failed(step, group.name, f"{type(exc).__name__}: {exc}")
        if strict:
            raise
        return False
    report.applied(step, group.name, f"{group.why} [{', '.join(targets)}]")
    return True
