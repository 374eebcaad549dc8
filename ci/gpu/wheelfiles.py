"""Wheel files for ci/gpu/bundle.py: empty stub wheels, requirements, stripping, re-storing."""
from __future__ import annotations

import copy
import re
import zipfile
from pathlib import Path


def canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def stub_wheel(out_dir: Path, name: str, version: str) -> Path:
    """An empty wheel ``name==version+stub``: satisfies ``name==version`` pins, holds nothing."""
    dist = re.sub(r"[-.]+", "_", canon(name))
    ver = f"{version}+stub"
    info = f"{dist}-{ver}.dist-info"
    files = {f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {ver}\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: vllm-platform-ext\nRoot-Is-Purelib: true\n"
                              "Tag: py3-none-any\n"}
    files[f"{info}/RECORD"] = "".join(f"{n},,\n" for n in files) + f"{info}/RECORD,,\n"
    path = out_dir / f"{dist}-{ver}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for n, text in files.items():
            z.writestr(n, text)
    return path


def wheel_requirements(wheel: Path) -> list[str]:
    """The unconditional-extra ``Requires-Dist`` lines of a wheel's METADATA."""
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        lines = z.read(meta).decode().splitlines()
    return [l.split(":", 1)[1].strip() for l in lines
            if l.startswith("Requires-Dist:") and "extra ==" not in l]


def pinned_version(requirement: str) -> str | None:
    """``X`` of an ``==X`` / ``>=X`` specifier (the version a stub must claim), else None."""
    for op in ("==", ">="):
        m = re.search(re.escape(op) + r"\s*([0-9][0-9A-Za-z.]*)", requirement)
        if m:
            return m.group(1).rstrip(".")
    return None


def strip_wheel(src: Path, dst: Path, prefixes: tuple) -> list[str]:
    """Copy a wheel without the members under ``prefixes``; RECORD rewritten to match."""
    removed = []
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zout:
        record = next(n for n in zin.namelist() if n.endswith(".dist-info/RECORD"))
        for info in zin.infolist():
            if info.filename.startswith(prefixes):
                removed.append(info.filename)
                continue
            if info.filename == record:
                continue
            zout.writestr(info, zin.read(info.filename))
        kept = [l for l in zin.read(record).decode().splitlines()
                if l and not l.split(",", 1)[0].startswith(prefixes)]
        zout.writestr(record, "\n".join(kept) + "\n")
    return removed


def restore(src: Path, dst: Path, compression: int = zipfile.ZIP_STORED) -> None:
    """Copy a wheel's members unchanged into a zip of another compression (RECORD hashes are
    over the members' bytes, so the wheel stays valid)."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", compression) as zout:
        for info in zin.infolist():
            data = zin.read(info.filename)
            out = copy.copy(info)
            out.compress_type = compression
            zout.writestr(out, data)
