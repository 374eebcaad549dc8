"""Bad ``vllm-platform-ext verify`` arguments (issue 30): each one is an argparse usage error
(exit 2) naming the argument, the value and what is valid, before any model is built or engine
started; a bad switch in the environment stops verify the same way. A config vLLM itself rejects
fails its row with vLLM's whole message and the path of the kept engine log (one engine start)."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from vllm_platform_ext.verify import runner

# argv -> fragments of the usage error on stderr
BAD = [
    (["--modes", "ngram:0"], ["argument --modes", "'ngram:0': k must be between 1 and 16", "got 0"]),
    (["--modes", "ngram:-1"], ["argument --modes", "'ngram:-1': k must be between 1 and 16", "got -1"]),
    (["--modes", "mtp:17"], ["argument --modes", "k must be between 1 and 16"]),
    (["--modes", "beam:2"], ["argument --modes", "unknown mode 'beam'", "base, ngram, mtp"]),
    (["--modes", "mtp:x"], ["argument --modes", "'mtp:x': k must be an integer", "got 'x'"]),
    (["--modes", "ngram"], ["argument --modes", "give the draft tokens per step as ngram:K"]),
    (["--modes", "base:2"], ["argument --modes", "base runs without speculation and takes no k"]),
    (["--modes", ""], ["argument --modes", "no modes given"]),
    (["--modes", "base,,mtp:2"], ["argument --modes", "empty item", "single commas"]),
    (["--kinds", ""], ["argument --kinds", "no model kinds given"]),
    (["--kinds", "nosuch"], ["argument --kinds", "unknown model kind 'nosuch'", "qwen3_next, qwen3_5_text"]),
    (["--kv", "fp9"], ["argument --kv", "unknown KV cache dtype 'fp9'", "turboquant_k8v4"]),
    (["--kv", ""], ["argument --kv", "no KV cache dtypes given"]),
    (["--max-tokens", "0"], ["argument --max-tokens", "0 is out of range: give 1..136"]),
    (["--max-tokens", "500"], ["argument --max-tokens", "500 is out of range: give 1..136"]),
    (["--max-tokens", "ten"], ["argument --max-tokens", "'ten' is not an integer"]),
    (["--max-num-seqs", "0"], ["argument --max-num-seqs", "0 is out of range"]),
    (["--max-num-batched-tokens", "-4"], ["argument --max-num-batched-tokens", "-4 is out of range"]),
    (["--alpha", "2"], ["argument --alpha", "give 0 < alpha < 1"]),
    (["--alpha", "0"], ["argument --alpha", "give 0 < alpha < 1"]),
    (["--alpha", "often"], ["argument --alpha", "'often' is not a number"]),
    (["--margin", "0.02"], ["argument --margin", "--margin is gone", "binomial bound in positions", "--alpha"]),
    (["--disable", "gdn.cpu_spec_decode_typo"], ["argument --disable", "unknown patch group 'gdn.cpu_spec_decode_typo'",
                                                 "did you mean 'gdn.cpu_spec_decode'", "valid names:"]),
    (["--disable", "gdn"], ["argument --disable", "prefixes are not expanded"]),
    (["--disable", "gdn.cpu_spec_decode;turboquant_spec_verify"], ["argument --disable", "separate names with ','"]),
    (["--graphs", "sometimes"], ["argument --graphs", "invalid choice: 'sometimes'"]),
    (["--cpu-path", "avx9"], ["argument --cpu-path", "invalid choice: 'avx9'"]),
    (["--model-dir", "/nonexistent/model"], ["argument --model-dir", "/nonexistent/model is not a directory"]),
]


@pytest.mark.parametrize("argv,fragments", BAD, ids=[" ".join(a) or "empty" for a, _ in BAD])
def test_bad_argument_is_a_usage_error(argv, fragments, capsys):
    with pytest.raises(SystemExit) as exit_:
        runner.main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: vllm-platform-ext verify"), err
    for fragment in fragments:
        assert fragment in err, (fragment, err)


def test_good_arguments_parse():
    args = runner.parse_args(["--modes", "base, ngram:1,mtp:16", "--kinds", "qwen3_5_text", "--kv", "auto,turboquant_k8v4",
                              "--disable", " gdn.cpu_spec_decode ,", "--max-tokens", "136"])
    assert args.modes == [("base", 0), ("ngram", 1), ("mtp", 16)] and args.kinds == ["qwen3_5_text"]
    assert args.kv == ["auto", "turboquant_k8v4"] and args.disable == "gdn.cpu_spec_decode"
    assert runner.parse_args([]).modes == runner.mode_items(runner.QUICK_MODES)
    assert runner.parse_args([]).max_tokens == 64 and runner.parse_args([]).alpha == 0.01  # 448 positions
    assert runner.parse_args(["--alpha", "0.001"]).alpha == 0.001
    assert runner.parse_args(["--full"]).modes == runner.mode_items(runner.FULL_MODES)
    with pytest.raises(ValueError, match="unknown mode 'beam'"):
        runner.parse_modes("beam:2")  # the library form raises the same message


def test_bad_switch_in_the_environment_stops_verify(monkeypatch, capsys):
    monkeypatch.setenv("VLLM_PLATFORM_EXT_STRICT", "maybe")
    monkeypatch.setattr(runner, "make_tiny_model", lambda *a, **k: pytest.fail("built a model despite a bad switch"))
    assert runner.main(["--kinds", "qwen3_5_text", "--modes", "base"]) == 2
    err = capsys.readouterr().err
    assert "verify: VLLM_PLATFORM_EXT_STRICT='maybe' is not a boolean; valid values: 1|0|true|false" in err


@pytest.mark.engine
def test_engine_rejection_keeps_whole_reason_and_log(tmp_path, capsys):
    """vLLM rejects max_num_batched_tokens < max_num_seqs with a pydantic error whose first line
    is only '1 validation error for SchedulerConfig': the row carries the whole message."""
    out = tmp_path / "rows.json"
    rc = runner.main(["--kinds", "qwen3_5_text", "--modes", "base", "--max-tokens", "4",
                      "--max-num-batched-tokens", "4", "--max-num-seqs", "8",
                      "--work-dir", str(tmp_path / "work"), "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 1
    (row,) = json.loads(out.read_text())
    assert not row["passed"] and math.isnan(row["bad"])
    assert "validation error for SchedulerConfig" in row["note"]
    assert "max_num_batched_tokens (4) must be greater than or equal to max_num_seqs (8)" in row["note"]
    log = Path(row["log"])
    assert log.is_file() and log.parent == tmp_path / "work" / "logs"
    assert "max_num_batched_tokens (4) must be greater than or equal to max_num_seqs (8)" in log.read_text()
    assert "max_num_batched_tokens (4) must be greater than or equal to max_num_seqs (8)" in text
    assert f"engine log: {log}" in text and "verify: FAIL" in text
