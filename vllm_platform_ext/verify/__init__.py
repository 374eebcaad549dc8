"""The ``vllm-platform-ext verify`` and ``bench`` commands (``runner.main(argv) -> int``,
``bench.main(argv) -> int``), built on :mod:`vllm_platform_ext.testing`."""
