"""The keyword options of a save, written once: ``memmap_``, ``memmap``, ``save`` (``CopyOptions``)
and ``memmap_like`` (``LikeOptions``).

``SaveOptions`` holds every option with its default and is what the save path passes along. The
methods take ``prefix``, ``copy_existing`` and ``return_early`` (which decides the return type)
by name, and the other options as ``**options`` typed by a ``TypedDict``: the names each method
accepts, checked by mypy at every call. ``SaveOptions.given`` fills in the defaults and refuses
other names as Python would; ``keywords`` gives each method its full signature in ``help()``.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from typing import Any, ParamSpec, TypedDict, TypeVar, cast

P = ParamSpec("P")
R = TypeVar("R")
_KEYWORD = inspect.Parameter.KEYWORD_ONLY


@dataclasses.dataclass(frozen=True, kw_only=True)
class SaveOptions:
    """Every option of a save, with its default (the order is the signatures' order).

    >>> SaveOptions.given("memmap", False, {"num_threads": 2}, COPY).num_threads
    2
    """

    num_threads: int = 0  # writer threads (0: one per CPU)
    return_early: bool = False  # with num_threads > 1: return a TensorDictFuture at once
    existsok: bool = True  # False: refuse to replace an existing tree
    durable: bool = False  # fsync everything before returning
    reserve: bool = True  # memmap_like: reserve the space of new files (False: sparse)
    archive: bool | None = None  # one .tdz file (None: when the prefix ends in .tdz)
    compression: str | int | None = None  # archives: "deflate" compresses the leaves
    progress: bool = False  # a tqdm bar of the bytes written
    share_non_tensor: bool = False  # tensordict's option; True is refused (see persistence)
    robust_key: bool | None = None  # keys are always percent-encoded (False: only if no-op)

    @classmethod
    def given(
        cls, method: str, return_early: bool, options: Mapping[str, Any], accepted: frozenset[str]
    ) -> SaveOptions:
        """The options of a call of ``method`` (the defaults where not given); a name not in
        ``accepted`` (``COPY`` or ``LIKE``) is a ``TypeError``, as Python would raise it."""
        for name in options:
            if name not in accepted:
                raise TypeError(f"{method}() got an unexpected keyword argument {name!r}")
        return cls(return_early=return_early, **options)


class _Options(TypedDict, total=False):
    num_threads: int
    existsok: bool
    durable: bool
    archive: bool | None
    progress: bool
    share_non_tensor: bool
    robust_key: bool | None


class CopyOptions(_Options, total=False):
    """The options of ``memmap_``, ``memmap`` and ``save`` (besides ``return_early``)."""

    compression: str | int | None


class LikeOptions(_Options, total=False):
    """The options of ``memmap_like`` (besides ``return_early``)."""

    reserve: bool


# the names each method accepts as keywords: its TypedDict's, and return_early
COPY = frozenset({"return_early", *CopyOptions.__optional_keys__})
LIKE = frozenset({"return_early", *LikeOptions.__optional_keys__})


def keywords(names: frozenset[str]) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Gives a save method the signature it accepts, for ``help()`` and ``inspect``: its own
    parameters, then every option in ``names`` (``COPY`` or ``LIKE``), keyword-only, with its
    default, in ``SaveOptions``' order."""

    def decorate(fn: Callable[P, R]) -> Callable[P, R]:
        own = inspect.signature(fn).parameters.values()
        params = [p for p in own if p.kind is not p.VAR_KEYWORD and p.name not in names]
        params += [
            inspect.Parameter(f.name, _KEYWORD, default=f.default, annotation=f.type)
            for f in dataclasses.fields(SaveOptions)
            if f.name in names
        ]
        cast(Any, fn).__signature__ = inspect.signature(fn).replace(parameters=params)
        return fn

    return decorate
