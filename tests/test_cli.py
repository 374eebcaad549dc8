"""The console script passes sub-command options through to verify and bench."""
import os
import shutil
import subprocess
import sys

import pytest


@pytest.mark.parametrize("cmd,option", [("verify", "--full"), ("verify", "--disable"), ("bench", "--modes")])
def test_subcommand_options_reach_their_parser(cmd, option):
    exe = shutil.which("vllm-platform-ext", path=os.path.dirname(sys.executable))
    proc = subprocess.run([exe, cmd, "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"vllm-platform-ext {cmd}" in proc.stdout and option in proc.stdout


def test_unknown_subcommand_is_an_error():
    from vllm_platform_ext import cli

    with pytest.raises(SystemExit) as e:
        cli.main(["nope"])
    assert e.value.code == 2


def test_verify_with_model_reaches_its_own_parser():
    """``verify --model PATH --help``: verify/model_check.py's options and the note on vLLM's engine arguments, not
    the kit's (whose --model-dir argparse would otherwise take --model for)."""
    exe = shutil.which("vllm-platform-ext", path=os.path.dirname(sys.executable))
    proc = subprocess.run([exe, "verify", "--model", "/nowhere", "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "vllm-platform-ext verify --model PATH" in proc.stdout and "--speculative-config" in proc.stdout
    assert "--kinds" not in proc.stdout
