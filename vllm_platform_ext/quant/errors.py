"""What a hardened quantization config's ``register`` raises to stay out of vLLM's registry: below
both the configs (:mod:`.moe_wna16`) and the package's ``register``, which reports it as skipped."""
from __future__ import annotations


class NotRegistered(Exception):
    """A config this plugin chose not to register (the reason is the message)."""
