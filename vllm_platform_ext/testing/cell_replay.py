"""Audit a cell run's engine tokens again, on any machine: the GPU run's verdict without device time.

Every cell run (``cells.run_cells`` with a log folder) keeps ``engine-logs/runs.json``: the prompts,
each engine's generated ids and counters, and a digest of each kit checkpoint's tensors. The kit
models are deterministic (seeded), so this module writes them again here, refuses to go on if a
tensor differs from the GPU run's checkpoint, and runs the same float32 audit and judgement
(:func:`cell_judge.audit_cells`). Made after the 2026-11-28 window, where vLLM 0.26's engines all ran
but the reference audit on the GPU machine's CPU outlasted the session's device time::

    python -m vllm_platform_ext.testing.cell_replay DIR/engine-logs/runs.json --out DIR2
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import threading
from dataclasses import asdict, fields
from pathlib import Path

from vllm_platform_ext.testing import cell_tokens
from vllm_platform_ext.testing.cell_judge import audit_cells
from vllm_platform_ext.testing.cell_suites import Cell
from vllm_platform_ext.testing.cells_report import report
from vllm_platform_ext.testing.engine import EngineRun
from vllm_platform_ext.testing.recall_weights import checkpoint_digest  # noqa: F401 (cell_replay.checkpoint_digest)
from vllm_platform_ext.testing.tiny_models import make_tiny_model

FORMAT = 1


def save_runs(path: Path, models: dict, prompts: list, max_tokens: int, dims: str, runs: dict, spread_runs: dict,
              checkpoints: dict | None = None, pending: int = 0, kit: str = "random") -> Path:
    """Write ``runs.json`` (``models``: kind -> checkpoint dir; ``runs``/``spread_runs``: Cell -> EngineRun;
    ``checkpoints``: their digests, when known; ``pending``: engines of the run not finished yet)."""
    data = {"format": FORMAT, "dims": dims, "kit": kit, "prompts": prompts, "max_tokens": max_tokens, "pending": pending,
            "checkpoints": checkpoints or {kind: checkpoint_digest(p) for kind, p in models.items()},
            "runs": [{"cell": asdict(c), "run": asdict(r)} for c, r in runs.items()],
            "spread": [{"cell": asdict(c), "run": asdict(r)} for c, r in spread_runs.items()]}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)  # a reader (a device window's pack) never sees half a file
    return path


class RunsFile:
    """``runs.json`` written again as each engine finishes (``add``), so that a run cut short -- a device
    window's time ran out while the last engines or the reference still ran (window 9) -- can still be
    audited here; ``finish`` writes the whole run in the cells' order."""

    def __init__(self, path: Path, models: dict, prompts: list, max_tokens: int, dims: str, engines: int,
                 kit: str = "random"):
        self.path, self.models, self.prompts, self.max_tokens, self.dims = Path(path), models, prompts, max_tokens, dims
        self.kit = kit
        self.engines, self.done, self.lock, self.digests = engines, {}, threading.Lock(), None

    def _save(self, runs: dict, spread_runs: dict, pending: int) -> None:
        self.digests = self.digests or {kind: checkpoint_digest(p) for kind, p in self.models.items()}
        save_runs(self.path, self.models, self.prompts, self.max_tokens, self.dims, runs, spread_runs,
                  checkpoints=self.digests, pending=pending, kit=self.kit)

    def add(self, cell, spread_run: bool, run) -> None:
        with self.lock:
            self.done[(cell, spread_run)] = run
            self._save({c: r for (c, s), r in self.done.items() if not s}, {c: r for (c, s), r in self.done.items() if s},
                       self.engines - len(self.done))

    def finish(self, runs: dict, spread_runs: dict) -> None:
        with self.lock:
            self._save(runs, spread_runs, 0)


