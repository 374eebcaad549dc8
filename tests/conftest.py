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
