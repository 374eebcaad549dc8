"""The patch primitive: missing targets, double patches, restore, atomic groups, strict mode."""
import types

import pytest

from vllm_platform_ext import patching
from vllm_platform_ext.patching import Patch, PatchConflict, PatchGroup, PatchTargetMissing
from vllm_platform_ext.report import Report, Status


@pytest.fixture(autouse=True)
def _clean():
    yield
    patching.restore_all()


class Base:
    def greet(self):
        return "base"


class Target(Base):
    value = 1

    def hello(self):
        return "hello"

    @staticmethod
    def stat(x):
        return x + 1

    @classmethod
    def klass(cls):
        return cls.__name__


T = f"{__name__}:Target"


def test_patch_replaces_and_keeps_original_then_restores():
    orig = Target.hello
    patching.apply("g", [Patch(T + ".hello", lambda o: lambda self: "patched " + o(self))])
    assert Target().hello() == "patched hello"
    assert patching.original(T + ".hello") is orig
    assert patching.is_patched(T + ".hello")
    assert getattr(Target.hello, patching.MARK) == "g"
    assert patching.restore("g") == [T + ".hello"]
    assert Target.hello is orig and Target().hello() == "hello"
    assert not patching.is_patched(T + ".hello")


def test_missing_module_attribute_and_class_are_reported():
    with pytest.raises(PatchTargetMissing, match="cannot be imported"):
        patching.apply("g", [Patch("no_such_module_xyz:f", lambda o: o)])
    with pytest.raises(PatchTargetMissing, match="'nope' does not exist"):
        patching.apply("g", [Patch(T + ".nope", lambda o: o)])
    with pytest.raises(PatchTargetMissing, match="Missing does not exist"):
        patching.apply("g", [Patch(f"{__name__}:Missing.attr", lambda o: o)])
    with pytest.raises(patching.PatchError, match="must look like"):
        patching.apply("g", [Patch("no_colon", lambda o: o)])


def test_double_patch_is_an_error_and_leaves_first_in_place():
    patching.apply("first", [Patch(T + ".hello", lambda o: lambda self: "first")])
    with pytest.raises(PatchConflict, match="already patched by 'first'"):
        patching.apply("second", [Patch(T + ".hello", lambda o: lambda self: "second")])
    assert Target().hello() == "first"
    with pytest.raises(PatchConflict, match="twice"):
        patching.apply("dup", [Patch(T + ".value", lambda o: 2), Patch(T + ".value", lambda o: 3)])
    assert Target.value == 1


def test_group_is_atomic_when_a_later_target_is_missing():
    with pytest.raises(PatchTargetMissing):
        patching.apply("g", [Patch(T + ".hello", lambda o: lambda self: "x"), Patch(T + ".absent", lambda o: o)])
    assert Target().hello() == "hello" and not patching.applied_targets("g")


def test_group_is_atomic_when_a_factory_raises():
    def boom(o):
        raise RuntimeError("factory failed")

    with pytest.raises(RuntimeError, match="factory failed"):
        patching.apply("g", [Patch(T + ".hello", lambda o: lambda self: "x"), Patch(T + ".value", boom)])
    assert Target().hello() == "hello" and Target.value == 1 and not patching.applied_targets("g")


def test_static_and_class_methods_keep_their_kind():
    patching.apply("g", [Patch(T + ".stat", lambda f: lambda x: f(x) * 10),
                         Patch(T + ".klass", lambda f: lambda cls: "k:" + f(cls))])
    assert Target.stat(1) == 20 and Target().stat(1) == 20
    assert Target.klass() == "k:Target"
    patching.restore("g")
    assert Target.stat(1) == 2 and Target.klass() == "Target"
    assert isinstance(vars(Target)["stat"], staticmethod)


def test_inherited_attribute_restore_deletes_the_override():
    patching.apply("g", [Patch(T + ".greet", lambda o: lambda self: "override")])
    assert Target().greet() == "override" and Base().greet() == "base"
    patching.restore("g")
    assert "greet" not in vars(Target) and Target().greet() == "base"


def test_module_attribute():
    mod = types.ModuleType("fake_mod_for_patch")
    mod.f = lambda: 1
    import sys

    sys.modules["fake_mod_for_patch"] = mod
    try:
        patching.apply("g", [Patch("fake_mod_for_patch:f", lambda o: lambda: o() + 1)])
        assert mod.f() == 2
        patching.restore("g")
        assert mod.f() == 1
    finally:
        del sys.modules["fake_mod_for_patch"]


def _group(name, target, skip=None):
    return PatchGroup(name, "test", lambda: [Patch(target, lambda o: lambda self: "grp")], lambda: skip)


