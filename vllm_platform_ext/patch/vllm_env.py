"""Make vLLM's environment validation know this plugin's ``VLLM_PLATFORM_EXT_*`` switches.

Every vLLM line served checks each ``VLLM_*`` variable against
``vllm.envs.environment_variables`` when it builds the engine config
(``EngineArgs.create_engine_config``): 0.22-0.26 through ``vllm.envs.validate_environ``, 0.32+
through ``Platform.validate_environ``. An unknown one logs "Unknown vLLM environment variable
detected" and, with ``fail_on_environ_validation=True``, stops vLLM. ``MacaPlatform`` exempts
our prefix in its override, but only 0.32+ call that hook; on 0.22-0.26 and on vLLM's own
platforms (CPU, CUDA, ROCm, ...) the plugin's switches would trip the check. vLLM loads general plugins in ``EngineArgs.__post_init__``, before that
check, so replacing the dict with a copy that also holds our names (each read lazily from the
environment, like vLLM's own entries) is enough. An unknown ``VLLM_PLATFORM_EXT_*`` typo stays
unknown to vLLM, and :mod:`vllm_platform_ext.envs` names it.
"""
from __future__ import annotations

import os

from vllm_platform_ext.patching import Patch, PatchGroup

NAME = "vllm_env.own_switches"
TARGET = "vllm.envs:environment_variables"


def _getter(name: str):
    return lambda: os.environ.get(name)


def with_own_switches(original: dict) -> dict:
    from vllm_platform_ext.envs import KNOWN  # the user switches and the dev ones (envs.SWITCHES, envs.DEV_SWITCHES)

    return {**original, **{name: _getter(name) for name in KNOWN if name not in original}}


def validators() -> list[str]:
    """The environment checks this vLLM has (each reads ``vllm.envs.environment_variables``)."""
    from vllm import envs

    found = ["vllm.envs.validate_environ"] if hasattr(envs, "validate_environ") else []
    try:
        from vllm.platforms.interface import Platform

        if hasattr(Platform, "validate_environ"):
            found.append("Platform.validate_environ")
    except Exception:
        pass
    return found


def _skip_if() -> str | None:
    from vllm import envs
    from vllm_platform_ext.envs import KNOWN

    if not validators():
        return "not needed: this vLLM does not validate VLLM_* variables"

    if all(name in getattr(envs, "environment_variables", {}) for name in KNOWN):
        return "not needed: vllm.envs already knows every VLLM_PLATFORM_EXT_* switch"
    return None


GROUPS = [
    PatchGroup(
        name=NAME,
        why="vLLM's environment validation (vllm.envs.validate_environ on 0.22-0.26, Platform.validate_environ "
            "on 0.32+) flags every VLLM_PLATFORM_EXT_* switch as an unknown vLLM variable (a warning, or a refusal "
            "to start with fail_on_environ_validation=True); adds the plugin's switches to "
            "vllm.envs.environment_variables",
        build=lambda: [Patch(TARGET, with_own_switches)],
        targets=(TARGET,),
        skip_if=_skip_if,
        upstream="no upstream hook for general plugins to declare environment variables (vLLM 0.32/0.33: "
                 "Platform.additional_env_vars is for the active platform only; 0.22-0.26 have none)",
        retire="when vLLM lets general plugins declare their variables (or exempts plugin prefixes); "
               "tests/test_bad_input_switches.py::test_vllm_env_validation_accepts_own_switches",
    ),
]
