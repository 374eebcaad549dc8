"""``verify --quant FORMAT`` wiring (verify/quant.py): argument parsing, the error paths, the dispatch to the
kit's cells. The cells themselves (the GPTQ kit in the real CPU engine, judged on the dequantized weights, MTP
acceptance against the bf16 kit's) are tests/testing/test_gptq_kit.py's; a whole ``verify --quant gptq`` run
takes minutes here, so CI does not repeat it."""
from __future__ import annotations

import pytest

from vllm_platform_ext.testing import gptq_cells
from vllm_platform_ext.verify import quant, runner


def test_unknown_format_names_the_known_ones(capsys):
    assert runner.main(["--quant", "awq"]) == 2
    err = capsys.readouterr().err
    assert "--quant 'awq': unknown format" in err and "known: gptq" in err


def test_absent_quantizer_names_what_to_install(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("VPE_QDEPS", str(tmp_path))  # an empty folder
    monkeypatch.setattr(quant.importlib.util, "find_spec", lambda name: None)
    assert runner.main(["--quant", "gptq"]) == 2
    err = capsys.readouterr().err
    assert "auto-round==0.16.1 is not installed" in err and str(tmp_path) in err
    assert "bash ci/setup.sh install" in err and ".qdeps" in err


def test_quantizer_found_in_the_qdeps_folder(monkeypatch, tmp_path):
    (tmp_path / "auto_round").mkdir()
    monkeypatch.setenv("VPE_QDEPS", str(tmp_path))
    assert quant.quantizer_path("gptq") == [str(tmp_path)]
    monkeypatch.setenv("VPE_QDEPS", str(tmp_path / "none"))
    monkeypatch.setattr(quant.importlib.util, "find_spec", lambda name: object())  # importable already
    assert quant.quantizer_path("gptq") == []


@pytest.mark.parametrize("extra", [["--kinds", "qwen3_next"], ["--model-dir=."], ["--modes", "base"], ["--full"],
                                   ["--tp", "2"], ["--disable", "gdn.cpu_spec_decode"], ["--cpu-path", "no-avx512bf16"]])
def test_options_that_pick_other_cells_are_refused(extra, capsys):
    with pytest.raises(SystemExit) as exc:
        runner.parse_args(["--quant", "gptq", *extra])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "argument --quant" in err and extra[0].split("=")[0] in err


@pytest.mark.parametrize("ok", [True, False])
def test_dispatch_runs_the_cells_and_sets_the_exit_code(monkeypatch, tmp_path, ok, capsys):
    calls = []
    monkeypatch.setattr(quant, "quantizer_path", lambda fmt: [])
    monkeypatch.setattr(quant, "run", lambda fmt, work, max_tokens, graphs=None: calls.append(
        (fmt, work, max_tokens, graphs)) or (ok, [{"status": "pass" if ok else "fail", "plugin": True, "checkpoint": "c",
                                                   "mode": "mtp", "k": 3},
                                                  {"status": "error", "plugin": False, "checkpoint": "c", "mode": "mtp",
                                                   "k": 3}]))
    assert runner.main(["--quant", "gptq", "--work-dir", str(tmp_path)]) == (0 if ok else 1)
    assert runner.main(["--quant", "gptq", "--work-dir", str(tmp_path), "--max-tokens", "16", "--graphs", "eager"]) == (
        0 if ok else 1)
    # the cells' own token count unless --max-tokens is given (0: gptq_cells' default)
    assert calls == [("gptq", tmp_path, 0, None), ("gptq", tmp_path, 16, "eager")]
    out = capsys.readouterr().out
    assert ("verify: PASS" if ok else "verify: FAIL") in out
    assert "plugin-off cells (vLLM alone; shown, not judged): c mtp k=3: error" in out


@pytest.mark.parametrize("on,off,ok", [("pass", "error", True), ("fail", "pass", False), ("error", "pass", False)])
def test_the_verdict_is_the_plugin_on_cells(monkeypatch, tmp_path, on, off, ok):
    seen = {}
    monkeypatch.setattr(quant, "quantizer_path", lambda fmt: ["/q"])
    monkeypatch.setattr(gptq_cells, "build", lambda root, pythonpath=(), **kw: seen.update(build=(root, pythonpath, kw)))
    monkeypatch.setattr(gptq_cells, "run", lambda root, out, **kw: seen.update(run=kw) or [
        {"status": on, "plugin": True}, {"status": off, "plugin": False}])
    assert quant.run("gptq", tmp_path, 0) == (ok, [{"status": on, "plugin": True}, {"status": off, "plugin": False}])
    assert seen["build"] == (tmp_path / "kit-gptq", ["/q"], {})  # the CPU: the text kit (the GPU: qwen3_5, gpu dims)
    assert seen["run"]["extra_env"] == {"VPE_WNA16_FALLBACK": "1"}  # AVX2 builds' GEMM; W4A16 is gptq_cells' own
    assert seen["run"]["parallel"] == 1 and seen["run"]["max_tokens"] == 0  # CPU: one engine at a time


@pytest.mark.parametrize("gpu", [False, True])
def test_autoround_builds_the_native_kit(monkeypatch, tmp_path, gpu):
    import torch

    seen = {}
    monkeypatch.setattr(quant, "quantizer_path", lambda fmt: ["/q"])
    monkeypatch.setattr(gptq_cells, "build", lambda root, pythonpath=(), **kw: seen.update(build=(root, pythonpath, kw)))
    monkeypatch.setattr(gptq_cells, "run", lambda root, out, **kw: [{"status": "pass", "plugin": True}])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu)
    assert quant.run("autoround", tmp_path, 0)[0]
    form = {"kind": "qwen3_5", "dims": "gpu"} if gpu else {}  # a GPU: the multimodal form the CUDA lines take MTP on
    assert seen["build"] == (tmp_path / "kit-autoround", ["/q"], {**form, "fmt": "auto_round"})


def test_build_puts_the_quantizer_on_the_subprocess_path(monkeypatch, tmp_path):
    import types

    from vllm_platform_ext.testing import tiny_models

    seen = []
    def kit(kind, out, **kw):
        out.mkdir(parents=True, exist_ok=True)
        (out / "model.safetensors").write_bytes(b"x")
        return out

    monkeypatch.setattr(tiny_models, "make_tiny_model", kit)
    monkeypatch.setattr(gptq_cells.subprocess, "run", lambda cmd, **kw: seen.append((cmd, kw["env"]))
                        or types.SimpleNamespace(returncode=0, stdout="", stderr=""))
    monkeypatch.setenv("PYTHONPATH", "/repo")
    gptq_cells.build(tmp_path, pythonpath=["/q/.qdeps"])
    assert len(seen) == 1 and "variants" in seen[0][0]  # one AutoRound run for both variants
    assert all(env["PYTHONPATH"].split(":") == ["/repo", "/q/.qdeps"] and env["HF_HUB_OFFLINE"] == "1"
               for _, env in seen)
