"""Tests of ``io/``: directories, ``.tdz`` archives, safetensors, progress bars, the
memory-map methods, compatibility with tensordict 0.15.3 on disk, and GIL release."""
