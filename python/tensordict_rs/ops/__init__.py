"""TensorDict methods grouped by concern, each a set of functions over trees.

``TensorDict`` exposes them as methods; none of these modules imports ``tensordict.py``.
"""
