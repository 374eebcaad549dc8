"""Find the ``torch.ops._C*`` ops that a package's Python touches at import time (AST only;
nothing is imported).

"At import time" = code that runs while a module is imported: module-level statements, class
bodies, decorators and default values of functions; not function or lambda bodies. Found:

* ``access``: an attribute chain ``torch.ops.<ns>.<op>[.<overload>]`` with ``ns`` a kernel-library
  namespace (``_C``, ``_C_cache_ops``, ``_moe_C``, ``_rocm_C``, ...) (raises when the op is missing);
* ``probe``: ``hasattr``/``getattr`` of ``torch.ops.<ns>`` with a constant name (does not
  raise, but decides which guarded code runs);
* ``fake``: ``register_fake("<ns>::<op>")`` / ``impl_abstract(...)`` with a constant name.

Used by the schema test (the table must equal :func:`required_ops` of the installed vLLM)
and by ``ci/tools/compat_tables.py``, which derives a line's table from its wheel: the import-time
ops of its Python (:func:`scan_wheel`) with the schema strings of its kernel libraries
(:func:`wheel_library_schemas`).
"""
from __future__ import annotations

import ast
import pathlib
import re
import zipfile
from dataclasses import dataclass

_FAKE_REGISTRARS = {"register_fake", "impl_abstract"}


@dataclass(frozen=True)
class OpUse:
    kind: str  # "access" | "probe" | "fake"
    namespace: str
    op: str
    overload: str | None  # None: the packet itself (no overload named)
    file: str
    line: int


def _chain(node: ast.AST) -> list[str] | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return parts[::-1]
    return None


def _is_c_ns(name: str) -> bool:
    """vLLM's kernel-library namespaces: ``_C``, ``_C_cache_ops``, ``_moe_C``, ``_rocm_C``..."""
    return name.startswith("_C") or name.endswith("_C")


class _ImportTimeVisitor(ast.NodeVisitor):
    def __init__(self, file: str) -> None:
        self.file = file
        self.uses: list[OpUse] = []

    # Function bodies run later; their decorators and defaults run now.
    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        for dec in node.decorator_list:
            self.visit(dec)
        for default in [*node.args.defaults, *node.args.kw_defaults]:
            if default is not None:
                self.visit(default)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node: ast.Lambda) -> None:
        for default in [*node.args.defaults, *node.args.kw_defaults]:
            if default is not None:
                self.visit(default)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        chain = _chain(node)
        if chain and len(chain) >= 4 and chain[:2] == ["torch", "ops"] and _is_c_ns(chain[2]):
            overload = chain[4] if len(chain) >= 5 else None
            self.uses.append(OpUse("access", chain[2], chain[3], overload, self.file, node.lineno))
            return
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        fname = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
        args = node.args
        if fname in ("hasattr", "getattr") and len(args) >= 2 and isinstance(args[1], ast.Constant):
            chain = _chain(args[0])
            if chain and len(chain) == 3 and chain[:2] == ["torch", "ops"] and _is_c_ns(chain[2]):
                self.uses.append(OpUse("probe", chain[2], str(args[1].value), None, self.file, node.lineno))
        if fname in _FAKE_REGISTRARS and args and isinstance(args[0], ast.Constant):
            text = str(args[0].value)
            ns, sep, rest = text.partition("::")
            if sep and _is_c_ns(ns):
                op, _, overload = rest.partition(".")
                self.uses.append(OpUse("fake", ns, op, overload or "default", self.file, node.lineno))
        self.generic_visit(node)


# Every use the visitor finds is spelled with one of these (a cheap filter before parsing).
_MARKERS = ("torch.ops", *_FAKE_REGISTRARS)


def scan_source(source: str, file: str = "<string>") -> list[OpUse]:
    if not any(m in source for m in _MARKERS):
        return []
    visitor = _ImportTimeVisitor(file)
    visitor.visit(ast.parse(source, filename=file))
    return visitor.uses


def scan_tree(root: str | pathlib.Path) -> list[OpUse]:
    """Scan every ``.py`` file under ``root`` (file names relative to ``root``)."""
    root = pathlib.Path(root)
    uses: list[OpUse] = []
    for path in sorted(root.rglob("*.py")):
        try:
            source = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        try:
            uses.extend(scan_source(source, str(path.relative_to(root))))
        except SyntaxError:
            continue
    return uses


def required_ops(uses: list[OpUse]) -> set[tuple[str, str, str]]:
    """``(namespace, op, overload)`` that must exist for the scanned modules to import once
    the accessed ops are defined: every access (a bare packet access needs ``default``), plus
    the overload of every ``register_fake`` whose op is among the accessed ones (defining the
    op turns vLLM's ``hasattr`` guard true and runs that registration)."""
    accessed = {(u.namespace, u.op, u.overload or "default") for u in uses if u.kind == "access"}
    names = {(ns, op) for ns, op, _ in accessed}
    faked = {(u.namespace, u.op, u.overload or "default") for u in uses if u.kind == "fake" and (u.namespace, u.op) in names}
    return accessed | faked


def vllm_root() -> pathlib.Path:
    """The installed vLLM package directory (found without importing vLLM)."""
    import importlib.util

    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("vllm is not installed")
    return pathlib.Path(list(spec.submodule_search_locations)[0])


# --------------------------------------------------------------------------- a vLLM wheel

_SCHEMA = re.compile(r"([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)?)\((.*)\)\s*->\s*(.*)")
_PRINTABLE = re.compile(rb"[\x20-\x7e]{12,}")


def scan_wheel(wheel: str | pathlib.Path) -> list[OpUse]:
    """:func:`scan_tree` over the ``vllm/`` Python of a wheel file (nothing is installed)."""
    uses: list[OpUse] = []
    with zipfile.ZipFile(wheel) as z:
        for name in sorted(z.namelist()):
            if not (name.startswith("vllm/") and name.endswith(".py")):
                continue
            try:
                uses.extend(scan_source(z.read(name).decode("utf-8"), name[len("vllm/"):]))
            except (SyntaxError, UnicodeDecodeError):
                continue
    return uses


def library_namespace(member: str) -> str | None:
    """``vllm/_C_stable_libtorch.abi3.so`` -> ``_C``; ``vllm/_moe_C.abi3.so`` -> ``_moe_C``; None
    for anything that is not one of vLLM's own top-level kernel libraries."""
    parts = member.split("/")
    if len(parts) != 2 or parts[0] != "vllm" or not parts[1].endswith(".so"):
        return None
    stem = parts[1].split(".", 1)[0].removesuffix("_stable_libtorch")
    return stem if _is_c_ns(stem) and not stem.startswith("_flashmla") else None


def wheel_library_schemas(wheel: str | pathlib.Path) -> dict[tuple[str, str], str]:
    """``{(namespace, "op[.overload]"): schema}`` for every op schema string compiled into the
    wheel's kernel libraries (``TORCH_LIBRARY`` ``ops.def("...")`` literals), whitespace
    collapsed. Read from the binary, never loaded."""
    found: dict[tuple[str, str], str] = {}
    with zipfile.ZipFile(wheel) as z:
        for info in z.infolist():
            ns = library_namespace(info.filename)
            if ns is None:
                continue
            data = z.read(info)
            for m in _PRINTABLE.finditer(data):
                text = m.group().decode("ascii")
                if "->" not in text:
                    continue
                mm = _SCHEMA.fullmatch(text.strip())
                if mm:
                    found.setdefault((ns, mm.group(1)), re.sub(r"\s+", " ", text.strip()))
    return found
