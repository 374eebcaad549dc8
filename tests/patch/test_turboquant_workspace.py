"""``turboquant.reserve_workspace`` (``patch/turboquant/reserve_workspace.py``) against vLLM's own code.

* vLLM 0.23.0 (its venv, ``ci/old_vllm_venv.sh``), run as a script (``--old-side``): the
  requests its real ``TurboQuantAttentionImpl`` makes are recorded from its own
  ``_decode_attention`` (largest decode batch) and ``_continuation_prefill`` (longest
  continuation) through a spy workspace manager; then its real ``WorkspaceManager`` on the
  CPU, locked after what profiling saw, refuses them ("Workspace is locked": issue 22's
  crash), and with the group's reservation the same requests after the lock are served. The group
  applies there, on the builder's ``__init__``.
* vLLM 0.32 (this venv): upstream reserves itself, the group is skipped as not needed, and
  what it would reserve covers every request upstream's own ``_reserve_workspace`` makes.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import types

NS = types.SimpleNamespace


def fake_config(max_num_seqs=8, capture=(1, 2, 4, 16), max_model_len=4096, batched=2048, dtype=None):
    import torch

    model = NS(get_num_attention_heads=lambda par: 16, get_head_size=lambda: 256, dtype=dtype or torch.bfloat16,
               max_model_len=max_model_len)
    return NS(scheduler_config=NS(max_num_seqs=max_num_seqs, enable_chunked_prefill=True,
                                  max_num_batched_tokens=batched),
              model_config=model, parallel_config=NS(), compilation_config=NS(cudagraph_capture_sizes=list(capture)),
              attention_config=NS(tq_max_kv_splits_for_cuda_graph=32))


SPEC = dict(num_kv_heads=2, block_size=16, head_size=200)  # head_size: the packed slot's half, as 0.23 reports it


class _Recorded(Exception):
    """Raised by the spy workspace manager once a request is recorded: stops before Triton."""


def record_real_requests(tq, cfg, rows: int, heads=(16, 2), d=256, kv_dtype="turboquant_k8v4") -> dict:
    """The ``get_simultaneous`` requests vLLM's own TurboQuant impl makes, recorded from its real
    ``_decode_attention`` (the largest decode batch: ``rows`` query tokens) and
    ``_continuation_prefill`` (the longest continuation: a chunk just over the decode threshold
    ending at ``max_model_len``). The impl is built by its own ``__init__`` from ``cfg``."""
    import torch

    hq, hk = heads
    seen = []

    def get_simultaneous(*req):
        seen.append([(list(shape), str(dtype)) for shape, dtype in req])
        raise _Recorded

    saved = {n: getattr(tq, n) for n in ("get_current_vllm_config", "get_flash_attn_version",
                                         "current_workspace_manager", "is_workspace_manager_initialized")}
    tq.get_current_vllm_config = lambda: cfg
    tq.get_flash_attn_version = lambda *a, **k: None  # no CUDA here; prefill paths are not run
    tq.current_workspace_manager = lambda: NS(get_simultaneous=get_simultaneous)
    tq.is_workspace_manager_initialized = lambda: True
    try:
        impl = tq.TurboQuantAttentionImpl(num_heads=hq, head_size=d, scale=d ** -0.5, num_kv_heads=hk,
                                          kv_cache_dtype=kv_dtype)
        block = SPEC["block_size"]
        max_len = cfg.model_config.max_model_len
        kv_cache = torch.zeros(max_len // block, block, hk, 1, dtype=torch.uint8)
        out = {}
        try:
            impl._decode_attention(torch.zeros(rows, hq, d, dtype=cfg.model_config.dtype), kv_cache,
                                   NS(block_table=torch.zeros(rows, max_len // block, dtype=torch.int32),
                                      seq_lens=torch.full((rows,), max_len, dtype=torch.int32)), None, None)
        except _Recorded:
            out["decode"] = seen.pop()
        q_len = tq._CONTINUATION_DECODE_THRESHOLD + 1
        try:
            impl._continuation_prefill(None, torch.zeros(q_len, hq, d, dtype=torch.float16),
                                       torch.zeros(q_len, hk, d, dtype=torch.float16),
                                       torch.zeros(q_len, hk, d, dtype=torch.float16), kv_cache,
                                       torch.zeros(1, max_len // block, dtype=torch.int32),
                                       max_len - q_len, max_len, None, None)
        except _Recorded:
            out["continuation"] = seen.pop()
        return out
    finally:
        for n, v in saved.items():
            setattr(tq, n, v)


def _old_side() -> dict:  # runs in the old venv
    import torch

    import vllm
    from vllm.v1.attention.backends import turboquant_attn as tq
    from vllm.v1.worker import workspace as W

    from vllm_platform_ext import patching
    from vllm_platform_ext.report import Report
    from vllm_platform_ext.patch.turboquant import reserve_workspace as T

    out = {"vllm": vllm.__version__, "skip": T._skip_if()}
    cfg, spec = fake_config(), NS(**SPEC)
    # the largest decode batch a FULL CUDA graph replays: the largest capture size, in query tokens
    rows = max(cfg.compilation_config.cudagraph_capture_sizes)
    real = record_real_requests(tq, cfg, rows)
    out["recorded"] = real
    requests = [tuple((tuple(shape), getattr(torch, dt.removeprefix("torch."))) for shape, dt in real[k])
                for k in ("decode", "continuation")]

    def after_lock(reserve: bool) -> list:
        W.reset_workspace_manager()
        W.init_workspace_manager(torch.device("cpu"))
        # what profiling saw: a one-row decode batch
        W.current_workspace_manager().get_simultaneous(*((((1,) + s[1:]), dt) for s, dt in requests[0]))
        if reserve:
            out["reserved_bytes"] = T.reserve_workspace(cfg, spec)
        W.lock_workspace()
        res = []
        for req in requests:
            try:
                W.current_workspace_manager().get_simultaneous(*req)
                res.append("ok")
            except AssertionError as exc:
                res.append(str(exc)[:120])
        return res

    out["without"] = after_lock(False)
    out["with"] = after_lock(True)
    report = Report()
    (group,) = T.GROUPS
    out["applied"] = patching.apply_group(group, report)
    out["targets"] = patching.applied_targets(group.name)
    patching.restore(group.name)
    return out


if __name__ == "__main__" and sys.argv[1:] == ["--old-side"]:
    print("OLD-SIDE-JSON " + json.dumps(_old_side()))
    sys.exit(0)

# ---------------------------------------------------------------------------------------------
import pytest  # noqa: E402

from conftest import REPO, every_line, old_vllm_python, table_wheel  # noqa: E402


@pytest.fixture(scope="module")
def old():
    py = old_vllm_python()
    if not os.path.exists(py):
        pytest.fail(f"old-vLLM venv missing ({py}): run `bash ci/old_vllm_venv.sh` (setup step)")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.path.join(REPO, "tests")]), VLLM_PLUGINS="",
               CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([py, os.path.abspath(__file__), "--old-side"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("OLD-SIDE-JSON ")]
    assert proc.returncode == 0 and lines, f"old side failed (rc {proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}"
    return json.loads(lines[-1][len("OLD-SIDE-JSON "):])


def test_locked_workspace_refuses_the_largest_decode_without_the_reservation(old):
    assert old["vllm"].startswith("0.23")
    assert all("Workspace is locked" in r for r in old["without"]), old["without"]


def test_reservation_serves_every_later_request(old):
    assert old["with"] == ["ok", "ok"]
    assert old["reserved_bytes"] > 0


def test_requests_were_recorded_from_vllm_023s_own_code(old):
    """The requests above come from 0.23's ``_decode_attention`` / ``_continuation_prefill``
    (not from the group's formula): B x Hq x splits x (D+1) float32 partials with the splits its
    ``__init__`` read from the config, and two fp16 dequant buffers of the longest continuation."""
    decode, cont = old["recorded"]["decode"], old["recorded"]["continuation"]
    assert decode[0] == [[16, 16, 32, 257], "torch.float32"] and decode[2] == [[16, 16], "torch.float32"]
    assert decode[1] == [[16, 16, 256], "torch.bfloat16"]
    assert len(cont) == 2 and cont[0][1] == "torch.float16" and cont[0][0][:2] == [1, 2] and cont[0][0][3] == 256
    assert cont[0][0][2] >= 4096 - 129  # the cached part of a chunk ending at max_model_len


def test_group_applies_on_the_old_builder(old):
    assert old["skip"] is None and old["applied"] is True
    assert old["targets"] == ["vllm.v1.attention.backends.turboquant_attn:TurboQuantMetadataBuilder.__init__"]


def test_not_needed_where_upstream_reserves_and_never_less_than_upstream(monkeypatch):
    import torch
    from vllm.v1.attention.backends import turboquant_attn as tq

    from vllm_platform_ext.patch.turboquant import reserve_workspace as T

    assert T._skip_if().startswith("not needed")
    assert T.backend_patches(tq.TurboQuantAttentionBackend) == []
    cfg = fake_config()
    seen = []
    monkeypatch.setattr(tq, "is_workspace_manager_initialized", lambda: True)
    monkeypatch.setattr(tq, "current_workspace_manager", lambda: NS(get_simultaneous=lambda *r: seen.append(r)))
    # upstream's reservation for a spec with the real head size (what 0.32 reports)
    tq.TurboQuantMetadataBuilder._reserve_workspace(NS(vllm_config=cfg, kv_cache_spec=NS(**{**SPEC, "head_size": 256})))
    ours = T.workspace_requests(cfg, NS(**SPEC))
    assert len(seen) == len(ours) == 2

    def nbytes(req):
        return sum(T._nbytes(s, d) for s, d in req)

    for up, me in zip(seen, ours):
        assert nbytes(me) >= nbytes(up), (up, me)
    assert ours[0][0][0][0] == 16  # rows: the largest capture size beats max_num_seqs = 8
    assert ours[0][1][1] is torch.bfloat16


@pytest.mark.parametrize("line,needed", every_line({(0, 22): True, (0, 23): True, **{k: False for k in (
                             (0, 24), (0, 25), (0, 26), (0, 27), (0, 28), (0, 29), (0, 30), (0, 31), (0, 32), (0, 33),
                             (0, 34))}}, "turboquant.reserve_workspace").items(),
                         ids=lambda v: ".".join(map(str, v)) if isinstance(v, tuple) else str(v))
def test_which_lines_need_the_reservation(line, needed):
    """Per line, from its own wheel: the builder the group's probe looks at lacks
    ``_reserve_workspace`` exactly on 0.22 and 0.23, and the workspace manager it reserves in
    exists on every line."""
    import ast
    import zipfile

    with zipfile.ZipFile(table_wheel(line)) as z:
        tree = ast.parse(z.read("vllm/v1/attention/backends/turboquant_attn.py"))
        workspace = z.read("vllm/v1/worker/workspace.py").decode()
    (builder,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "TurboQuantMetadataBuilder"]
    methods = {n.name for n in builder.body if isinstance(n, ast.FunctionDef)}
    assert ("_reserve_workspace" not in methods) is needed
    assert "def lock_workspace" in workspace and "def get_simultaneous" in workspace
