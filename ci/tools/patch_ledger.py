"""The patch ledger, ``vllm_platform_ext/patch/README.md``, generated from the patch groups
(``vllm_platform_ext.patch.groups()``): one section per group, in the order the bootstrap applies
them, with the module it lives in, what it patches, why, its upstream status, what retires it and
the probe that skips it. Reading the groups imports neither vLLM nor a probe's answer: the ledger is
the same on every host.

    python ci/tools/patch_ledger.py write   # write vllm_platform_ext/patch/README.md
    python ci/tools/patch_ledger.py check   # exit 1, with the diff, when the file is stale
"""
from __future__ import annotations

import argparse
import difflib
import os
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from vllm_platform_ext import patch  # noqa: E402
from vllm_platform_ext.patching import PatchGroup  # noqa: E402

LEDGER = ROOT / "vllm_platform_ext" / "patch" / "README.md"
_NO_PROBE = PatchGroup.__dataclass_fields__["skip_if"].default  # a group without a probe keeps it


def module_file(module: str) -> str:
    """``vllm_platform_ext/patch/gdn_cpu.py`` for ``vllm_platform_ext.patch.gdn_cpu``."""
    path = ROOT.joinpath(*module.split("."))
    return str((path / "__init__.py" if path.is_dir() else path.with_suffix(".py")).relative_to(ROOT))


def probe_line(group: PatchGroup) -> str:
    """The group's skip probe, named (never called: its answer is the installed vLLM's)."""
    fn = group.skip_if
    if fn is _NO_PROBE:
        return "none: applied wherever its targets exist"
    doc = (fn.__doc__ or "").strip().split("\n\n")[0]
    doc = " ".join(doc.split()).split(". ")[0].rstrip(".")  # the first sentence
    said = f" ({doc})" if doc else ""
    return f"`{fn.__module__}.{fn.__qualname__}()`{said}: a reason returned -> skipped, recorded in the report"


def section(group: PatchGroup) -> list[str]:
    module = group.build.__module__
    targets = [f"  - `{t}`" for t in group.targets] or ["  - (not recorded)"]
    return [f"## `{group.name}`", "",
            f"- **module**: [`{module}`]({os.path.relpath(module_file(module), LEDGER.parent.relative_to(ROOT))})",
            "- **patches**:", *targets,
            f"- **why**: {group.why}",
            f"- **upstream**: {group.upstream or '(not recorded)'}",
            f"- **retired by**: {group.retire or '(not recorded)'}",
            f"- **skip probe**: {probe_line(group)}", ""]


def render(groups: list[PatchGroup] | None = None) -> str:
    groups = patch.groups() if groups is None else groups
    lines = ["# Patch ledger", "",
             "Every patch group the plugin applies to vLLM, in the bootstrap's order. Generated from",
             "`vllm_platform_ext.patch.groups()` by `python ci/tools/patch_ledger.py write`: edit the groups, not this",
             "file (`tests/patch/test_patch_ledger.py` fails when it is stale). A group is switched off with",
             "`VLLM_PLATFORM_EXT_DISABLE=<name>`; `vllm-platform-ext doctor` prints what each did on the installed vLLM.",
             "", "| group | module | targets |", "|---|---|---|"]
    lines += [f"| [`{g.name}`](#{anchor(g.name)}) | `{g.build.__module__}` | {len(g.targets)} |" for g in groups]
    lines.append("")
    for g in groups:
        lines += section(g)
    return "\n".join(lines).rstrip() + "\n"


def anchor(name: str) -> str:
    """GitHub's heading anchor of ``## `name` ``: lower case, punctuation other than - and _ dropped."""
    return "".join(c for c in name.lower() if c.isalnum() or c in "-_ ").replace(" ", "-")


def stale(text: str | None = None) -> str:
    """The diff of the ledger on disk against a fresh one; empty when up to date."""
    want = render() if text is None else text
    have = LEDGER.read_text() if LEDGER.is_file() else ""
    rel = str(LEDGER.relative_to(ROOT))
    return "".join(difflib.unified_diff(have.splitlines(True), want.splitlines(True), f"{rel} (on disk)",
                                        f"{rel} (from patch.groups())"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("command", choices=("write", "check"))
    a = ap.parse_args(argv)
    if a.command == "write":
        LEDGER.write_text(render())
        print(f"wrote {LEDGER.relative_to(ROOT)}")
        return 0
    diff = stale()
    if diff:
        print(f"{LEDGER.relative_to(ROOT)} is stale: run `python ci/tools/patch_ledger.py write`\n{diff}",
              file=sys.stderr)
        return 1
    print(f"{LEDGER.relative_to(ROOT)} is up to date")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