def test_apply_group_records_applied_skipped_and_failed(monkeypatch):
    monkeypatch.delenv(patching.STRICT_ENV, raising=False)
    r = Report()
    assert patching.apply_group(_group("ok", T + ".hello"), r)
    assert not patching.apply_group(_group("missing", T + ".absent"), r)
    assert not patching.apply_group(_group("upstream-has-it", T + ".value", skip="upstream fixed"), r)
    assert not patching.apply_group(_group("conflict", T + ".hello"), r)
    got = {e.name: (e.status, e.detail) for e in r.entries}
    assert got["ok"][0] == Status.APPLIED and T + ".hello" in got["ok"][1]
    # the probe gave no reason to skip, so the fix is needed: its missing target is a failure
    assert got["missing"][0] == Status.FAILED and "needed" in got["missing"][1] \
        and "target missing" in got["missing"][1] and "'absent'" in got["missing"][1]
    assert got["upstream-has-it"] == (Status.SKIPPED, "upstream fixed")
    assert got["conflict"][0] == Status.FAILED and "PatchConflict" in got["conflict"][1]
    assert r.has_failure("patch")


def test_not_needed_stays_a_skip_even_when_the_target_is_gone(monkeypatch):
    """A renamed target must not turn "not needed" into a failure: the probe runs first and
    the group's patches are never built."""
    monkeypatch.delenv(patching.STRICT_ENV, raising=False)
    built = []

    def build():
        built.append(1)
        return [Patch(T + ".renamed_away", lambda o: o)]

    r = Report()
    group = PatchGroup("gone-but-fixed", "test", build, lambda: "not needed: upstream has the fix")
    assert not patching.apply_group(group, r)
    assert r.find("patch", "gone-but-fixed").status == Status.SKIPPED and not built
    assert not r.has_failure("patch")


def test_strict_mode_turns_missing_targets_and_errors_into_raises(monkeypatch):
    monkeypatch.setenv(patching.STRICT_ENV, "1")
    r = Report()
    with pytest.raises(PatchTargetMissing):
        patching.apply_group(_group("missing", T + ".absent"), r)
    assert r.find("patch", "missing").status == Status.FAILED
    # a feature probe saying "not needed" is not a failure, even in strict mode
    assert not patching.apply_group(_group("not-needed", T + ".value", skip="upstream fixed"), r)
    assert r.find("patch", "not-needed").status == Status.SKIPPED


def test_disable_env_skips_a_group(monkeypatch):
    monkeypatch.setenv(patching.DISABLE_ENV, "other, off")
    r = Report()
    assert not patching.apply_group(_group("off", T + ".hello"), r)
    assert Target().hello() == "hello"
    assert r.find("patch", "off").detail == f"disabled by {patching.DISABLE_ENV}"


def test_add_missing_adds_then_restore_removes():
    class Owner:
        present = 1

    mod = types.ModuleType("vpe_add_missing_mod")
    mod.Owner = Owner
    import sys

    sys.modules[mod.__name__] = mod
    try:
        patching.apply("add", [Patch(f"{mod.__name__}:Owner.field", lambda orig: 7, add_missing=True)])
        assert Owner.field == 7 and Owner().field == 7
        with pytest.raises(patching.PatchError, match="no original"):
            patching.original(f"{mod.__name__}:Owner.field")
        patching.restore("add")
        assert not hasattr(Owner, "field")
        with pytest.raises(PatchConflict, match="exists"):  # never replaces what is there
            patching.apply("add2", [Patch(f"{mod.__name__}:Owner.present", lambda orig: 2, add_missing=True)])
        assert Owner.present == 1 and not patching.applied_targets("add2")
        with pytest.raises(PatchTargetMissing):  # the owner itself must exist
            patching.apply("add3", [Patch(f"{mod.__name__}:Nobody.field", lambda orig: 2, add_missing=True)])
    finally:
        del sys.modules[mod.__name__]


def test_carries_names_the_group_whose_replacement_a_class_holds():
    """``carries``: how a group landing on several classes skips one it already reached; it sees
    through staticmethod/classmethod and inheritance, and names only the group that patched."""
    assert not patching.carries(Target, "hello", "g")
    patching.apply("g", [Patch(T + ".hello", lambda o: lambda self: "x"), Patch(T + ".stat", lambda o: o),
                         Patch(T + ".klass", lambda o: o)])
    assert all(patching.carries(Target, a, "g") for a in ("hello", "stat", "klass"))
    assert not patching.carries(Target, "hello", "other") and not patching.carries(Target, "greet", "g")
    sub = type("Sub", (Target,), {})
    assert patching.carries(sub, "hello", "g") and not patching.carries(sub, "absent", "g")
    patching.restore("g")
    assert not patching.carries(Target, "hello", "g")
