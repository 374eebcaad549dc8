"""vLLM-metax beside this plugin: which of its branches is installed, and where each fix lands.

vLLM-metax (github MetaX-MACA/vLLM-metax) is what most MetaX users run. Its version is its
branch's vLLM release (``setup.py`` ``fixed_version_scheme``), so the installed distribution's
version names the branch. ``targets()`` resolves, live from vLLM's registries and classes, the
places beside vLLM-metax that our fixes must land on or leave alone (``doctor`` prints them):

* the platform class vLLM resolved (vLLM-metax's ``MacaPlatform``; ours steps aside);
* GDN: the ``ChunkGatedDeltaRule`` custom op vLLM-metax master registers with ``register_oot``
  (this plugin registers none: a second ``register_oot`` of the name asserts "Duplicate op
  name" inside vLLM's plugin loader), and the layer method ``gdn.cuda_zero_draft_spec_rows``
  wraps, which calls that op;
* spec-decode batch order: the ``GPUModelRunner._may_reorder_batch`` in place (vLLM-metax's
  ``patch/performance/speculative_decode_perf.py`` replaces it: decodes sorted by query length).

Nothing here imports vLLM-metax; every lookup reports "unavailable" with the reason instead of
raising.
"""
from __future__ import annotations

from vllm_platform_ext.detect import dist_version

DIST = "vllm-metax"
# vLLM-metax's branch per vLLM line (its README: one release/dev branch per vLLM release;
# master follows the newest, 0.26 at its 2026-08 snapshot)
BRANCHES = {
    (0, 22): "releases/v0.22.0",
    (0, 23): "v0.23.0-dev",
    (0, 24): "v0.24.0-dev",
    (0, 25): "v0.25.0-dev",
    (0, 26): "master",
}
# the Triton each branch pins (requirements/maca_private.txt: triton==X+metax...)
TRITON = {"releases/v0.22.0": "3.6", "v0.23.0-dev": "3.0", "v0.24.0-dev": "3.6", "v0.25.0-dev": "3.6",
          "master": "3.6"}
GDN_CHUNK_OP = "ChunkGatedDeltaRule"


def branch_for(version: str) -> str:
    """The vLLM-metax branch a version belongs to (``0.23.0.dev3+g...`` -> ``v0.23.0-dev``)."""
    parts = version.split("+")[0].split(".")
    try:
        key = (int(parts[0]), int(parts[1]))
    except (IndexError, ValueError):
        return f"unknown (version {version!r} is not X.Y...)"
    if key in BRANCHES:
        return BRANCHES[key]
    newest = max(BRANCHES)
    return f"unknown (vLLM-metax {key[0]}.{key[1]} is not a branch this plugin was checked against; " \
           f"nearest checked: {BRANCHES[newest] if key > newest else BRANCHES[min(BRANCHES)]})"


def line() -> dict | None:
    """``{"version", "branch", "triton_pin"}`` of the installed vLLM-metax, or None."""
    version = dist_version(DIST) or dist_version("vllm_metax")
    if version is None:
        return None
    branch = branch_for(version)
    return {"version": version, "branch": branch, "triton_pin": TRITON.get(branch, "?")}


def _qualname(obj) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', type(obj).__qualname__)}"


def _row(fix: str, lookup) -> list[str]:
    try:
        target, state = lookup()
    except Exception as exc:  # doctor reports, it does not crash
        return [fix, "-", f"unavailable: {type(exc).__name__}: {exc}"]
    return [fix, target, state]


def _platform():
    from vllm.platforms import current_platform

    cls = type(current_platform)
    ours = cls.__module__.startswith("vllm_platform_ext")
    return _qualname(cls), "ours" if ours else "another plugin's (ours returned None)"


def _gdn_chunk_op():
    from vllm.model_executor import custom_op

    registry = getattr(custom_op, "op_registry_oot", None) or getattr(custom_op.CustomOp, "op_registry_oot", {})
    oot = registry.get(GDN_CHUNK_OP)
    if oot is None:
        return f"{GDN_CHUNK_OP} (vLLM's)", "no out-of-tree class registered (this plugin registers none)"
    return _qualname(oot), "another plugin's register_oot, kept (this plugin registers none)"


def _gdn_layer():
    from vllm_platform_ext import patching
    from vllm_platform_ext.patch import gdn_cuda

    reason = gdn_cuda.skip_reason()
    core = gdn_cuda.targets()[2] if reason is None else None
    if core is None:
        return "-", f"not needed / skipped: {reason}"
    return core.replace(":", "."), "patched" if patching.is_patched(core) else "not patched (group skipped or disabled)"


def _batch_reorder():
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    fn = GPUModelRunner._may_reorder_batch
    theirs = not fn.__module__.startswith("vllm.")
    return _qualname(fn), ("replaced by another plugin (our fixes audited in its order: tests/metax/test_metax_batch_reorder.py)" if theirs
                           else "vLLM's")


def targets() -> list[list[str]]:
    """``[fix, target, state]`` rows beside another platform plugin (see the module doc)."""
    return [
        _row("platform", _platform),
        _row("gdn.chunk_op", _gdn_chunk_op),
        _row("gdn.cuda_zero_draft_spec_rows", _gdn_layer),
        _row("spec_decode.batch_reorder", _batch_reorder),
    ]
