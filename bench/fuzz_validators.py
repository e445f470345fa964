"""Fuzz the two validators that take hostile input (issue 15, item 4).

* ``app.services.model_checks.inspect_model`` on mutated valid model bytes: only
  ``ProblemError`` may come out (a refusal); anything else would be a 500.
* The pattern spec parser and compiler (``fusion_core.compile_pattern``, formulas
  included) on mutated built-in patterns: only ``PatternError`` may come out.

The suite runs both for ~200 examples (tests/fuzz/test_fuzz_validators.py); this script
runs longer::

    python bench/fuzz_validators.py --examples 20000            # both
    python bench/fuzz_validators.py --target patterns --examples 50000

An input that raises anything else is printed by hypothesis (the smallest it finds)
and the run exits 1: fix it, and keep the input as an explicit regression case in
tests/fuzz/.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from autofusion.app.core.config import Settings  # noqa: E402
from autofusion.app.core.errors import ProblemError  # noqa: E402
from autofusion.app.services.model_checks import inspect_model  # noqa: E402
from autofusion.fusion_core import compile_pattern  # noqa: E402
from autofusion.fusion_core.catalog import builtin_pattern_data  # noqa: E402
from autofusion.fusion_core.errors import PatternError  # noqa: E402

__all__ = [
    "DATA_NAME",
    "check_model_bytes",
    "check_pattern",
    "model_bytes",
    "pattern_specs",
    "refusal",
    "seed_models",
]

DATA_NAME = "w.bin"
WEIGHTS = np.arange(4, dtype=np.float32)

# --- seed models: small, valid, each exercising a different part of the checks ---------


def _model(nodes, initializers=(), functions=(), domains=()) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
        initializer=list(initializers),
    )
    opsets = [helper.make_opsetid("", 17), *(helper.make_opsetid(d, 1) for d in domains)]
    return helper.make_model(graph, opset_imports=opsets, functions=list(functions))


@functools.cache
def _seeds() -> tuple[onnx.ModelProto, ...]:
    return tuple(seed_models())


def seed_models() -> list[onnx.ModelProto]:
    weight = numpy_helper.from_array(WEIGHTS, "W")
    external = TensorProto(name="W", data_type=TensorProto.FLOAT, dims=[4])
    external.data_location = TensorProto.EXTERNAL
    for key, value in (("location", DATA_NAME), ("offset", "0"), ("length", "16")):
        external.external_data.add(key=key, value=value)
    branch = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"])],
        "branch",
        [],
        [helper.make_tensor_value_info("r", TensorProto.FLOAT, [4])],
    )
    condition = numpy_helper.from_array(np.array(True), "c")
    body = [helper.make_node("Neg", ["a"], ["b"])]
    opsets = [helper.make_opsetid("", 17)]
    function = helper.make_function("ai.acme", "f", ["a"], ["b"], body, opsets)
    sparse = helper.make_sparse_tensor(
        numpy_helper.from_array(np.ones(2, np.float32), "s"),
        numpy_helper.from_array(np.array([0, 3], np.int64), "s_idx"),
        [4],
    )
    with_sparse = _model([helper.make_node("Add", ["x", "s"], ["y"])])
    with_sparse.graph.sparse_initializer.append(sparse)
    return [
        _model([helper.make_node("Add", ["x", "W"], ["y"])], initializers=[weight]),
        _model([helper.make_node("Add", ["x", "W"], ["y"])], initializers=[external]),
        _model(
            [
                helper.make_node("Constant", [], ["c"], value=condition),
                helper.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=branch),
            ]
        ),
        _model(
            [helper.make_node("f", ["x"], ["y"], domain="ai.acme")],
            functions=[function],
            domains=["ai.acme"],
        ),
        with_sparse,
    ]


# --- model mutations ----------------------------------------------------------------------

_TEXT = st.one_of(
    st.sampled_from(["location", "offset", "length", "checksum", "basepath", "__class__"]),
    st.sampled_from([DATA_NAME, "../w.bin", "/etc/passwd", "w.bin\x00", "", ".", "sub/w.bin"]),
    st.text(max_size=12),
)
_INT = st.one_of(st.integers(-3, 40), st.integers(-(2**63), 2**63 - 1))


def _mutate_tensor(tensor: TensorProto, draw) -> None:
    choice = draw(st.integers(0, 5))
    if choice == 0:
        del tensor.dims[:]
        tensor.dims.extend(draw(st.lists(_INT, max_size=4)))
    elif choice == 1:
        tensor.data_type = draw(st.integers(0, 40))
    elif choice == 2:
        tensor.raw_data = draw(st.binary(max_size=40))
    elif choice == 3:
        tensor.external_data.add(key=draw(_TEXT), value=draw(_TEXT))
        if draw(st.booleans()):
            tensor.data_location = TensorProto.EXTERNAL
    elif choice == 4:
        tensor.data_location = draw(st.sampled_from([TensorProto.DEFAULT, TensorProto.EXTERNAL]))
    else:
        tensor.float_data.extend(draw(st.lists(st.floats(width=32), max_size=6)))


def _tensors(model: onnx.ModelProto) -> list[TensorProto]:
    found = list(model.graph.initializer)
    for node in model.graph.node:
        found += [a.t for a in node.attribute if a.HasField("t")]
    for sparse in model.graph.sparse_initializer:
        found += [sparse.values, sparse.indices]
    return found


def _mutate_structure(model: onnx.ModelProto, draw) -> None:
    """One change through the protobuf API (a typed field set to a hostile value)."""
    nodes = list(model.graph.node)
    for function in model.functions:
        nodes += list(function.node)
    choice = draw(st.integers(0, 6))
    tensors = _tensors(model)
    if choice <= 1 and tensors:
        _mutate_tensor(draw(st.sampled_from(tensors)), draw)
    elif choice == 2 and nodes:
        node = draw(st.sampled_from(nodes))
        node.domain = draw(st.one_of(_TEXT, st.sampled_from(["ai.acme", "com.microsoft"])))
    elif choice == 3 and nodes:
        node = draw(st.sampled_from(nodes))
        node.op_type = draw(st.one_of(st.sampled_from(["f", "If", "Loop", "Relu"]), _TEXT))
    elif choice == 4 and model.functions:
        function = model.functions[0]
        function.node.append(helper.make_node(function.name, ["a"], ["z"], domain=function.domain))
    elif choice == 5:
        shape = model.graph.input[0].type.tensor_type.shape
        shape.dim.add().dim_value = draw(_INT.filter(lambda v: v >= 0))
    else:
        model.graph.node.append(
            helper.make_node("If", ["x"], ["q"], then_branch=model.graph, else_branch=None)
        )


def _mutate_bytes(content: bytes, draw) -> bytes:
    """One change of the serialized bytes: flip, insert, delete, truncate, or a string
    field's bytes replaced by arbitrary ones (not UTF-8) of the same length."""
    if not content:
        return content
    choice = draw(st.integers(0, 4))
    at = draw(st.integers(0, len(content) - 1))
    if choice == 0:
        return content[:at] + bytes([draw(st.integers(0, 255))]) + content[at + 1 :]
    if choice == 1:
        return content[:at] + draw(st.binary(min_size=1, max_size=8)) + content[at:]
    if choice == 2:
        return content[:at] + content[at + draw(st.integers(1, 16)) :]
    if choice == 3:
        return content[:at]
    for word in (DATA_NAME.encode(), b"ai.acme", b"location", b"Relu", b"W"):
        if word in content:
            junk = draw(st.binary(min_size=len(word), max_size=len(word)))
            return content.replace(word, junk, 1)
    return content


