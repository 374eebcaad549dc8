"""Tokens/s on a tiny kit model with and without speculative decoding (CPU engine).

Same as ``vllm-platform-ext bench``; the code lives in ``vllm_platform_ext/verify/bench.py``.
"""
import sys

from vllm_platform_ext.verify.bench import main

if __name__ == "__main__":
    sys.exit(main())
