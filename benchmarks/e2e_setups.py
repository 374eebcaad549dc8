"""The end-to-end benchmark's configurations (A, B, B-off, C, C0, D, D0, R, E: ``e2e_spec_decode.py``'s
docstring says what each is): a ``Setup`` per engine, and the setups each named configuration tries
in order. Read by the driver (``e2e_spec_decode.py``, ``e2e_paired.py``) and the tables
(``e2e_report.py``)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Setup:
    name: str
    mode: str = "base"
    k: int = 0
    kv: str = "auto"
    graphs: str = "full_and_piecewise"
    plugin: bool = True
    env: tuple = ()  # (name, value) pairs the engine process gets


def setups(names: list[str], graphs: str) -> list[list[Setup]]:
    """Each entry: the setups to try in order (the first that runs counts; D tries three)."""
    g = graphs
    table = {
        "A": [Setup("A", graphs=g)],
        "B": [Setup("B", "mtp", 3, graphs=g)],
        "B-off": [Setup("B-off", "mtp", 3, graphs=g, plugin=False)],
        "C": [Setup("C", "mtp", 3, "turboquant_k8v4", g)],
        "D": [Setup("D", "mtp", 3, "turboquant_k8v4", mode_g, plugin=False)
              for mode_g in dict.fromkeys((g, "piecewise", "eager"))]
             + [Setup("D", "base", 0, "turboquant_k8v4", g, plugin=False)],  # none starts: no speculation
        # D where upstream's TurboQuant + MTP is known not to start (0.24+: 'Unknown TurboQuant cache
        # dtype', results/gpu/2026-11-28-0.26.0-audited-core-serve-e2e/2026-11-28-0.26.0-core-tq-audited.md): straight to no speculation
        "D0": [Setup("D", "base", 0, "turboquant_k8v4", g, plugin=False)],
        # C with vLLM PR #40914's routing of the verify (its decode kernel on B x (K+1) synthetic rows)
        "R": [Setup("R", "mtp", 3, "turboquant_k8v4", g, env=(("VLLM_PLATFORM_EXT_TQ_VERIFY_ROUTE", "upstream_rows"),))],
        # C without speculation: TurboQuant plain decode with the plugin, against A (issue 53: 55K context)
        "C0": [Setup("C0", "base", 0, "turboquant_k8v4", g)],
        "E": [Setup("E-4bit_nc", "mtp", 3, "turboquant_4bit_nc", g)],
        "E3": [Setup("E-3bit_nc", "mtp", 3, "turboquant_3bit_nc", g)],
    }
    out = []
    for n in names:
        if n not in table:
            raise SystemExit(f"unknown configuration {n!r}; choose from {sorted(table)}")
        out.append(table[n])
        if n == "E":
            out.append(table["E3"])
    return out