def load_runs(path: Path) -> tuple[dict, dict, dict]:
    """(data, runs, spread_runs) of a ``runs.json``."""
    data = json.loads(Path(path).read_text())
    if data.get("format") != FORMAT:
        raise ValueError(f"{path}: runs.json format {data.get('format')!r}, this reads {FORMAT}")
    known = {f.name for f in fields(EngineRun)}

    def rebuild(items):
        return {Cell(**i["cell"]): EngineRun(**{k: v for k, v in i["run"].items() if k in known}) for i in items}

    return data, rebuild(data["runs"]), rebuild(data["spread"])


def replay(path: Path, work: Path, reference_python: str | None = None, log=print,
           tokens_path: Path | None = None) -> list:
    """The cells of ``runs.json`` audited and judged here; raises ``ValueError`` naming the kit model
    whose checkpoint, written again here, differs from the one the engines ran. ``tokens_path``: the
    token sidecar of these results to write (:mod:`.cell_tokens`; its bf16 floor is this host's)."""
    data, runs, spread_runs = load_runs(path)
    models = {}
    for kind, digest in sorted(data["checkpoints"].items()):
        models[kind] = make_tiny_model(kind, Path(work) / kind, dims=data["dims"], target=data.get("kit", "random"))
        here = checkpoint_digest(models[kind])
        if here != digest:
            raise ValueError(f"kit model {kind} ({data['dims']} dims) written here differs from the run's "
                             f"checkpoint (sha256 {here[:12]} here, {digest[:12]} there): its audit would not be "
                             "of the weights the engines ran")
    log(f"[replay] {len(runs)} cells, {len(spread_runs)} spread runs; checkpoints match: {', '.join(models)}")
    if data.get("pending"):  # a missing engine can make a verdict stricter, never looser
        log(f"[replay] a partial run: {data['pending']} engine(s) had not finished; a speculative cell whose plain "
            "cell had not is judged against the bf16 floor alone, a batch-floor family's plugin cells whose spread "
            "run had not fail as unchecked")
    with cell_tokens.FloorTokens() as floors:
        results = audit_cells(list(runs), models, {}, runs, spread_runs, data["prompts"], data["max_tokens"],
                              log=log, reference_python=reference_python, kit=data.get("kit", "random"))
    if tokens_path is not None:
        cell_tokens.write(tokens_path, cell_tokens.build(results, models, runs, spread_runs, data["prompts"],
                                                         data["max_tokens"], data["dims"], floors, data["checkpoints"],
                                                         kit=data.get("kit", "random")))
    return results


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", type=Path, help="engine-logs/runs.json of a cell run")
    ap.add_argument("--out", type=Path, required=True,
                    help="results.json / results.md / results.tokens.json of the audit made here")
    ap.add_argument("--rejudge", type=Path, default=None, metavar="RESULTS_JSON",
                    help="no new audit: judge the run's results.json again from its records under today's rule "
                         "(cell_judge.rejudge), writing results.json / results.md to --out")
    a = ap.parse_args(argv)
    if not a.runs.is_file():
        ap.error(f"{a.runs}: no such file (a cell run's engine-logs/runs.json)")
    if a.rejudge is not None:
        from vllm_platform_ext.testing.cell_judge import rejudge

        data = json.loads(a.runs.read_text())
        runs = {Cell(**e["cell"]).id: EngineRun(**e["run"]) for e in data["runs"]}
        spread = {Cell(**e["cell"]).id: EngineRun(**e["run"]) for e in data.get("spread", [])}
        results = rejudge(json.loads(a.rejudge.read_text()), runs, spread, kit=data.get("kit", "random"))
        return report(results, a.out, "re-judged from the records: {n} cells")
    with tempfile.TemporaryDirectory(prefix="vpe-replay-") as tmp:
        results = replay(a.runs, Path(tmp), log=lambda s: print(s, file=sys.stderr, flush=True),
                         tokens_path=cell_tokens.sidecar_path(Path(a.out) / "results.json"))
    return report(results, a.out, "replayed: {n} cells")


if __name__ == "__main__":
    raise SystemExit(main())
