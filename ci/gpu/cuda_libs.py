"""Which CUDA library wheels a carried torch needs that the GPU machine's own cannot serve.

The GPU machine has torch 2.11.0+cu130 and the CUDA 13 ``nvidia-*`` wheels that torch pins. A
vLLM line pinning another torch (0.32: 2.13.0, 0.33: 2.14.0) carries its torch, and with it only
the CUDA wheels the machine's cannot stand in for. The decision, per package of the carried
torch's CUDA closure (``nvidia-*``, ``cuda-*``), is made from the binaries, not from the pins:

* the same version on the machine: served;
* a runtime rule of the consumer refuses the machine's version (:data:`RUNTIME_RULES`: torch
  raises on a cuDNN whose minor version is older than its build's): carried;
* otherwise every dynamic symbol that a carried binary (torch, vLLM, torchvision, ... and any
  carried CUDA library, to a fixed point) takes from one of the package's libraries must be
  defined by the machine's version of that library (same soname; same symbol version where the
  reference is versioned, e.g. ``cublasLtMatmul@libcublasLt.so.13``; by name where it is not,
  as for NCCL and cuSPARSELt): served if so, carried (with the missing symbols named) if not.

Python loads extension modules with ``RTLD_NOW`` and torch's ``ctypes.CDLL`` does too, so one
missing strong symbol fails ``import torch``; weak references are optional and not counted.
Libraries are read with ``readelf -W --dyn-syms -d -V`` (binutils); :func:`parse_readelf` reads
that text, so the decision is tested on captured fixtures without the wheels.
"""
from __future__ import annotations

import re
import subprocess
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

CUDA_PREFIXES = ("nvidia-", "cuda-")


def _minor_not_older(need: str, have: str) -> str | None:
    n, h = [int(x) for x in need.split(".")[:2]], [int(x) for x in have.split(".")[:2]]
    if h[0] != n[0] or h[1] < n[1]:
        return (f"torch.backends.cudnn refuses a runtime cuDNN {h[0]}.{h[1]} for a build against {n[0]}.{n[1]} "
                f"(same major, runtime minor >= build minor)")
    return None


# package -> rule(needed version, machine version) -> why the machine's cannot serve, or None
RUNTIME_RULES = {"nvidia-cudnn-cu13": _minor_not_older, "nvidia-cudnn-cu12": _minor_not_older}


@dataclass
class Elf:
    path: str
    soname: str | None = None
    needed: tuple = ()
    defined: frozenset = frozenset()  # "name" and "name@VERSION" of every global definition
    undefined: frozenset = frozenset()  # (name, version or None) of every strong undefined reference
    verneed: dict = field(default_factory=dict)  # version name -> the file (soname) it is needed from

    def defines(self, name: str, version: str | None) -> bool:
        return (f"{name}@{version}" if version else name) in self.defined


_DYN = re.compile(r"\((NEEDED|SONAME)\)\s+.*\[(.+)\]")
_SYM = re.compile(r"^\s*\d+:\s+[0-9a-fA-F]+\s+\S+\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)")


def parse_readelf(text: str, path: str = "") -> Elf:
    """An :class:`Elf` from ``readelf -W --dyn-syms -d -V`` output."""
    soname, needed, defined, undefined, verneed = None, [], set(), set(), {}
    section, vfile = None, None
    for line in text.splitlines():
        if line.startswith("Dynamic section"):
            section = "dyn"
        elif line.startswith("Symbol table '.dynsym'"):
            section = "sym"
        elif line.startswith("Version needs section"):
            section = "verneed"
        elif line.startswith(("Version symbols section", "Version definition section", "Symbol table '")):
            section = None
        elif section == "dyn":
            m = _DYN.search(line)
            if m and m.group(1) == "NEEDED":
                needed.append(m.group(2))
            elif m:
                soname = m.group(2)
        elif section == "sym":
            m = _SYM.match(line)
            if not m:
                continue
            bind, ndx, name = m.group(2), m.group(4), m.group(5)
            if bind == "LOCAL" or not name:
                continue
            if ndx == "UND":
                if bind == "WEAK":
                    continue
                base, _, ver = name.partition("@")
                undefined.add((base, ver or None))
            else:
                base, _, ver = name.partition("@")
                ver = ver.lstrip("@")
                defined.add(base)
                if ver:
                    defined.add(f"{base}@{ver}")
        elif section == "verneed":
            m = re.search(r"File:\s+(\S+)", line)
            if m:
                vfile = m.group(1)
                continue
            m = re.search(r"Name:\s+(\S+)", line)
            if m and vfile:
                verneed[m.group(1)] = vfile
    return Elf(path, soname, tuple(needed), frozenset(defined), frozenset(undefined), verneed)


def read_elf(path: Path) -> Elf:
    out = subprocess.run(["readelf", "-W", "--dyn-syms", "-d", "-V", str(path)], check=True,
                         capture_output=True, text=True).stdout
    return parse_readelf(out, str(path))


def is_library(member: str) -> bool:
    name = member.rsplit("/", 1)[-1]
    return not member.endswith("/") and (name.endswith(".so") or ".so." in name)


