"""The MetaX probe (``vllm_platform_ext.detect``) against a compiled fake ``libmxsml.so``."""
from __future__ import annotations

import ctypes
import ctypes.util
import importlib.util
import sys
import textwrap
from pathlib import Path

import pytest

from vllm_platform_ext import detect, register

_spec = importlib.util.spec_from_file_location("mxsml_build", Path(__file__).parent / "fixtures" / "mxsml_build.py")
mxsml_build = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mxsml_build)

ENV_VARS = (detect.PLATFORM_ENV, detect.MXSML_LIB_ENV, "MACA_PATH", "VLLM_PLUGINS",
            "FAKE_MXSML_INIT_RC", "FAKE_MXSML_COUNT", "FAKE_MXSML_NAME", "FAKE_MXSML_MEM_GIB")


@pytest.fixture(scope="session")
def fake_lib(tmp_path_factory) -> Path:
    return mxsml_build.build_fake_mxsml(tmp_path_factory.mktemp("mxsml"))


@pytest.fixture(autouse=True)
def clean(monkeypatch):
    for var in ENV_VARS:
        monkeypatch.delenv(var, raising=False)
    detect.clear_cache()
    yield
    detect.clear_cache()


def _depth(lib: Path) -> int:
    return ctypes.CDLL(str(lib)).fakeMxSmlInitDepth()


def test_fake_library_reports_devices(fake_lib, monkeypatch):
    monkeypatch.setenv(detect.MXSML_LIB_ENV, str(fake_lib))
    monkeypatch.setenv("FAKE_MXSML_COUNT", "2")
    result = detect.probe()
    assert result.platform == "maca", result.reason
    assert register() == "vllm_platform_ext.platform.MacaPlatform"
    d = result.details
    assert d["mxsml_lib"] == str(fake_lib)
    assert [dev["name"] for dev in d["devices"]] == ["MetaX C500", "MetaX C500"]
    assert d["devices"][0]["memory_total"] == 64 << 30
    assert d["devices"][0]["capability"] == [8, 0]
    assert d["driver_version"] == "2.33.1.7-fake"
    assert "2 MetaX device(s)" in result.reason
    assert _depth(fake_lib) == 0, "every mxSmlExInit must be matched by mxSmlExShutdown"


def test_probe_is_cached_until_cleared(fake_lib, monkeypatch):
    monkeypatch.setenv(detect.MXSML_LIB_ENV, str(fake_lib))
    first = detect.probe()
    monkeypatch.setenv("FAKE_MXSML_INIT_RC", "9")
    assert detect.probe() is first
    detect.clear_cache()
    assert detect.probe().platform is None


@pytest.mark.parametrize("rc,text", [("9", "Driver Not Loaded"), ("1", "Uninitialized")])
def test_init_failure_is_not_metax(fake_lib, monkeypatch, rc, text):
    monkeypatch.setenv(detect.MXSML_LIB_ENV, str(fake_lib))
    monkeypatch.setenv("FAKE_MXSML_INIT_RC", rc)
    result = detect.probe()
    assert result.platform is None
    assert f"mxSmlExInit returned {rc} ({text})" in result.reason
    assert register() is None


def test_zero_devices_is_not_metax(fake_lib, monkeypatch):
    monkeypatch.setenv(detect.MXSML_LIB_ENV, str(fake_lib))
    monkeypatch.setenv("FAKE_MXSML_COUNT", "0")
    result = detect.probe()
    assert result.platform is None and "reports no MetaX device" in result.reason
    assert _depth(fake_lib) == 0


def test_missing_library_is_not_metax(tmp_path, monkeypatch):
    monkeypatch.setenv(detect.MXSML_LIB_ENV, str(tmp_path / "nope" / "libmxsml.so"))
    result = detect.probe()
    assert result.platform is None
    assert "libmxsml.so not loadable" in result.reason and "nope" in result.reason


def test_library_without_mxsml_symbols_is_rejected(monkeypatch):
    libc = ctypes.util.find_library("c")
    monkeypatch.setenv(detect.MXSML_LIB_ENV, libc)
    result = detect.probe()
    assert result.platform is None and "no symbol mxSmlExInit" in result.reason


def test_default_search_paths(monkeypatch, tmp_path):
    monkeypatch.setenv("MACA_PATH", str(tmp_path / "maca"))
    assert detect.mxsml_candidates() == [
        "libmxsml.so", str(tmp_path / "maca" / "lib" / "libmxsml.so"), "/opt/maca/lib/libmxsml.so"]
    monkeypatch.setenv(detect.MXSML_LIB_ENV, "/x/libmxsml.so")
    assert detect.mxsml_candidates() == ["/x/libmxsml.so"]


def test_maca_path_is_searched(fake_lib, monkeypatch, tmp_path):
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "libmxsml.so").symlink_to(fake_lib)
    monkeypatch.setenv("MACA_PATH", str(tmp_path))
    result = detect.probe()
    assert result.platform == "maca", result.reason
    assert result.details["mxsml_lib"] == str(tmp_path / "lib" / "libmxsml.so")


