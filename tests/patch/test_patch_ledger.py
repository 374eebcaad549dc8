"""The patch ledger (``vllm_platform_ext/patch/README.md``) is generated from ``patch.groups()`` by
``ci/tools/patch_ledger.py``: it fails here when a group changed and the file was not written again,
it is built without importing vLLM, and each group's recorded targets hold what its ``build``
patches on the installed vLLM."""
from __future__ import annotations

import os
import subprocess
import sys

from conftest import REPO, group_off, load_tool
from vllm_platform_ext import patch

ledger = load_tool("ci/tools/patch_ledger.py")


def test_readme_is_the_ledger_of_the_groups():
    diff = ledger.stale()
    assert not diff, f"vllm_platform_ext/patch/README.md is stale: run `python ci/tools/patch_ledger.py write`\n{diff}"


def test_every_group_has_a_section_with_its_record():
    text = ledger.render()
    for g in patch.groups():
        part = text.split(f"## `{g.name}`\n", 1)[1].split("\n## ", 1)[0]
        assert g.targets and all(f"`{t}`" in part for t in g.targets), g.name
        for field in (g.why, g.upstream, g.retire, g.build.__module__):
            assert field and field in part, (g.name, field)


def test_check_exits_1_on_a_stale_file(monkeypatch, tmp_path, capsys):
    (tmp_path / "vllm_platform_ext" / "patch").mkdir(parents=True)
    monkeypatch.setattr(ledger, "LEDGER", tmp_path / "vllm_platform_ext" / "patch" / "README.md")
    monkeypatch.setattr(ledger, "ROOT", tmp_path)
    assert ledger.main(["check"]) == 1
    assert "is stale" in capsys.readouterr().err
    assert ledger.main(["write"]) == 0 and ledger.main(["check"]) == 0


def test_ledger_builds_without_vllm(tmp_path):
    """The groups and the ledger import no vLLM: ``import vllm`` raises in this process."""
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "__init__.py").write_text("raise ImportError('vLLM is blocked in this test')\n")
    code = ("import sys\nsys.path.insert(0, 'ci/tools')\nimport patch_ledger\ntext = patch_ledger.render()\n"
            "assert not any(k == 'vllm' or k.startswith('vllm.') for k in sys.modules), 'vllm got imported'\n"
            "print(text.count('\\n## '))\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), REPO]))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert int(out.stdout.split()[-1]) == len(patch.groups())


def test_recorded_targets_hold_what_build_patches_here():
    """On the installed vLLM, every group its probe keeps builds patches whose targets the group records."""
    built = 0
    for g in patch.groups():
        # Probed and built as the bootstrap does, on vLLM's own functions: vLLM code an earlier file ran in this
        # process may have loaded the plugin and left the group on (9ac7c19's CI: spec.draft_ids_in_vocab's
        # contract check then read its own wrapper's parameters).
        with group_off(g):
            if g.skip_if() is not None:
                continue
            targets = {p.target for p in g.build()}
        assert targets <= set(g.targets), (g.name, sorted(targets - set(g.targets)))
        built += 1
    assert built >= 1


def test_ledger_holds_with_the_groups_already_applied():
    """The check above, run after vLLM's plugin loader left every group on in this process (the order
    CI's xdist workers may meet): it takes each group off, probes and builds it, and puts it back."""
    from vllm_platform_ext import patching

    applied = []
    for g in patch.groups():
        if g.skip_if() is None and not patching.applied_targets(g.name):
            patching.apply(g.name, list(g.build()))
            applied.append(g.name)
    try:
        assert patching.applied_targets("spec.draft_ids_in_vocab"), "the draft-ids group should apply on this vLLM"
        before = sorted(patching.applied_targets())
        test_recorded_targets_hold_what_build_patches_here()
        assert sorted(patching.applied_targets()) == before, "the check left the groups as it found them"
    finally:
        for name in applied:
            patching.restore(name)
