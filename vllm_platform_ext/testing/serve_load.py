"""`vllm serve` under load, audited: many concurrent streaming completions on loopback, some
cancelled midway; the server must stay up and every completed greedy output must pass the
float32 transformers audit (the same floor + margin as ``verify``).

Prompts are token ids of the kit's char-level tokenizer (each id is one character), so the
streamed text maps back to token ids one to one. Only loopback is used, requests are bounded
in number and time, and the server is stopped at the end.
"""
from __future__ import annotations

import http.client
import json
import os
import random
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from vllm_platform_ext.testing.audit import MARGIN, Reference, passes
from vllm_platform_ext.testing.engine import ENGINE_ENV
from vllm_platform_ext.testing.tiny_models import hot_token_ids

HEALTH_TIMEOUT_S = 600


@dataclass
class LoadResult:
    completed: int = 0
    cancelled: int = 0
    errors: list = field(default_factory=list)
    bad: float = 0.0
    floor: float = 0.0
    positions: int = 0
    draft_tokens: float = 0.0
    accepted_tokens: float = 0.0
    alive_after: bool = False
    passed: bool = False
    note: str = ""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def counter(metrics_text: str, name: str) -> float:
    total = 0.0
    for line in metrics_text.splitlines():
        if line.startswith(name + "_total") or line.startswith(name + "{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def load_prompts(n: int, seed: int = 0, lengths=(5, 12, 33, 70, 140)) -> list[list[int]]:
    """Mixed lengths over the kit's output alphabet, so drafts get proposed and accepted."""
    r = random.Random(seed)
    hot = hot_token_ids(8)
    return [[r.choice(hot) for _ in range(lengths[i % len(lengths)])] for i in range(n)]


def _stream(port: int, body: dict, cancel_after: int | None, timeout: float) -> tuple[str, bool]:
    """One streaming completion; returns (text, finished). ``cancel_after`` chunks: close early."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", "/v1/completions", json.dumps({**body, "stream": True}),
                     {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:300]!r}")
        text, chunks = [], 0
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                return "".join(text), True
            text.append(json.loads(data)["choices"][0].get("text", ""))
            chunks += 1
            if cancel_after is not None and chunks >= cancel_after:
                return "".join(text), False  # closing the connection cancels the request
        return "".join(text), False
    finally:
        conn.close()


def start_server(model: str, args: list[str], log_path: str, env: dict | None = None):
    port = free_port()
    cmd = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", model, "--host", "127.0.0.1",
           "--port", str(port), "--served-model-name", "tiny", *args]
    # the checks read the server's INFO log (block size, the forced CPU path): a level left in this
    # process's environment (an in-process `doctor`, a user's shell) must not hide it
    full_env = {**os.environ, **ENGINE_ENV, "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost",
                "VLLM_LOGGING_LEVEL": "INFO", **(env or {})}
    log = open(log_path, "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=full_env)
    deadline = time.monotonic() + HEALTH_TIMEOUT_S
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited rc={proc.returncode}:\n" + open(log_path).read()[-4000:])
        if healthy(port):
            return proc, port
        if time.monotonic() > deadline:
            stop_server(proc)
            raise RuntimeError(f"no /health within {HEALTH_TIMEOUT_S}s:\n" + open(log_path).read()[-4000:])
        time.sleep(1)


def healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
            return r.status == 200
    except (urllib.error.URLError, ConnectionError, OSError):
        return False


def stop_server(proc) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=30)


def run_load(model: str, serve_args: list[str], log_path: str, n: int = 64, cancel_every: int = 8,
             max_tokens: int = 32, workers: int = 64, env: dict | None = None, margin: float = MARGIN,
             timeout: float = 600) -> LoadResult:
    """Serve ``model`` with ``serve_args``; ``n`` concurrent streaming greedy completions, every
    ``cancel_every``-th closed after a few chunks; audit the completed ones."""
    from transformers import AutoTokenizer

    prompts = load_prompts(n)
    tok = AutoTokenizer.from_pretrained(model)
    res = LoadResult()
    proc, port = start_server(model, serve_args, log_path, env)
    try:
        def one(i):
            # special tokens kept in the text, so every generated id maps back (kit ids <-> chars)
            body = {"model": "tiny", "prompt": prompts[i], "max_tokens": max_tokens, "temperature": 0,
                    "ignore_eos": True, "skip_special_tokens": False, "spaces_between_special_tokens": False}
            cancel = 2 + i % 3 if cancel_every and i % cancel_every == cancel_every - 1 else None
            try:
                return i, _stream(port, body, cancel, timeout), None
            except Exception as exc:  # recorded: a request error fails the cell
                return i, ("", False), f"request {i}: {type(exc).__name__}: {exc}"

        with ThreadPoolExecutor(max_workers=min(workers, n)) as pool:
            outs = list(pool.map(one, range(n)))
        res.alive_after = healthy(port)
        if res.alive_after:  # the server still answers a plain request after the cancellations
            try:
                _stream(port, {"model": "tiny", "prompt": prompts[0], "max_tokens": 4, "temperature": 0}, None, 120)
            except Exception as exc:
                res.alive_after = False
                res.errors.append(f"after load: {type(exc).__name__}: {exc}")
        metrics = _metrics(port)
        res.draft_tokens = counter(metrics, "vllm:spec_decode_num_draft_tokens")
        res.accepted_tokens = counter(metrics, "vllm:spec_decode_num_accepted_tokens")
    finally:
        stop_server(proc)
    done_prompts, done_tokens = [], []
    for i, (text, finished), err in outs:
        if err:
            res.errors.append(err)
        elif finished:
            ids = tok(text, add_special_tokens=False)["input_ids"]
            if len(ids) != max_tokens or tok.decode(ids) != text:
                res.errors.append(f"request {i}: {len(ids)} tokens back from {text!r}")
                continue
            done_prompts.append(prompts[i])
            done_tokens.append(ids)
        else:
            res.cancelled += 1
    res.completed = len(done_tokens)
    ref = Reference(model)
    if done_tokens:
        a = ref.audit(done_prompts, done_tokens)
        res.bad, res.positions = a.bad_fraction, a.positions
    res.floor = ref.floor(done_prompts, max_tokens).bad_fraction if done_prompts else 0.0
    res.passed = (not res.errors and res.alive_after and res.completed > 0
                  and passes(res.bad, res.floor, margin))
    if not res.passed:
        res.note = "; ".join(res.errors[:3]) or ("server down after load" if not res.alive_after
                                                 else f"bad {res.bad:.3f} > floor {res.floor:.3f} + {margin}")
    return res


@dataclass
class PrefixCacheResult:
    block_tokens: int = 0  # the attention/mamba block size the server chose (its start-up log)
    hit_tokens: float = 0.0  # /metrics prefix-cache hits of the two requests meant to hit
    salted_hit_tokens: float = 0.0  # ... of the one kept off the cache by its cache_salt
    query_tokens: float = 0.0  # /metrics prefix-cache queries of the request meant to hit: 0 when the server
    # runs without prefix caching (vLLM 0.22-0.25's default for hybrid models: is_prefix_caching_supported)
    same_with_and_without_hit: bool = False
    accepted_tokens: float = 0.0
    bad: float = 0.0
    floor: float = 0.0
    alive_after: bool = False
    errors: list = field(default_factory=list)
    passed: bool = False


def _complete_ids(port: int, prompt: list[int], max_tokens: int, salt: str | None = None) -> list[int]:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True}
    if salt:
        body["cache_salt"] = salt
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        ids = json.loads(r.read())["choices"][0]["token_ids"]
    if len(ids) != max_tokens:
        raise RuntimeError(f"{len(ids)} tokens back, asked for {max_tokens}")
    return ids


def _metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
        return r.read().decode()


def run_prefix_cache_check(model: str, serve_args: list[str], log_path: str, env: dict | None = None,
                           max_tokens: int = 32, prefix_blocks: int = 2, margin: float = MARGIN) -> PrefixCacheResult:
    """Prefix caching under `vllm serve`, one greedy request after another:

    * ``A`` (a prompt just short of one block) decodes across the first block boundary, so the
      align copies of (speculative) decoding run;
    * ``D`` (``prefix_blocks`` blocks and a few tokens) saves the boundary states during its
      prefill; ``E`` shares D's first ``prefix_blocks`` blocks: once with a ``cache_salt`` (no
      hit) and once without (a hit): both must give the same tokens, and only the second counts
      hits. (With MTP/EAGLE vLLM recomputes the last matched block for the drafter, so a hit
      needs a prefix of two blocks; the server needs ``--max-model-len`` for it.)

    Every output is audited against float32 transformers (floor + margin). The server is this
    call's own; :func:`prefix_cache_requests` and :func:`prefix_cache_verdict` are the same check on
    a server the caller started (and asks other things too)."""
    proc, port = start_server(model, serve_args, log_path, env)
    try:
        res, outs = prefix_cache_requests(port, log_path, max_tokens, prefix_blocks)
    finally:
        stop_server(proc)
    return prefix_cache_verdict(model, res, outs, max_tokens, margin)


def prefix_cache_requests(port: int, log_path: str, max_tokens: int = 32,
                          prefix_blocks: int = 2) -> tuple[PrefixCacheResult, list]:
    """The requests of :func:`run_prefix_cache_check` to the server on ``port`` (its log at
    ``log_path`` names its block size): the result so far and the (prompt, tokens) to audit. Hits and
    accepted drafts are /metrics differences around these requests: earlier ones to the server do not count."""
    import re

    r = random.Random(1)
    hot = hot_token_ids(8)
    res = PrefixCacheResult()
    outs: list[tuple[list[int], list[int]]] = []
    m = re.search(r"attention block size to (\d+) tokens", open(log_path).read())
    res.block_tokens = int(m.group(1)) if m else 0
    if not res.block_tokens:
        res.errors.append("the server log does not say its attention block size")
    n = res.block_tokens or 384
    a = [r.choice(hot) for _ in range(n - max_tokens // 2)]
    d = [r.choice(hot) for _ in range(prefix_blocks * n + 8)]
    e = d[: prefix_blocks * n + 2] + [r.choice(hot) for _ in range(5)]
    accepted, start = "vllm:spec_decode_num_accepted_tokens", None
    try:
        start = counter(_metrics(port), accepted)
        outs.append((a, _complete_ids(port, a, max_tokens)))
        outs.append((d, _complete_ids(port, d, max_tokens)))
        hits, queries = "vllm:prefix_cache_hits", "vllm:prefix_cache_queries"
        m0 = _metrics(port)
        e_salted = _complete_ids(port, e, max_tokens, salt="vpe-no-hit")
        m1 = _metrics(port)
        e_hit = _complete_ids(port, e, max_tokens)
        m2 = _metrics(port)
        res.salted_hit_tokens = counter(m1, hits) - counter(m0, hits)
        res.hit_tokens = counter(m2, hits) - counter(m1, hits)
        res.query_tokens = counter(m2, queries) - counter(m1, queries)
        outs += [(e, e_salted), (e, e_hit)]
        res.same_with_and_without_hit = e_salted == e_hit
    except Exception as exc:
        res.errors.append(f"{type(exc).__name__}: {exc}")
    res.alive_after = healthy(port)
    if res.alive_after and start is not None:
        res.accepted_tokens = counter(_metrics(port), accepted) - start
    return res, outs


def prefix_cache_verdict(model: str, res: PrefixCacheResult, outs: list, max_tokens: int = 32,
                         margin: float = MARGIN) -> PrefixCacheResult:
    """``res`` judged: every output of :func:`prefix_cache_requests` audited against float32."""
    if outs:
        ref = Reference(model)
        prompts = [p for p, _ in outs]
        res.bad = ref.audit(prompts, [g for _, g in outs]).bad_fraction
        res.floor = ref.floor(prompts, max_tokens).bad_fraction
    res.passed = (not res.errors and res.alive_after and len(outs) == 4 and passes(res.bad, res.floor, margin))
    return res
