"""``ci/tools/mutations.py`` stays runnable: each planted bug's fix site occurs exactly once in the
tree as it is (so a refactor that moves a site is named, not silently skipped), each names test
files that exist, and ``--tree`` writes a copy with the one bug in it and nothing else changed."""
from __future__ import annotations

import importlib.util
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("mutations", ROOT / "ci" / "tools" / "mutations.py")
mutations = importlib.util.module_from_spec(spec)
sys.modules["mutations"] = mutations
spec.loader.exec_module(mutations)


@pytest.mark.parametrize("m", mutations.MUTATIONS, ids=lambda m: m.name)
def test_fix_site_once_and_tests_exist(m):
    text = (ROOT / m.path).read_text()
    assert text.count(m.fixed) == 1, f"{m.name}: fix site found {text.count(m.fixed)} times in {m.path}"
    assert m.broken != m.fixed and m.tests
    for t in m.tests:
        assert (ROOT / t.split("::")[0]).is_file(), f"{m.name}: no test file {t}"


def test_tree_writes_the_one_mutation(tmp_path):
    m = next(x for x in mutations.MUTATIONS if x.name == "tq-verify-causal-off-by-one")
    out = tmp_path / "tree"
    proc = subprocess.run([sys.executable, str(ROOT / "ci" / "tools" / "mutations.py"), m.name, "--tree", str(out)],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    mutated = (out / m.path).read_text()
    assert mutated == (ROOT / m.path).read_text().replace(m.fixed, m.broken)
    # the rest of the package is the committed tree's
    assert (out / "vllm_platform_ext" / "ops" / "gdn" / "torch_ops.py").read_text() == subprocess.run(
        ["git", "show", "HEAD:vllm_platform_ext/ops/gdn/torch_ops.py"], cwd=ROOT, capture_output=True, text=True).stdout
    again = subprocess.run([sys.executable, str(ROOT / "ci" / "tools" / "mutations.py"), m.name, "--tree", str(out)],
                           capture_output=True, text=True, cwd=ROOT)
    assert again.returncode == 2 and "not empty" in again.stderr


def test_apply_puts_the_bug_in_place_once(tmp_path):
    m = next(x for x in mutations.MUTATIONS if x.name == "tq-rows-causal-off-by-one")
    site = tmp_path / "site"
    (site / m.path).parent.mkdir(parents=True)
    (site / m.path).write_text((ROOT / m.path).read_text())
    run = lambda: subprocess.run([sys.executable, str(ROOT / "ci" / "tools" / "mutations.py"), m.name, "--apply",  # noqa: E731
                                  str(site)], capture_output=True, text=True, cwd=ROOT)
    assert run().returncode == 0
    assert (site / m.path).read_text() == (ROOT / m.path).read_text().replace(m.fixed, m.broken)
    again = run()  # the fix site is gone: named, nothing written twice
    assert again.returncode != 0 and "exactly once" in (again.stdout + again.stderr)
