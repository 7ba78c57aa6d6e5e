"""torch functions on TensorDicts: the ``__torch_function__`` table.

``torch.stack(tds)``, ``torch.cat(tds)``, ``torch.zeros_like(td)``, ``torch.where(c, td, x)``
and the others of ``HANDLED`` call the functions here; a torch function that is not in the
table returns ``NotImplemented`` (torch then raises ``TypeError``), as torch documents for
``__torch_function__`` overrides.

``out=`` writes into the leaves of an existing TensorDict (memory-mapped ones included: the
rows go straight into its maps, and a locked ``out`` works). Its shapes must already be the
result's: a map cannot grow.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .._core import dirty as _dirty
from .._core.index import key_path
from .._core.nodes import NTD_TYPES, TD, NonTensorData
from .._core.nontensor import NonTensorStack
from .._core.nontensor_options import capture_non_tensor_stack
from .._core.unbatched import UnbatchedTensor
from .._core.walk import KEEP, copy_tree, is_tree, map_leaves, walk_items, zip_leaves
from .._core.walk import leaves as _leaves
from . import inplace as _inplace
from . import shape


def _key_sets_match(tds: Sequence[TD], what: str) -> list[Any]:
    keys = tds[0].keys(include_nested=True)
    wanted = set(keys)
    for i, td in enumerate(tds[1:], 1):
        theirs = set(td.keys(include_nested=True))
        if theirs != wanted:
            raise KeyError(
                f"cannot {what} TensorDicts with different keys: td[0] has keys "
                f"{sorted(map(str, wanted - theirs))} that td[{i}] lacks, and td[{i}] has "
                f"{sorted(map(str, theirs - wanted))} that td[0] lacks"
            )
    return keys


def _stack_non_tensor(dim: int) -> Callable[..., Any]:
    """``torch.stack`` of non-tensor entries: a NonTensorStack along ``dim``, as tensordict 0.15
    gives (equal values too: they are one value per element once stacked)."""

    def join(*values: Any) -> Any:
        first = values[0]
        kind = type(first)
        if kind is not NonTensorData and kind in NTD_TYPES:
            # MetaData: one MetaData when every entry holds the very same object, as in
            # tensordict (identity, not equality); else a stack
            if all(type(v) is kind and v.data is first.data for v in values):
                return kind(first.data)
        elif capture_non_tensor_stack() and all(type(v) in NTD_TYPES for v in values):
            try:
                same = all(v.data is first.data or bool(v.data == first.data) for v in values)
            except Exception:
                same = False
            if same:
                return NonTensorData(first.data)
        return NonTensorStack(*values, stack_dim=dim)

    return join


def _cat_non_tensor(dim: int) -> Callable[..., Any]:
    """``torch.cat`` of non-tensor entries: one NonTensorData when every entry holds the same
    value, else a NonTensorStack of the values of every row."""

    def join(*values: Any) -> Any:
        first = values[0]
        if all(type(v) in NTD_TYPES for v in values):
            try:
                same = all(v.data is first.data or bool(v.data == first.data) for v in values)
            except Exception:
                same = False
            if same:
                return type(first)(first.data)
        return NonTensorStack.concatenate(values, dim)

    return join


def _common_device(tds: Sequence[TD]) -> torch.device | None:
    device = tds[0].device
    return device if all(td.device == device for td in tds[1:]) else None


def stack(tds: Sequence[TD], dim: int = 0, *, out: TD | None = None) -> TD:
    """``torch.stack``: a new batch dim ``dim`` (in ``[-batch_dims - 1, batch_dims]``).

    As tensordict 0.15 does by default, the result is a dense TensorDict of stacked leaves
    (not a lazy stack); batch sizes and keys must match.
    """
    tds = list(tds)
    if not tds:
        raise RuntimeError("list_of_tensordicts cannot be empty")
    first = tds[0]
    for i, td in enumerate(tds[1:], 1):
        if td.batch_size != first.batch_size:
            raise RuntimeError(
                "stacking tensordicts requires them to have congruent batch sizes, got "
                f"td[{i}].batch_size={td.batch_size} and td[0].batch_size={first.batch_size}"
            )
    n = first.batch_dims
    if dim < 0:
        dim += n + 1
    if not 0 <= dim <= n:
        raise IndexError(f"stack dim {dim} is out of range for batch size {first.batch_size}")
    try:
        _key_sets_match(tds, "stack")
    except KeyError as err:
        raise RuntimeError(
            "The sets of keys in the tensordicts to stack are exclusive. " + str(err.args[0])
        ) from None
    batch = list(first.batch_size)
    batch.insert(dim, len(tds))
    result = torch.Size(batch)
    if out is not None:
        return _into(
            out,
            result,
            tds,
            lambda leaves, sink: torch.stack(leaves, dim, out=sink),
            _stack_non_tensor(dim),
        )
    names = None
    # as tensordict: the names are kept only when every TensorDict has the same ones
    if first._names is not None and all(td._names == first._names for td in tds[1:]):
        names = list(first._names)
        names.insert(dim, None)
    return map_leaves(
        first,
        lambda *leaves: torch.stack(leaves, dim),
        *tds[1:],
        batch_size=result,
        device=first.device,
        non_tensor=_stack_non_tensor(dim),
        names=names,
        unbatched=lambda *values: UnbatchedTensor._stack_non_tensor(values, dim),
    )


def stack_classmethod(
    cls: type[TD], input: Sequence[TD], dim: int = 0, *, out: TD | None = None
) -> TD:
    """``TensorDict.stack(tds, dim)``: ``torch.stack`` of the TensorDicts, dense.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> TensorDict.stack([TensorDict({"a": torch.zeros(2)}, [2])] * 3).batch_size
    torch.Size([3, 2])
    """
    return stack(input, dim, out=out)


def lazy_stack_classmethod(
    cls: type[TD], input: Sequence[TD], dim: int = 0, *, out: TD | None = None, **kwargs: Any
) -> TD:
    """``TensorDict.lazy_stack`` and ``TensorDict.maybe_dense_stack``: this library's stacks
    are dense (see the differences page), so both are ``torch.stack``: the TensorDicts must
    have the same keys and shapes (tensordict returns a lazy stack when they do not).

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> a = TensorDict(x=torch.zeros(3), batch_size=[3])
    >>> type(TensorDict.maybe_dense_stack([a, a])).__name__
    'TensorDict'
    """
    return stack(input, dim, out=out)


def to_lazystack(td: TD, dim: int = 0) -> TD:
    """``td.to_lazystack(dim)``: tensordict's lazy stack of ``td.unbind(dim)``. This library's
    stacks are dense (see ``lazy_stack``), so it is a new TensorDict of the same leaves (no
    copy: writes through it reach ``td``, as through tensordict's lazy stack of views).

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict(a=torch.zeros(3, 2), batch_size=[3])
    >>> stacked = td.to_lazystack(0)
    >>> stacked["a"][0] += 1
    >>> td["a"][0]
    tensor([1., 1.])
    """
    n = td.batch_dims
    if not -n <= dim < n:
        raise IndexError(f"to_lazystack dim {dim} is out of range for batch size {td.batch_size}")
    return copy_tree(td)


def cat_classmethod(
    cls: type[TD], input: Sequence[TD], dim: int = 0, *, out: TD | None = None
) -> TD:
    """``TensorDict.cat(tds, dim)``: ``torch.cat`` of the TensorDicts along batch dim ``dim``.

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> TensorDict.cat([TensorDict({"a": torch.zeros(2)}, [2])] * 3).batch_size
    torch.Size([6])
    """
    return cat(input, dim, out=out)


def cat(tds: Sequence[TD], dim: int = 0, *, out: TD | None = None) -> TD:
    """``torch.cat``: the TensorDicts joined along batch dim ``dim``; keys must match."""
    tds = list(tds)
    if not tds:
        raise RuntimeError("list_of_tensordicts cannot be empty")
    first = tds[0]
    n = first.batch_dims
    if dim < 0:
        dim += n
    if not 0 <= dim < n:
        raise RuntimeError(
            f"dim must be in the range 0 <= dim < len(batch_size), got dim={dim} and "
            f"batch_size={list(first.batch_size)}"
        )
    for i, td in enumerate(tds[1:], 1):
        sizes = zip(td.batch_size, first.batch_size, strict=False)
        if td.batch_dims != n or any(a != b for d, (a, b) in enumerate(sizes) if d != dim):
            raise RuntimeError(
                f"cannot concatenate td[{i}] of batch size {td.batch_size} with td[0] of batch "
                f"size {first.batch_size} along dim {dim}"
            )
    _key_sets_match(tds, "concatenate")
    batch = list(first.batch_size)
    batch[dim] = sum(td.batch_size[dim] for td in tds)
    result = torch.Size(batch)
    if out is not None:
        _take_unbatched(out, tds[0])
        return _into(
            out,
            result,
            tds,
            lambda leaves, sink: torch.cat(leaves, dim, out=sink),
            _cat_non_tensor(dim),
        )
    return map_leaves(
        first,
        lambda *leaves: torch.cat(leaves, dim),
        *tds[1:],
        batch_size=result,
        device=_common_device(tds),
        non_tensor=_cat_non_tensor(dim),
        # the first one's payload, as tensordict 0.15.3 (also when the batch size stays, as
        # for one tree, where the default rule would concatenate the payloads along ``dim``)
        unbatched=lambda value, *_: value,
    )


def _take_unbatched(out: TD, first: TD) -> None:
    """``cat(..., out=out)``: an ``UnbatchedTensor`` entry of ``out`` becomes the first input's
    (the same payload), as tensordict 0.15.3 does (``stack`` keeps ``out``'s)."""
    for key, value in out._tensordict.items():
        theirs = first._tensordict.get(key)
        if type(value) is UnbatchedTensor and type(theirs) is UnbatchedTensor:
            out._tensordict[key] = theirs  # (its batch size is set when read)
        elif is_tree(value) and is_tree(theirs):
            _take_unbatched(value, theirs)


def _into(
    out: TD,
    result: torch.Size,
    tds: Sequence[TD],
    write: Callable[[list[torch.Tensor], torch.Tensor], Any],
    join: Callable[..., Any],
) -> TD:
    """Writes the stacked/concatenated leaves of ``tds`` into the leaves of ``out``; the
    non-tensor entries too (``join`` of the inputs' values, as without ``out``), as tensordict
    does: in a saved ``out`` they rewrite the entries' meta.json (``inplace.write_non_tensor``).
    """
    if out.batch_size != result:
        raise RuntimeError(
            f"out.batch_size and the result's batch size must match, got "
            f"out.batch_size={out.batch_size} and batch_size={result}"
        )
    keys = list(tds[0].keys(include_nested=True, leaves_only=True))
    for key in keys:
        if key not in out:
            raise KeyError(f"key {key!r} of the inputs is missing from out=")
    joined = []
    for key, value in walk_items(tds[0], True, False):
        if not _is_non_tensor(value):
            continue
        if key in out:  # (one that out= lacks is left out, as in tensordict)
            joined.append((key_path(key), join(*[td.get(key) for td in tds])))
    non_tensor = _inplace.checked_non_tensor(out, joined)  # checked before anything is written
    token = _dirty.mark(out)
    # the inputs' keys: entries of out= that the inputs lack are left as they are (as in
    # tensordict: a buffer with more keys than the steps stacked into it)
    for key in keys:
        sink = out.get(key)
        if type(sink) is UnbatchedTensor or not isinstance(sink, torch.Tensor):
            continue  # (an unbatched entry is the whole batch's: kept)
        leaves = [td.get(key) for td in tds]
        if not isinstance(leaves[0], torch.Tensor):
            raise KeyError(f"key {key!r}: a tensor entry of out= is not a tensor in the inputs")
        want = (*result, *leaves[0].shape[tds[0].batch_dims :])
        if tuple(sink.shape) != want:
            raise RuntimeError(
                f"out= has an entry of shape {tuple(sink.shape)} where the result has {want}"
            )
        write(leaves, sink)
    _dirty.confirm(out, _dirty.ALL, token)
    _inplace.write_non_tensor(out, non_tensor)
    return out


def _is_non_tensor(value: Any) -> bool:
    return type(value) in NTD_TYPES or type(value) is NonTensorStack


def _like(name: str) -> Callable[..., TD]:
    """``torch.<name>_like(td, ...)``: the leaf function on every leaf; lock kept."""
    fn = getattr(torch, name)

    def like(td: TD, *args: Any, **kwargs: Any) -> TD:
        device = kwargs.get("device", KEEP)
        if device is not KEEP and device is not None:
            device = torch.device(device)
        return map_leaves(td, lambda t: fn(t, *args, **kwargs), device=device, lock=True)

    like.__name__ = name
    like.__doc__ = f"``torch.{name}`` of every leaf (same keys, batch size, lock)."
    return like


zeros_like = _like("zeros_like")
ones_like = _like("ones_like")
empty_like = _like("empty_like")
full_like = _like("full_like")
rand_like = _like("rand_like")
randn_like = _like("randn_like")


def _expand_right(condition: torch.Tensor, leaf: torch.Tensor) -> torch.Tensor:
    extra = leaf.ndim - condition.ndim
    if extra < 0:
        raise RuntimeError(
            f"the condition of shape {tuple(condition.shape)} has more dims than an entry of "
            f"shape {tuple(leaf.shape)}"
        )
    cond = condition.reshape(*condition.shape, *(1,) * extra)
    return cond if cond.device == leaf.device else cond.to(leaf.device)


def where(
    td: TD,
    condition: torch.Tensor,
    other: Any,
    *,
    out: TD | None = None,
    pad: Any = None,
) -> TD:
    """Entries of ``td`` where ``condition`` (over the leading batch dims) is True, else of
    ``other`` (a TensorDict, a tensor or a number). With a TensorDict ``other``, a key only one
    side has takes ``pad`` on the other side (``KeyError`` without ``pad``).

    ``out`` receives the result in place (into its existing leaves, memory maps included).

    >>> import torch
    >>> from tensordict_rs import TensorDict
    >>> td = TensorDict({"a": torch.arange(3.0), "b": {"c": torch.ones(3)}}, [3])
    >>> td.where(torch.tensor([True, False, True]), 0.0)["a"]
    tensor([0., 0., 2.])
    """
    if not isinstance(condition, torch.Tensor):
        # torch.where's own argument check raises TypeError here, and so does the reference.
        raise TypeError(
            f"where() takes a boolean tensor as condition, got {type(condition).__name__}"
        )
    if is_tree(other):
        result = _where_trees(td, condition, other, pad)
    else:
        result = map_leaves(
            td, lambda t: torch.where(_expand_right(condition, t), t, other), lock=True
        )
    if out is None:
        return result
    # the non-tensor entries too, as tensordict (checked before anything is written)
    non_tensor = _inplace.non_tensor_entries(out, result, missing_ok=True)
    token = _dirty.mark(out)  # the rows a checkpoint copies (they were missed: an attack)
    for sink, value in zip_leaves(out, result):
        sink.copy_(value)
    _dirty.confirm(out, _dirty.ALL, token)
    _inplace.write_non_tensor(out, non_tensor)
    return out


def _pad_as(pad: Any, leaf: torch.Tensor) -> torch.Tensor:
    """``pad`` in the leaf's dtype, as tensordict casts it (``torch.where`` would promote the
    leaf: a bool leaf padded with 5 became int64)."""
    return torch.as_tensor(pad, device=leaf.device).to(leaf.dtype)


def _where_trees(td: TD, condition: torch.Tensor, other: TD, pad: Any) -> Any:
    out = type(td)._new_unchecked(td.batch_size, td.device)
    out._names = td._names  # as tensordict: the names of ``td``
    keys = list(td._tensordict) + [k for k in other._tensordict if k not in td._tensordict]
    for key in keys:
        mine: Any = td._get_str(key) if key in td._tensordict else None
        theirs: Any = other._get_str(key) if key in other._tensordict else None
        if (mine is None or theirs is None) and pad is None:
            raise KeyError(f"Key {key} not found and no pad value provided.")
        if is_tree(mine) or is_tree(theirs):
            present = mine if mine is not None else theirs
            empty = present.empty()
            if mine is None:
                value = _where_trees(theirs, ~condition, empty, pad)
            else:
                value = _where_trees(mine, condition, theirs if theirs is not None else empty, pad)
        elif isinstance(mine, (NonTensorData, NonTensorStack)) or isinstance(
            theirs, (NonTensorData, NonTensorStack)
        ):
            value = _where_non_tensor(condition, mine, theirs, td, other)
        elif mine is None:
            value = torch.where(_expand_right(condition, theirs), _pad_as(pad, theirs), theirs)
        elif theirs is None:
            value = torch.where(_expand_right(condition, mine), mine, _pad_as(pad, mine))
        else:
            value = torch.where(_expand_right(condition, mine), mine, theirs)
        out._tensordict[key] = value
    return out


def _where_non_tensor(condition: torch.Tensor, mine: Any, theirs: Any, td: TD, other: TD) -> Any:
    """Element-wise choice between two non-tensor entries (a missing one keeps the other's
    value): a NonTensorData when both hold the same value, else a NonTensorStack."""
    if mine is None or theirs is None:
        present = mine if mine is not None else theirs
        return present.clone(recurse=False)
    if type(mine) in NTD_TYPES:
        mine.batch_size, mine.device = td.batch_size, td.device
    if type(theirs) in NTD_TYPES:
        theirs.batch_size, theirs.device = other.batch_size, other.device
    if type(mine) in NTD_TYPES and type(theirs) in NTD_TYPES:
        try:
            if mine.data is theirs.data or bool(mine.data == theirs.data):
                return NonTensorData(mine.data)
        except Exception:
            pass
    return NonTensorStack.select(condition, mine, theirs)


def torch_where(condition: torch.Tensor, input: Any, other: Any, *, out: Any = None) -> Any:
    """``torch.where(condition, input, other)`` with a TensorDict as ``input`` or ``other``."""
    if not is_tree(input):
        return where(other, condition.logical_not(), input, out=out)
    return where(input, condition, other, out=out)


def _pairs_of_leaves(a: TD, b: Any) -> list[tuple[Any, Any]] | None:
    """The leaves of ``a`` and ``b`` side by side; None when the structures differ."""
    if not is_tree(b) or a.batch_size != b.batch_size:
        return None
    if set(a.keys(include_nested=True)) != set(b.keys(include_nested=True)):
        return None
    pairs = []
    for key, value in walk_items(a, True, True):
        theirs = b._get_str(key) if isinstance(key, str) else b._entry(key)
        pairs.append((value, theirs))
    for key, value in walk_items(a, True, False):
        if isinstance(value, NonTensorData):
            pairs.append((value.data, b._entry(key).data))
    return pairs


def equal(a: TD, b: Any) -> bool:
    """``torch.equal``: True when both have the same keys, shapes and values."""
    pairs = _pairs_of_leaves(a, b)
    if pairs is None:
        return False
    return all(torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y for x, y in pairs)


def allclose(
    a: TD, b: Any, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False
) -> bool:
    """``torch.allclose`` leaf by leaf (same keys and shapes required)."""
    pairs = _pairs_of_leaves(a, b)
    if pairs is None:
        return False
    for x, y in pairs:
        if isinstance(x, torch.Tensor):
            if x.shape != y.shape or not torch.allclose(x, y, rtol, atol, equal_nan):
                return False
        elif x != y and not (isinstance(x, float) and isinstance(y, float) and math.isclose(x, y)):
            return False
    return True


def _method(name: str) -> Callable[..., Any]:
    def call(td: Any, *args: Any, **kwargs: Any) -> Any:
        if not is_tree(td):
            raise TypeError(f"torch.{name} takes a TensorDict as its first argument")
        return getattr(td, name)(*args, **kwargs)

    call.__name__ = name
    return call


def _permute(td: TD, dims: Sequence[int]) -> TD:
    return shape.permute(td, *dims)


def _loss(name: str) -> Callable[..., Any]:
    fn = getattr(torch.nn.functional, name)

    def loss(input: Any, target: Any, *args: Any, reduction: str = "mean", **kwargs: Any) -> Any:
        """``torch.nn.functional.<name>`` leaf by leaf: a TensorDict of losses (batch size
        ``[]`` with ``reduction="mean"``/``"sum"``)."""
        if reduction not in ("none", "mean", "sum"):
            raise ValueError(
                f"Invalid reduction mode: {reduction}. Expected one of 'none', 'mean', 'sum'."
            )
        extra = {k: v for k, v in kwargs.items() if k == "beta"}
        rule: Callable[[torch.Size], Any] | None = (
            None if reduction == "none" else (lambda batch: [])
        )
        return map_leaves(
            input, lambda a, b: fn(a, b, reduction=reduction, **extra), target, node_batch=rule
        )

    loss.__name__ = name
    return loss


def _one_tree(value: Any, what: str) -> Any:
    if isinstance(value, (tuple, list)):
        if len(value) != 1:
            raise ValueError(f"torch.autograd.grad for TensorDict only supports a single {what}")
        value = value[0]
    return value


def _autograd_grad(outputs: Any, inputs: Any, grad_outputs: Any = None, **kwargs: Any) -> Any:
    """``torch.autograd.grad`` of a TensorDict of outputs with respect to a TensorDict of
    inputs: a TensorDict of gradients shaped like ``inputs`` (as tensordict does)."""
    outputs = _one_tree(outputs, "output")
    inputs = _one_tree(inputs, "input")
    if not is_tree(outputs):
        raise ValueError(
            "torch.autograd.grad for TensorDict only supports TensorDictBase as output"
        )
    if not is_tree(inputs):
        raise ValueError("torch.autograd.grad for TensorDict only supports TensorDictBase as input")
    out_leaves = [t for _, _, t in _leaves(outputs)]
    if grad_outputs is not None:
        grad_outputs = _one_tree(grad_outputs, "grad_output")
        grad_outputs = (
            [g for _, g in zip_leaves(outputs, grad_outputs)]
            if is_tree(grad_outputs)
            else grad_outputs
        )
    in_leaves = [t for _, _, t in _leaves(inputs)]
    grads = torch.autograd.grad(out_leaves, in_leaves, grad_outputs=grad_outputs, **kwargs)
    found = iter(grads)
    return map_leaves(inputs, lambda _: next(found))


def _reduction(name: str) -> Callable[..., Any]:
    def call(input: Any, *args: Any, **kwargs: Any) -> Any:
        return getattr(input, name)(*args, **kwargs)

    call.__name__ = name
    return call


HANDLED: dict[Callable[..., Any], Callable[..., Any]] = {
    torch.stack: stack,
    torch.cat: cat,
    torch.concat: cat,
    torch.concatenate: cat,
    torch.where: torch_where,
    torch.equal: equal,
    torch.allclose: allclose,
    torch.zeros_like: zeros_like,
    torch.ones_like: ones_like,
    torch.empty_like: empty_like,
    torch.full_like: full_like,
    torch.rand_like: rand_like,
    torch.randn_like: randn_like,
    torch.permute: _permute,
    torch.swapaxes: _method("transpose"),
    torch.swapdims: _method("transpose"),
    torch.maximum: lambda input, other, *, out=None: input.maximum(other),
    torch.nn.functional.l1_loss: _loss("l1_loss"),
    torch.nn.functional.mse_loss: _loss("mse_loss"),
    torch.nn.functional.smooth_l1_loss: _loss("smooth_l1_loss"),
    torch.autograd.grad: _autograd_grad,
    **{getattr(torch, name): _reduction(name) for name in ("sum", "mean", "std", "var")},
    torch.gather: lambda input, dim, index, *, out=None, sparse_grad=False: input.gather(
        dim, index, out=out
    ),
    **{
        getattr(torch, name): _method(name)
        for name in (
            "clone",
            "unbind",
            "split",
            "chunk",
            "squeeze",
            "unsqueeze",
            "reshape",
            "flatten",
            "unflatten",
            "transpose",
            "flip",
            "fliplr",
            "flipud",
            "roll",
            "rot90",
            "narrow",
            "movedim",
            "moveaxis",
            "tile",
            "repeat_interleave",
            "tensor_split",
            "masked_select",
            "broadcast_to",
            "atleast_1d",
            "atleast_2d",
            "atleast_3d",
        )
    },
}


def dispatch(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any] | None) -> Any:
    """The TensorDict implementation of torch function ``func``, or ``NotImplemented``."""
    handler = HANDLED.get(func)
    if handler is None:
        return NotImplemented
    return handler(*args, **(kwargs or {}))
