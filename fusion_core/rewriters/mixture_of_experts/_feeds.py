"""The inputs a block of experts and its router are run on by the proof (``_proof.py``):
random tokens and logits, the logits of a class no expert has paired with each expert,
the sizes of the tokens' symbolic axes, zeros shaped like what is read only by its shape,
and the logits shaped as a router run alone reads them."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.ir import constant_array
from autofusion.fusion_core.rewriters.mixture_of_experts._block import Block
from autofusion.fusion_core.rewriters.mixture_of_experts._walk import external

__all__ = ["TOKENS", "paired", "probe_rows", "random_inputs", "router_feed", "sized"]

TOKENS = (2, 3)  # the random inputs: 2 sequences of 3 tokens (or 6 tokens)
_MOST_PAIRED = 64  # tokens that pick a class no expert has beside an expert (paired)
_PAIRED_LEAD = 4.0  # the second's logit gets this added, the first's twice: the two
# likeliest by far, in that order, whatever a small selection bias adds


def paired(block: Block, k: int) -> list[tuple[int, int]]:
    """(first, second) classes the proof's logits make the two likeliest, one token each:
    each class no expert has (a skip class) before and after each expert, the first
    ``_MOST_PAIRED``. Where k >= 2 a router that sends such a class to an expert (ZAYA:
    the skip to expert 0) may choose that expert twice, which a block may weigh
    otherwise than as the sum of both (a scatter that overwrites): random logits rarely
    pick both."""
    if k < 2 or block.classes is None:
        return []
    extra = range(block.experts, block.classes)
    pairs = [p for e in range(block.experts) for c in extra for p in ((c, e), (e, c))]
    return pairs[:_MOST_PAIRED]


def random_inputs(block: Block, pairs: list[tuple[int, int]]):
    """Feeds for the block model: the root of the hidden states, the logits, every
    constant it reads, and zeros shaped like what it only reads the shape of; and the
    hidden states and logits as the experts see them (``pairs``: tokens whose two
    largest logits are those classes, ``paired``)."""
    rng = np.random.default_rng(0)
    shape = block.root.shape
    width = block.hidden.shape[-1] if block.hidden.shape is not None else None
    if shape is None or not isinstance(width, int):
        return "the hidden states have no known width", None, None
    sizes = _sizes(shape[:-1], len(pairs))
    dims = [dim if isinstance(dim, int) else sizes[str(dim)] for dim in shape[:-1]]
    tokens = int(np.prod(dims))
    root = rng.standard_normal((*dims, width)).astype(np.float32)
    logits = rng.standard_normal((tokens, block.columns)).astype(np.float32)
    for row, (first, second) in enumerate(pairs[:tokens]):  # in that order
        logits[row, first] += 2 * _PAIRED_LEAD
        logits[row, second] += _PAIRED_LEAD
    rank = len(block.logits.shape or ())
    if rank > 2 and rank != len(shape):
        return "the router's logits are not [tokens, experts] nor shaped as the tokens", None, None
    shaped = logits.reshape(*dims, -1) if rank > 2 else logits  # the router's [B, S, E]
    feeds = {block.root.name: root, block.logits.name: shaped}
    for value in external(block.nodes):
        if value.name in feeds:
            continue
        array = constant_array(value)
        if array is None:
            array = sized(value, block.nodes, sizes)
        if isinstance(array, str):
            return array, None, None
        feeds[value.name] = array
    return feeds, root.reshape(tokens, width), logits


def _sizes(leading, paired: int) -> dict[str, int]:
    """The sizes of the tokens' symbolic axes: ``TOKENS`` in order (1 past them), the
    last one larger where ``paired`` tokens are more than the others give."""
    sizes: dict[str, int] = {}
    symbolic = iter(TOKENS)
    for dim in leading:
        if not isinstance(dim, int) and str(dim) not in sizes:
            sizes[str(dim)] = next(symbolic, 1)
    fixed = int(np.prod([d for d in leading if isinstance(d, int)] or [1]))
    if sizes and paired > fixed * int(np.prod(list(sizes.values()))):
        last = list(sizes)[-1]
        others = fixed * int(np.prod([v for n, v in sizes.items() if n != last] or [1]))
        sizes[last] = -(-paired // others)
    return sizes


def probe_rows(logits: ir.Value, wanted: int) -> int:
    """How many tokens a router run alone may be fed: ``wanted``, or the count a graph
    exported for one length fixed (its logits ``[T, E]`` with ``T`` a number, or
    ``[B, S, E]`` with both: constants folded from that count inside the router, a
    ``[T, G]`` group mask, fail at any other)."""
    leading = list(logits.shape[:-1]) if logits.shape is not None else []
    if not leading or not all(isinstance(d, int) and d > 0 for d in leading):
        return wanted
    return int(np.prod(leading))  # [B, S, E] logits run merged: B * S rows


def router_feed(logits: ir.Value, rows: np.ndarray) -> np.ndarray:
    """``rows`` [T, E] shaped as a router run alone reads its ``logits``: as they are
    where those are [T, E]; where they are [B, S, E] (ZAYA), as the graph's fixed sizes
    or else as one sequence of T tokens (a router's copy runs on them unmerged:
    ``Routing.unmerged``)."""
    shape = logits.shape
    if shape is None or len(shape) <= 2:
        return rows
    leading = list(shape[:-1])
    if all(isinstance(d, int) and d > 0 for d in leading):
        return rows.reshape(*leading, -1)
    return rows.reshape(*([1] * (len(leading) - 1)), len(rows), -1)


def sized(value: ir.Value, nodes: list[ir.Node], sizes: dict[str, int]) -> np.ndarray | str:
    """Zeros shaped like ``value``, which ``nodes`` read only the shape of (a graph
    input's batch and sequence, named like the hidden states' dims: ``sizes``)."""
    readers = [u.node for u in value.uses() if any(u.node is n for n in nodes)]
    if not readers or any(n.op_type not in ("Shape", "Size") for n in readers):
        return f"the block reads {value.name!r}, which is not a constant"
    if value.shape is None or value.dtype is None:
        return f"the block reads the shape of {value.name!r}, which is not known"
    read = _read_dims(readers, len(value.shape))
    dims = []
    for axis, dim in enumerate(value.shape):
        if isinstance(dim, int) or str(dim) in sizes:
            dims.append(dim if isinstance(dim, int) else sizes[str(dim)])
        elif axis in read:
            return f"the block reads the shape of {value.name!r}, whose {dim} it cannot size"
        else:  # a dim no Shape reads (a cache's past length beside its batch): any size
            dims.append(1)
    return np.zeros(dims, value.dtype.numpy())


def _read_dims(readers: list[ir.Node], rank: int) -> set[int]:
    """The axes the readers read: a Shape's from its start to its end, a Size's all."""
    read: set[int] = set()
    for node in readers:
        if node.op_type != "Shape":
            return set(range(rank))
        start, end = node.attributes.get("start"), node.attributes.get("end")
        axes = slice(start.value if start else 0, end.value if end else rank)
        read |= set(range(rank)[axes])
    return read