@st.composite
def model_bytes(draw) -> bytes:
    """A seed model, changed a few times through the protobuf API and then as bytes."""
    model = copy.deepcopy(draw(st.sampled_from(_seeds())))
    for _ in range(draw(st.integers(0, 3))):
        with contextlib.suppress(ValueError, TypeError):  # a value protobuf refuses
            _mutate_structure(model, draw)
    try:
        content = model.SerializeToString()
    except Exception:  # a mutation the serializer refuses: start from the seed's bytes
        content = draw(st.sampled_from(_seeds())).SerializeToString()
    for _ in range(draw(st.integers(0, 3))):
        content = _mutate_bytes(content, draw)
    return content


def check_model_bytes(content: bytes, folder: Path | None = None) -> None:
    """Run ``inspect_model`` on ``content`` beside an uploaded data file; acceptance or
    a refusal (a ProblemError that serializes) is a pass, any other exception propagates."""
    refusal(content, folder)


def refusal(content: bytes, folder: Path | None = None) -> ProblemError | None:
    """The ProblemError ``inspect_model`` refuses ``content`` with, or None."""
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch) if folder is None else folder
        (folder / "model.onnx").write_bytes(content)
        (folder / DATA_NAME).write_bytes(WEIGHTS.tobytes())
        try:
            inspect_model(folder / "model.onnx", [DATA_NAME], Settings(data_dir=folder))
        except ProblemError as exc:
            _as_the_api_sends_it(exc)
            return exc
    return None


