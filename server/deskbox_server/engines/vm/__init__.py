"""The ``vm`` engine: each session in a QEMU microVM with its own guest kernel (engine.py)."""
