"""Tests of ``ops/``: shape, keys, element-wise, apply, torch functions, devices, the
batched gather and the streaming device path."""