def _as_the_api_sends_it(exc: ProblemError) -> None:
    """The problem document must serialize: a bytes value in it was a 500 too."""
    json.dumps({"title": exc.title, "detail": exc.detail, **exc.extra})
    assert isinstance(exc.detail, str) and isinstance(exc.status, int), exc


# --- pattern spec mutations ---------------------------------------------------------------

_JSON = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**70), 2**70),
        st.floats(allow_nan=True),
        st.text(max_size=10),
        st.sampled_from(["conv", "$x", "conv.out0", "bn.in1", "Conv", "fused_region", "attr"]),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)
_FORMULA = st.one_of(
    st.text(alphabet="0123456789+-*/().,' $dimsqrtxy_", max_size=60),
    st.builds(
        lambda op, n: op.join(["1"] * n),
        st.sampled_from(["+", "*", "**", "-"]),
        st.integers(1, 1200),
    ),
    st.sampled_from(["1 / sqrt(dim(q.out0, -1))", "dim('$x', 10**400)", "(-8) ** 0.5"]),
)


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    found = [prefix]
    if isinstance(value, dict):
        for key, child in value.items():
            found += _paths(child, (*prefix, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            found += _paths(child, (*prefix, index))
    return found


def _set(root: Any, path: tuple, value: Any) -> Any:
    if not path:
        return value
    parent = root
    for step in path[:-1]:
        parent = parent[step]
    parent[path[-1]] = value
    return root


@functools.cache
def _builtin_specs() -> tuple[dict[str, Any], ...]:
    return tuple(builtin_pattern_data())  # read from YAML: once


@st.composite
def pattern_specs(draw) -> Any:
    """A built-in pattern with a few values replaced, keys dropped or added, or a
    formula constraint of arbitrary text."""
    spec: Any = copy.deepcopy(draw(st.sampled_from(_builtin_specs())))
    for _ in range(draw(st.integers(1, 4))):
        # Not the root: the API hands the compiler a JSON object (PatternCreate).
        paths = _paths(spec)[1:]
        path = draw(st.sampled_from(paths)) if paths else ("name",)
        choice = draw(st.integers(0, 4))
        if choice == 0:
            spec = _set(spec, path, draw(_JSON))
        elif choice == 1 and path:
            parent = spec
            for step in path[:-1]:
                parent = parent[step]
            del parent[path[-1]]
        elif choice == 2 and isinstance(spec, dict):
            constraints = spec.setdefault("constraints", [])
            if isinstance(constraints, list):
                node = spec["nodes"][0]["id"] if _first_node_id(spec) else "n"
                formula = {"kind": "formula", "value": f"{node}.in1", "equals": draw(_FORMULA)}
                constraints.append(formula)
        elif choice == 3:
            spec = _set(spec, path, draw(st.sampled_from([[], {}, "", 0, -1, 10**30, None])))
        else:  # a long chain of nodes (a recursive walk of the edges overflows the stack)
            length = draw(st.integers(2, 3000))
            spec["nodes"] = [
                {"id": f"n{k}", "op": "Relu", **({"inputs": {"0": f"n{k - 1}"}} if k else {})}
                for k in range(length)
            ]
    return spec


def _first_node_id(spec: dict) -> bool:
    nodes = spec.get("nodes")
    return bool(
        isinstance(nodes, list) and nodes and isinstance(nodes[0], dict) and "id" in nodes[0]
    )


def check_pattern(raw: Any) -> None:
    """Compile ``raw``; a PatternError is a pass, any other exception propagates."""
    with contextlib.suppress(PatternError):
        compile_pattern(raw)


# --- the long run -------------------------------------------------------------------------


def _run(name: str, strategy, check, examples: int) -> None:
    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def fuzz(value) -> None:
        check(value)

    start = time.perf_counter()
    fuzz()
    took = time.perf_counter() - start
    print(f"{name}: {examples} examples, no unexpected exception ({took:.0f} s)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=20000)
    parser.add_argument("--target", choices=["models", "patterns", "all"], default="all")
    args = parser.parse_args(argv)
    if args.target in ("models", "all"):
        _run("inspect_model", model_bytes(), check_model_bytes, args.examples)
    if args.target in ("patterns", "all"):
        _run("compile_pattern", pattern_specs(), check_pattern, args.examples)
    return 0


if __name__ == "__main__":
    sys.exit(main())