@pytest.mark.parametrize("value,platform", [("none", None), ("NONE", None), ("maca", "maca"), ("bogus", None)])
def test_override(fake_lib, monkeypatch, value, platform):
    monkeypatch.setenv(detect.MXSML_LIB_ENV, str(fake_lib))  # hardware present: override must still win
    monkeypatch.setenv(detect.PLATFORM_ENV, value)
    if value == "maca":
        monkeypatch.setenv("FAKE_MXSML_INIT_RC", "9")  # and forced maca ignores the hardware
    result = detect.probe()
    assert result.platform == platform
    assert detect.PLATFORM_ENV in result.reason


def test_torch_tag(monkeypatch):
    import importlib.metadata as md

    monkeypatch.setattr(md, "version", lambda name: "2.10.0+metax3.8.0.7")
    assert detect.torch_build() == ("2.10.0+metax3.8.0.7", True)
    result = detect.probe()  # no library anywhere, MACA torch: still MetaX, torch.cuda queries
    assert result.platform == "maca" and "MACA build" in result.reason
    monkeypatch.setattr(md, "version", lambda name: "2.13.0+cpu")
    assert detect.torch_build() == ("2.13.0+cpu", False)


def test_non_maca_torch_is_flagged(fake_lib, monkeypatch):
    import importlib.metadata as md

    monkeypatch.setattr(md, "version", lambda name: "2.13.0+cu130")
    monkeypatch.setenv(detect.MXSML_LIB_ENV, str(fake_lib))
    result = detect.probe()
    assert result.platform == "maca"
    assert "not a MACA build" in result.details["warning"]


def test_probe_never_raises(monkeypatch):
    def boom():
        raise ValueError("kaboom")

    monkeypatch.setattr(detect, "_hardware", boom)
    result = detect.probe()
    assert result.platform is None and "ValueError: kaboom" in result.reason


# ---- other platform plugins (a temporary dist-info on sys.path) ----------------------


def _fake_plugin(root: Path, body: str, name: str = "fakeplug") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / f"{name}.py").write_text(textwrap.dedent(body))
    dist = root / f"{name}-0.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.0\n")
    (dist / "entry_points.txt").write_text(f"[vllm.platform_plugins]\n{name} = {name}:register\n")
    return root


@pytest.fixture
def plugin_path(monkeypatch, tmp_path):
    def add(body: str, name: str = "fakeplug") -> None:
        monkeypatch.syspath_prepend(str(_fake_plugin(tmp_path / name, body, name)))
        monkeypatch.delitem(sys.modules, name, raising=False)
    return add


def test_active_peer_wins(fake_lib, monkeypatch, plugin_path):
    plugin_path("def register():\n    return 'fakeplug.FakePlatform'\n")
    monkeypatch.setenv(detect.MXSML_LIB_ENV, str(fake_lib))
    result = detect.probe()
    assert result.platform is None
    assert "another platform plugin is active: fakeplug (fakeplug:register)" in result.reason
    detect.clear_cache()
    monkeypatch.setenv(detect.PLATFORM_ENV, "maca")  # not even when forced
    assert detect.probe().platform is None


def test_inactive_or_broken_peers_do_not_block(fake_lib, monkeypatch, plugin_path):
    plugin_path("def register():\n    return None\n", "quietplug")
    plugin_path("def register():\n    raise RuntimeError('no device')\n", "brokenplug")
    monkeypatch.setenv(detect.MXSML_LIB_ENV, str(fake_lib))
    result = detect.probe()
    assert result.platform == "maca", result.reason
    said = result.details["platform_plugins"]
    assert said["quietplug (quietplug:register)"] == "None"
    assert "RuntimeError: no device" in said["brokenplug (brokenplug:register)"]


def test_peer_excluded_by_vllm_plugins_is_ignored(fake_lib, monkeypatch, plugin_path):
    plugin_path("def register():\n    return 'fakeplug.FakePlatform'\n")
    monkeypatch.setenv(detect.MXSML_LIB_ENV, str(fake_lib))
    monkeypatch.setenv("VLLM_PLUGINS", "vllm_platform_ext")
    assert detect.probe().platform == "maca"


def test_reentrant_peer_terminates(fake_lib, monkeypatch, plugin_path):
    # A peer that asks us back (the same check we do): no recursion, and the peer wins.
    plugin_path("""
        calls = []
        def register():
            import vllm_platform_ext
            calls.append(vllm_platform_ext.register())
            return None if calls[-1] else 'fakeplug.FakePlatform'
    """)
    monkeypatch.setenv(detect.MXSML_LIB_ENV, str(fake_lib))
    result = detect.probe()
    assert result.platform is None
    assert sys.modules["fakeplug"].calls == [None]
