"""`doctor MODEL_PATH --serve-args "..."`: the prefix-caching settings of a hybrid model (issue 51)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from vllm_platform_ext.verify import align_settings as a

BASE = {"hybrid": True, "enable_prefix_caching": True, "mamba_cache_mode": "align", "block_size": 640,
        "max_num_batched_tokens": 640, "max_num_seqs": 8, "num_speculative_tokens": 0, "speculative_method": None,
        "prefix_cache_retention_interval": 0, "group_applied": False}


def test_one_block_budget_is_named_with_the_value_to_use():
    warnings, notes = a.findings(BASE)
    assert len(warnings) == 1 and "max_num_batched_tokens=640" in warnings[0], warnings
    assert "--max-num-batched-tokens 647" in warnings[0] and "one at a time" in warnings[0], warnings
    assert any("--prefix-cache-retention-interval 640" in n for n in notes), notes
    # MTP k=3: 7 other requests x 4 rows; with the plugin's group applied the cost is said as it is
    w, n = a.findings({**BASE, "num_speculative_tokens": 3, "speculative_method": "mtp", "group_applied": True})
    assert "--max-num-batched-tokens 668" in w[0] and "two steps a block" in w[0], w
    assert any("1280 tokens or more" in x for x in n), n


@pytest.mark.parametrize("change", [{"max_num_batched_tokens": 2048}, {"max_num_batched_tokens": 512},
                                    {"enable_prefix_caching": False, "mamba_cache_mode": "none"},
                                    {"hybrid": False}], ids=["big-budget", "block-wider", "no-caching", "not-hybrid"])
def test_no_warning_where_nothing_starves(change):
    """A budget of one block plus the decode rows, a block wider than the budget (vLLM takes sub-block
    chunks there itself), prefix caching off, a model without mamba layers: no warning."""
    assert a.findings({**BASE, **change})[0] == []


def test_the_kit_resolves_to_its_block_and_warns(tmp_path):
    """vLLM's own resolution of the kit checkpoint under `--max-num-batched-tokens 640`: the 640-token
    block of the float32 SSM cache (avx512bf16 path) or 384 (bf16), the budget starving prefills."""
    from vllm_platform_ext.testing.tiny_models import make_tiny_model

    model = make_tiny_model("qwen3_next", tmp_path / "qn", max_positions=2048)
    code = ("import json, sys; from vllm_platform_ext.verify import align_settings as a; "
            "print('RESULT ' + json.dumps(a.check(sys.argv[1], sys.argv[2:])))")
    proc = subprocess.run([sys.executable, "-c", code, str(model), "--max-num-batched-tokens", "640",
                           "--max-num-seqs", "4", "--max-model-len", "2048"],
                          capture_output=True, text=True, timeout=600, env={**__import__("os").environ,
                                                                            "VLLM_LOGGING_LEVEL": "WARNING"})
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    assert line, proc.stderr[-3000:]
    d = json.loads(line[-1][len("RESULT "):])
    s = d["settings"]
    assert s["block_size"] in (640, 384) and s["mamba_cache_mode"] == "align", s
    assert s["group_applied"] is True, s  # the plugin's bootstrap ran in vLLM's process
    if s["block_size"] == 640:
        assert len(d["warnings"]) == 1 and "--max-num-batched-tokens 643" in d["warnings"][0], d
    else:  # a 384-token block under a 640 budget: one block plus 3 decode rows fit
        assert d["warnings"] == [], d


def test_serve_args_need_a_checkpoint(capsys):
    from vllm_platform_ext import cli

    assert cli.main(["doctor", "--serve-args", "--max-num-batched-tokens 640"]) == 2
    assert "MODEL_PATH" in capsys.readouterr().err
