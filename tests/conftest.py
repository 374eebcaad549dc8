import os
import subprocess
import sys

import pytest

# Tests never reach a model hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


def run_python(code: str, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter (fresh plugin state), return the completed process."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full_env, timeout=timeout)


@pytest.fixture
def python():
    return run_python


def cpu_path_params():
    """vllm-cpu's two x86 paths as pytest params: ``no-avx512bf16`` runs on every host (forced
    where the CPU has AVX512-BF16), ``avx512bf16`` is skipped, with the reason, where it has not."""
    from vllm_platform_ext.verify.cpu_paths import PATHS, unavailable_reason

    out = []
    for path in PATHS:
        reason = unavailable_reason(path)
        out.append(pytest.param(path, id=path, marks=pytest.mark.skipif(reason is not None, reason=str(reason))))
    return out


@pytest.fixture(params=cpu_path_params())
def cpu_path_env(request):
    """``(path, env additions)`` making an engine subprocess take that vllm-cpu path."""
    from vllm_platform_ext.verify.cpu_paths import env_for

    return request.param, env_for(request.param)
