"""The test suite: one folder per part of the package (see each folder's docstring)."""
