"""Verification kit: tiny local checkpoints, a transformers float32 audit of the engine's
tokens, and the ``vllm-platform-ext verify`` runner (``runner.main(argv) -> int``)."""
