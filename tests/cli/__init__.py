"""Tests of the ``tensordict-rs`` command line (``cli/``), run as a subprocess."""
