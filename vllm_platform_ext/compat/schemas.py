"""The versioned tables of ``torch.ops._C*`` schemas that vLLM's Python needs at import time.

One table per vLLM line (``tables/vllm-X.Y.Z.json``: 0.22-0.34, the MetaX lines 0.22-0.26 among them;
the newest patch release served of each minor when its table was derived; ``compat/lines.py`` reads them as
the list of kept lines),
each derived from that line's own wheel by ``ci/tools/compat_tables.py``:

* which ops: every ``torch.ops._C*.<op>.<overload>`` a vLLM module touches while it is being
  imported (``compat/scan.py``), plus the overload of every ``register_fake`` of such an op
  (defining ``scaled_fp4_quant.out`` makes ``hasattr(torch.ops._C, "scaled_fp4_quant")`` true,
  and ``vllm/_custom_ops.py`` then registers a fake for the default overload, which must exist);
* the schema string of each, as the line's kernel library registers it (read from the binary
  in the wheel; whitespace collapsed);
* ``real`` where this package has a torch kernel taking exactly those arguments, else ``stub``.

The table records the wheel's file name and sha256; ``tests/compat/test_compat_tables.py`` re-derives
every table from its wheel and fails on any difference. Adding a line: ``python
ci/tools/compat_tables.py generate X.Y.Z``.
"""
from __future__ import annotations

import json
import pathlib
from dataclasses import dataclass

# How a missing op gets a kernel when this package defines it:
REAL = "real"  # a torch implementation of vLLM's semantics (fallbacks.py / nvfp4.py)
STUB = "stub"  # schema + fake only; calling it on a device raises a clear error


@dataclass(frozen=True)
class OpSchema:
    schema: str  # exact text: "name[.overload](args) -> returns"
    fallback: str  # REAL or STUB
    namespace: str = "_C"
    # vLLM's _custom_ops registers its own fake for this op behind ``hasattr``. apply() imports
    # _custom_ops before defining anything, so that guard is already false for an op we add
    # and our fake is the only one (checked against vLLM's source by the schema test).
    vllm_registers_fake: bool = False

    @property
    def full_name(self) -> str:
        return self.schema.split("(", 1)[0].strip()

    @property
    def name(self) -> str:
        return self.full_name.split(".", 1)[0]

    @property
    def overload(self) -> str:
        """Overload name, ``"default"`` for the unnamed one."""
        parts = self.full_name.split(".", 1)
        return parts[1] if len(parts) == 2 else "default"

    @property
    def qualname(self) -> str:
        return f"{self.namespace}::{self.name}"

    @property
    def label(self) -> str:
        return f"{self.namespace}::{self.name}.{self.overload}"


TABLE_DIR = pathlib.Path(__file__).with_name("tables")


def _load_tables() -> tuple[dict[tuple[int, int], tuple[OpSchema, ...]], dict[tuple[int, int], dict]]:
    tables, sources = {}, {}
    for path in sorted(TABLE_DIR.glob("vllm-*.json")):
        data = json.loads(path.read_text())
        key = parse_version(data["vllm"])
        if key in tables:
            raise ValueError(f"two schema tables for vLLM {key[0]}.{key[1]}: {path.name} and {sources[key]['file']}")
        tables[key] = tuple(OpSchema(r["schema"], r["fallback"], r["namespace"], r["vllm_registers_fake"])
                            for r in data["rows"])
        sources[key] = {k: data[k] for k in ("vllm", "wheel", "sha256")} | {"file": path.name}
    return tables, sources


def parse_version(version: str) -> tuple[int, int]:
    parts = version.split("+", 1)[0].split(".")
    try:
        return int(parts[0]), int("".join(ch for ch in parts[1] if ch.isdigit()) or 0)
    except (IndexError, ValueError):
        raise ValueError(f"cannot read a vLLM version from {version!r}") from None


# (major, minor) of vLLM -> rows, and where each table came from
TABLES, TABLE_SOURCES = _load_tables()


def table_for(version: str) -> tuple[tuple[int, int], tuple[OpSchema, ...], str]:
    """Rows for vLLM ``version``: ``(table key, rows, note)``.

    An unlisted version gets the newest table not newer than it (else the oldest); the note
    says so, so that doctor shows it.
    """
    want = parse_version(version)
    if want in TABLES:
        return want, TABLES[want], f"schema table {want[0]}.{want[1]}"
    older = [k for k in TABLES if k <= want]
    key = max(older) if older else min(TABLES)
    return key, TABLES[key], (
        f"no schema table for vLLM {version}; using the {key[0]}.{key[1]} table "
        "(derive one: python ci/tools/compat_tables.py generate <version>)"
    )
