"""Timing and reporting shared by every benchmark in this folder.

* :func:`graph_ms` / :func:`eager_ms`: medians from ``triton.testing.do_bench_cudagraph`` (the
  kernel benchmarks: host overhead removed, as vLLM runs them under CUDA graphs) and
  ``do_bench`` (paths vLLM runs eagerly), after one warm-up call.
* :func:`copy_bandwidth`: device-to-device copy bandwidth measured in the same run, the HBM
  bound the kernel benchmarks compare with.
* :func:`run_header`: date, host, device, versions and the command of a run; :func:`write_result`
  writes one result as Markdown (header first) and the same data as JSON beside it.
* :func:`markdown_table`: rows of dicts as a Markdown table.

Imports torch lazily: the reporting part runs (and is tested) on a CPU-only machine.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from vllm_platform_ext.detect import installed_versions


def graph_ms(fn: Callable[[], Any], rep: int = 30) -> float:
    """Median time of ``fn`` in ms, replayed in a CUDA graph (``do_bench_cudagraph``)."""
    import torch
    from triton.testing import do_bench_cudagraph

    fn()
    torch.cuda.synchronize()
    return float(do_bench_cudagraph(fn, rep=rep, return_mode="median"))


def eager_ms(fn: Callable[[], Any], warmup: int = 10, rep: int = 50) -> float:
    """Median time of ``fn`` in ms, launched eagerly (``do_bench``: host time included)."""
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))


def copy_bandwidth(nbytes: int = 2 << 30) -> float:
    """Bytes per second of a device-to-device copy (read + write counted)."""
    import torch

    x = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    t = eager_ms(lambda: y.copy_(x))
    del x, y
    return 2 * nbytes / (t * 1e-3)


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=os.path.dirname(os.path.abspath(__file__)))
    except (OSError, subprocess.SubprocessError):
        out = None
    # a device window's tree has no .git: its stage script leaves the commit in VPE_COMMIT
    return (out.stdout.strip() if out is not None else "") or os.environ.get("VPE_COMMIT") or None


def run_header(command: Sequence[str] | None = None, **extra: Any) -> dict[str, Any]:
    """What a result must state: when, where, with which versions, by which command."""
    device = "cpu"
    try:
        import torch

        if torch.cuda.is_available():
            device = torch.cuda.get_device_name()
    except ImportError:
        pass
    cmd = list(command) if command is not None else [os.path.relpath(sys.argv[0])] + sys.argv[1:]
    head = {
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "host": platform.node(),
        "device": device,
        **installed_versions(),
        "commit": _git_commit(),
        "command": shlex.join(["python"] + cmd),
    }
    head.update(extra)
    return head


def header_markdown(head: dict[str, Any]) -> str:
    """The run header as Markdown lines (``key: value``; the command as ``- command:`` too, so that the
    file passes ci/tools/readme_tables.py's header check), command last as a code line to copy."""
    lines = [f"- {k}: {v}" for k, v in head.items() if k != "command" and v is not None]
    return "\n".join(lines + [f"- command: `{head['command']}`", "", "    " + head["command"]])


def markdown_table(rows: Iterable[dict[str, Any]], columns: Sequence[tuple[str, str]] | None = None,
                   fmt: dict[str, str] | None = None) -> str:
    """``rows`` as a Markdown table. ``columns``: (key, title) pairs, default every key of the first
    row; ``fmt``: per key a format spec (e.g. ``".3f"``). None prints as ``n/a``."""
    rows = list(rows)
    if not rows:
        return "(no rows)"
    columns = list(columns or [(k, k) for k in rows[0]])
    fmt = fmt or {}

    def cell(v: Any, key: str) -> str:
        if v is None:
            return "n/a"
        spec = fmt.get(key)
        return format(v, spec) if spec else str(v)

    lines = ["| " + " | ".join(t for _, t in columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r.get(k), k) for k, _ in columns) + " |" for r in rows]
    return "\n".join(lines)


def write_result(path: str | os.PathLike, title: str, head: dict[str, Any], body: str, data: Any) -> Path:
    """Write ``path`` (Markdown: title, run header, body) and ``path`` with ``.json`` (header +
    data). Returns the Markdown path."""
    md = Path(path)
    md.parent.mkdir(parents=True, exist_ok=True)
    md.write_text(f"# {title}\n\n{header_markdown(head)}\n\n{body.rstrip()}\n")
    md.with_suffix(".json").write_text(json.dumps({"header": head, "data": data}, indent=1, default=str))
    return md