def wheel_elfs(wheel: Path) -> list[Elf]:
    """Every shared library inside a wheel, read with readelf (one member at a time)."""
    out = []
    with zipfile.ZipFile(wheel) as z, tempfile.TemporaryDirectory() as tmp:
        for info in z.infolist():
            if not is_library(info.filename):
                continue
            with z.open(info) as f:
                if f.read(4) != b"\x7fELF":
                    continue
            p = Path(tmp) / "lib"
            with z.open(info) as src, open(p, "wb") as dst:
                while chunk := src.read(1 << 24):
                    dst.write(chunk)
            elf = read_elf(p)
            elf.path = f"{wheel.name}:{info.filename}"
            if elf.soname is None:
                elf.soname = info.filename.rsplit("/", 1)[-1]
            out.append(elf)
    return out


def symbols_taken(consumer: Elf, libs: dict) -> dict:
    """soname -> {(name, version)} that ``consumer`` takes from each library in ``libs`` (soname ->
    Elf, the versions the carried torch was built with). A versioned reference names its file;
    an unversioned one binds to the first library defining it, the consumer's own NEEDED first."""
    taken: dict = {}
    order = [s for s in consumer.needed if s in libs] + [s for s in libs if s not in consumer.needed]
    for name, ver in consumer.undefined:
        if ver is not None:
            f = consumer.verneed.get(ver)
            if f in libs:
                taken.setdefault(f, set()).add((name, ver))
            continue
        for soname in order:
            if libs[soname].defines(name, None):
                taken.setdefault(soname, set()).add((name, None))
                break
    for soname in consumer.needed:  # a NEEDED library must exist even where no symbol is taken
        if soname in libs:
            taken.setdefault(soname, set())
    return taken


@dataclass
class Decision:
    package: str
    need: str
    have: str | None
    served: bool
    reason: str
    rule_only: bool = False  # refused by a runtime rule alone: the machine's defines every symbol taken

    def as_dict(self) -> dict:
        out = {"need": self.need, "machine": self.have, "served": self.served, "reason": self.reason}
        return {**out, "rule_only": True} if self.rule_only else out


def decide(need: dict, have: dict, new_libs: dict, old_libs: dict, consumers: list) -> dict:
    """package -> :class:`Decision`.

    ``need``/``have``: package -> version in the carried torch's CUDA closure / on the machine;
    ``new_libs``/``old_libs``: package -> [Elf] of the needed / the machine's version (only the
    packages whose versions differ need them); ``consumers``: the carried binaries (torch, vLLM,
    ...). Carried packages' own libraries become consumers in turn, until nothing changes. A
    package a runtime rule refuses is carried; its symbols are checked all the same and reported."""
    out: dict = {}
    todo, ruled = [], {}
    for pkg, ver in sorted(need.items()):
        old = have.get(pkg)
        if old == ver:
            out[pkg] = Decision(pkg, ver, old, True, "same version on the machine")
        elif old is None:
            out[pkg] = Decision(pkg, ver, None, False, "not on the machine")
        elif not new_libs.get(pkg):
            out[pkg] = Decision(pkg, ver, old, False, "no shared libraries to check (metadata or Python only): carried")
        else:
            todo.append(pkg)
            rule = RUNTIME_RULES.get(pkg)
            if rule and rule(ver, old):
                ruled[pkg] = rule(ver, old)
                out[pkg] = Decision(pkg, ver, old, False, ruled[pkg])
    changed = True
    while changed:
        changed = False
        carried = [p for p, d in out.items() if not d.served]
        users = list(consumers) + [e for p in carried for e in new_libs.get(p, ())]
        for pkg in todo:
            if pkg in out and not out[pkg].served and pkg not in ruled:
                continue
            own = {id(e) for e in new_libs[pkg]}  # a package's libraries come (or stay) together
            problems, nsyms, libs = _symbol_problems(pkg, have[pkg], new_libs[pkg], old_libs.get(pkg, ()),
                                                     [u for u in users if id(u) not in own])
            abi = "; ".join(problems) if problems else (
                f"the machine's {have[pkg]} defines all {nsyms} symbol(s) the carried binaries take from "
                f"{', '.join(libs)}" if nsyms else f"no carried binary takes a symbol from {', '.join(libs)}")
            if pkg in ruled:
                out[pkg] = Decision(pkg, need[pkg], have[pkg], False, f"{ruled[pkg]}; symbols: {abi}", not problems)
            elif problems:
                out[pkg] = Decision(pkg, need[pkg], have[pkg], False, abi)
                changed = True
            else:
                out[pkg] = Decision(pkg, need[pkg], have[pkg], True, abi)
    return dict(sorted(out.items()))


def _symbol_problems(pkg: str, have: str, new: list, old: list, users: list) -> tuple[list, int, list]:
    """What the machine's ``old`` libraries of ``pkg`` lack of what ``users`` take from ``new``."""
    libs = {e.soname: e for e in new}
    machine = {e.soname: e for e in old}
    problems, nsyms = [], 0
    for user in users:
        who = user.path.split(":")[-1].rsplit("/", 1)[-1]
        for soname, syms in symbols_taken(user, libs).items():
            nsyms += len(syms)
            lib = machine.get(soname)
            if lib is None:
                problems.append(f"{soname} (needed by {who}) is not in the machine's {pkg} {have}")
                continue
            missing = sorted(f"{n}@{v}" if v else n for n, v in syms if not lib.defines(n, v))
            if missing:
                problems.append(f"{soname} {have} lacks {len(missing)} symbol(s) {who} takes: "
                                f"{', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''}")
    return list(dict.fromkeys(problems)), nsyms, sorted(libs)
