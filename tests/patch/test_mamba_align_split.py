"""mamba.align_prefill_budget (patch/mamba_align_split.py) against each vLLM line's REAL split.

Every line's ``Scheduler._mamba_block_aligned_split`` (and 0.30+'s checkpoint helpers) is compiled
from that line's own source (``.cache/vllm-lines/<version>``, ``conftest.line_source``), without
importing the line, and asked how it chunks a prefill whose step budget (one 640-token block) is
shared with decode rows. The engine run under mixed load is tests/testing/test_align_hits.py."""
from __future__ import annotations

import ast
import math
import os

import pytest

from conftest import every_line
from vllm_platform_ext.patch import mamba_align_split as m

LINES = every_line({(0, 22): "differs", (0, 23): "differs", (0, 24): "differs", (0, 25): "differs", (0, 26): "needed",
                    (0, 27): "needed", (0, 28): "needed", (0, 29): "needed", (0, 30): "needed", (0, 31): "needed",
                    (0, 32): "needed", (0, 33): "needed", (0, 34): "needed"}, "mamba.align_prefill_budget")
NEEDED = [k for k, v in LINES.items() if v == "needed"]
HELPERS = ("get_mamba_prefill_checkpoint_position", "is_mamba_prefill_checkpoint_valid")
_SPLITS: dict = {}


def _functions(path: str, names) -> list:
    with open(path) as f:
        tree = ast.parse(f.read())
    found = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name in names]
    for fn in found:  # annotations name the line's classes: not needed to run the body
        fn.returns = None
        for a in (*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs, fn.args.vararg, fn.args.kwarg):
            if a is not None:
                a.annotation = None
    return found


def line_split(key):
    """The line's own split function, compiled from its source (with the helpers it calls)."""
    if key not in _SPLITS:
        from conftest import line_source

        root = os.path.join(line_source(key), "vllm", "v1")
        body = _functions(os.path.join(root, "core", "sched", "scheduler.py"), {"_mamba_block_aligned_split"})
        body += _functions(os.path.join(root, "kv_cache_interface.py"), set(HELPERS))
        assert body and body[0].name == "_mamba_block_aligned_split", key
        ns = {"cdiv": lambda a, b: -(-a // b), "math": math}
        exec(compile(ast.Module(body, []), f"vllm-{key[0]}.{key[1]} scheduler", "exec"), ns)
        _SPLITS[key] = ns["_mamba_block_aligned_split"]
    return _SPLITS[key]


def prefill(split, prompt: int, decode_rows: int, budget: int = m.PROBE_BLOCK, eagle: bool = False) -> list:
    """The chunk ends a prefill of ``prompt`` tokens gets, step after step, when decode rows of other
    requests take ``decode_rows`` of the ``budget`` first; stops (returns what it has) at a 0 chunk."""
    s = m.probe_scheduler(budget=budget, eagle=eagle)
    ends, done = [], 0
    while done < prompt and len(ends) < 100:
        n = split(s, m.probe_request(done, prompt), min(prompt - done, budget - decode_rows))
        if n <= 0:
            break
        done += n
        ends.append(done)
    return ends


@pytest.mark.parametrize("key", sorted(LINES), ids=[f"{a}.{b}" for a, b in sorted(LINES)])
def test_probe_per_line(key):
    """Every line starves the prefill (0 tokens with 636 of a 640-token budget left); the group serves
    the lines whose split re-aligns a mid-block chunk (0.26-0.34) and leaves 0.22-0.25 alone,
    saying why; where it serves, the patched split gives the chunk the budget allows."""
    split = line_split(key)
    assert m.line_behaviour(split)["starved"] == 0, key
    reason = m.decide(split)
    if LINES[key] == "differs":
        assert reason and reason.startswith("not applied on this line") and "gave 640 tokens" in reason, reason
    else:
        assert reason is None, reason
        assert m.line_behaviour(m.patched(split)) == {"starved": m.PROBE_LEFT, "realign": 4}


@pytest.mark.parametrize("key", NEEDED, ids=[f"{a}.{b}" for a, b in NEEDED])
@pytest.mark.parametrize("eagle", [False, True], ids=["plain", "mtp"])
def test_prefill_beside_decodes_ends_on_every_block(key, eagle):
    """A 2,000-token prefill beside 1, 4 (MTP k=3) or 7 decode rows under a one-block budget: the line's
    own split gives it nothing (starved while anything decodes); patched, it advances every step and
    a chunk ends on every block boundary below the prompt's end, as alone with the whole budget."""
    split = line_split(key)
    alone = prefill(split, 2000, 0, eagle=eagle)
    assert alone and alone[-1] == 2000, alone
    # the boundaries whose state a later request can resume from: below the prompt's last token, one
    # block less with MTP/EAGLE (its attention drops the last matched block)
    want = set(range(m.PROBE_BLOCK, 1920 + 1 - (m.PROBE_BLOCK if eagle else 0), m.PROBE_BLOCK))
    assert want <= set(alone), alone
    for rows in (1, 4, 7):
        assert prefill(split, 2000, rows, eagle=eagle) == [], (key, rows)  # vLLM's own: starved
        ends = prefill(m.patched(split), 2000, rows, eagle=eagle)
        assert ends and ends[-1] == 2000, (rows, ends)
        assert want <= set(ends), (rows, ends)
        starts = [0] + ends[:-1]
        crossing = [(a, b) for a, b in zip(starts, ends) if any(a < w < b for w in want)]
        assert not crossing, (rows, ends)  # no chunk runs past a boundary below the tail without ending on it
