"""Derive the compat schema table of a vLLM line from that line's own wheel, and fetch the wheels
the tables were derived from.

    python ci/tools/compat_tables.py generate 0.24.0 [0.25.0 ...]   # write compat/tables/vllm-0.24.json
    python ci/tools/compat_tables.py fetch                          # the wheels of every table, checked
    python ci/tools/compat_tables.py check                          # every table == its wheel

A table row is every ``torch.ops._C*`` op the line's Python touches at import time (the same
AST scan as for the installed vLLM: ``compat/scan.py``), with the schema string its kernel
library registers (read from the binary in the wheel, never loaded), and ``real`` where this
package has a torch kernel taking exactly those arguments, else ``stub``. Wheels are fetched
with ``pip download --no-deps`` (only the file; nothing is installed) into ``.cache/vllm-wheels``
(``VLLM_WHEEL_DIR`` overrides) and checked against the sha256 the table records.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from vllm_platform_ext.compat import registry, scan, schemas  # noqa: E402
from vllm_platform_ext.compat.schemas import REAL, STUB, OpSchema  # noqa: E402

WHEEL_DIR = pathlib.Path(os.environ.get("VLLM_WHEEL_DIR") or ROOT / ".cache" / "vllm-wheels")


def sha256(path: pathlib.Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def find_wheel(version: str, wheel_dir: pathlib.Path = WHEEL_DIR) -> pathlib.Path | None:
    found = sorted(wheel_dir.glob(f"vllm-{version}-*.whl")) if wheel_dir.is_dir() else []
    return found[-1] if found else None


def fetch(version: str, want_sha256: str | None = None, wheel_dir: pathlib.Path = WHEEL_DIR) -> pathlib.Path:
    wheel = find_wheel(version, wheel_dir)
    if wheel is None:
        wheel_dir.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:",
                        "--platform", "manylinux_2_28_x86_64", f"vllm=={version}", "-d", str(wheel_dir)], check=True)
        wheel = find_wheel(version, wheel_dir)
        if wheel is None:
            raise FileNotFoundError(f"pip download of vllm=={version} left no wheel in {wheel_dir}")
    if want_sha256 and sha256(wheel) != want_sha256:
        raise ValueError(f"{wheel} does not have the sha256 its table records ({want_sha256})")
    return wheel


def derive_rows(wheel: pathlib.Path) -> list[OpSchema]:
    """The table rows of the line whose wheel this is (see the module docstring)."""
    uses = scan.scan_wheel(wheel)
    library = scan.wheel_library_schemas(wheel)
    faked = {(u.namespace, u.op, u.overload or "default") for u in uses if u.kind == "fake"}
    rows, missing = [], []
    for ns, op, overload in sorted(scan.required_ops(uses)):
        full = op if overload == "default" else f"{op}.{overload}"
        text = library.get((ns, full))
        if text is None:
            missing.append(f"{ns}::{full}")
            continue
        row = OpSchema(text, STUB, namespace=ns, vllm_registers_fake=(ns, op, overload) in faked)
        rows.append(OpSchema(text, REAL if registry.real_kernel_fits(row) else STUB, namespace=ns,
                             vllm_registers_fake=row.vllm_registers_fake))
    if missing:
        raise LookupError(f"{wheel.name}: its Python touches {missing} at import, but its kernel libraries "
                          "register no such schema")
    return rows


def table_json(version: str, wheel: pathlib.Path, rows: list[OpSchema]) -> dict:
    return {
        "vllm": version,
        "wheel": wheel.name,
        "sha256": sha256(wheel),
        "derived_by": "ci/tools/compat_tables.py generate",
        "rows": [{"schema": r.schema, "namespace": r.namespace, "fallback": r.fallback,
                  "vllm_registers_fake": r.vllm_registers_fake} for r in rows],
    }


def cmd_generate(versions: list[str]) -> int:
    for version in versions:
        wheel = fetch(version)
        rows = derive_rows(wheel)
        path = schemas.TABLE_DIR / f"vllm-{version}.json"
        path.write_text(json.dumps(table_json(version, wheel, rows), indent=1) + "\n")
        print(f"{path.relative_to(ROOT)}: {len(rows)} rows from {wheel.name}")
    return 0


def cmd_fetch() -> int:
    for key, src in sorted(schemas.TABLE_SOURCES.items()):
        print(fetch(src["vllm"], src["sha256"]))
    return 0


def cmd_check() -> int:
    bad = 0
    for key, src in sorted(schemas.TABLE_SOURCES.items()):
        wheel = fetch(src["vllm"], src["sha256"])
        if derive_rows(wheel) != list(schemas.TABLES[key]):
            print(f"vllm-{src['vllm']}.json differs from what {wheel.name} gives: regenerate it")
            bad += 1
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate")
    g.add_argument("versions", nargs="+")
    sub.add_parser("fetch")
    sub.add_parser("check")
    a = ap.parse_args(argv)
    if a.cmd == "generate":
        return cmd_generate(a.versions)
    return cmd_fetch() if a.cmd == "fetch" else cmd_check()


if __name__ == "__main__":
    raise SystemExit(main())
