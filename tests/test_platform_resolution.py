"""vLLM's own platform resolution (``vllm.platforms.current_platform``), in fresh
interpreters, picks ``MacaPlatform`` through the installed ``vllm.platform_plugins`` entry
point exactly when the MetaX probe says so."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("mxsml_build", Path(__file__).parent / "fixtures" / "mxsml_build.py")
mxsml_build = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mxsml_build)

RESOLVE = "from vllm.platforms import current_platform; print('PLATFORM=' + type(current_platform).__name__)"
CLEARED = ("VLLM_PLATFORM_EXT_PLATFORM", "VLLM_PLATFORM_EXT_MXSML_LIB", "MACA_PATH", "VLLM_PLUGINS",
           "VLLM_TARGET_DEVICE", "FAKE_MXSML_INIT_RC", "FAKE_MXSML_COUNT", "PYTHONPATH")


@pytest.fixture(scope="module")
def fake_lib(tmp_path_factory) -> Path:
    return mxsml_build.build_fake_mxsml(tmp_path_factory.mktemp("mxsml"))


def resolve(**env: str) -> str:
    full = {k: v for k, v in os.environ.items() if k not in CLEARED}
    full.update(env)
    proc = subprocess.run([sys.executable, "-c", RESOLVE], env=full, capture_output=True, text=True, timeout=300)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("PLATFORM=")]
    assert proc.returncode == 0 and lines, f"rc={proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return lines[-1].split("=", 1)[1]


def test_our_entry_point_is_installed():
    from importlib.metadata import entry_points

    values = {ep.value for ep in entry_points(group="vllm.platform_plugins")}
    assert "vllm_platform_ext:register" in values


def test_fake_mxsml_selects_maca(fake_lib):
    assert resolve(VLLM_PLATFORM_EXT_MXSML_LIB=str(fake_lib)) == "MacaPlatform"


def test_without_library_resolves_cpu(tmp_path):
    assert resolve(VLLM_PLATFORM_EXT_MXSML_LIB=str(tmp_path / "missing.so")) == "CpuPlatform"


def test_init_failure_resolves_cpu(fake_lib):
    assert resolve(VLLM_PLATFORM_EXT_MXSML_LIB=str(fake_lib), FAKE_MXSML_INIT_RC="9") == "CpuPlatform"


def test_override_forces_and_disables(fake_lib, tmp_path):
    assert resolve(VLLM_PLATFORM_EXT_PLATFORM="maca",
                   VLLM_PLATFORM_EXT_MXSML_LIB=str(tmp_path / "missing.so")) == "MacaPlatform"
    assert resolve(VLLM_PLATFORM_EXT_PLATFORM="none", VLLM_PLATFORM_EXT_MXSML_LIB=str(fake_lib)) == "CpuPlatform"


def _plugin_dir(root: Path, returns: str) -> Path:
    root.mkdir()
    (root / "fakeplug.py").write_text(textwrap.dedent(f"""
        from vllm.platforms.cpu import CpuPlatform

        class FakePlatform(CpuPlatform):
            pass

        def register():
            return {returns}
    """))
    dist = root / "fakeplug-0.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: fakeplug\nVersion: 0.0\n")
    (dist / "entry_points.txt").write_text("[vllm.platform_plugins]\nfakeplug = fakeplug:register\n")
    return root


def test_another_active_plugin_wins(fake_lib, tmp_path):
    # Without the deferral vLLM would raise "Only one platform plugin can be activated".
    plug = _plugin_dir(tmp_path / "active", "'fakeplug.FakePlatform'")
    assert resolve(VLLM_PLATFORM_EXT_MXSML_LIB=str(fake_lib), PYTHONPATH=str(plug)) == "FakePlatform"


def test_inactive_plugin_does_not_block(fake_lib, tmp_path):
    plug = _plugin_dir(tmp_path / "inactive", "None")
    assert resolve(VLLM_PLATFORM_EXT_MXSML_LIB=str(fake_lib), PYTHONPATH=str(plug)) == "MacaPlatform"
