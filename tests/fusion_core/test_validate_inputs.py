"""Inputs for the check: generated ones that respect the model's domain (token ids below
the table size, masks 0/1, configurable floats) and user-supplied ones (.npz files and
ONNX test-data folders), with a clear error for each way user inputs can be wrong."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnx.numpy_helper
import onnx.parser
import onnx_ir as ir
import onnxruntime
import pytest

from autofusion.fusion_core import CheckOptions, OptimizeConfig, optimize
from autofusion.fusion_core.errors import ConfigError
from autofusion.fusion_core.validate import (
    FloatDistribution,
    check_feeds,
    compare_models,
    describe_inputs,
    load_inputs,
    random_inputs,
)

TRANSFORMERS = Path(__file__).resolve().parents[1] / "data" / "transformers"
MANIFEST = json.loads((TRANSFORMERS / "manifest.json").read_text())
HEADER = '<ir_version: 8, opset_import: ["" : 17]>\n'


def _model(signature: str, body: str, initializers: str = "") -> onnx.ModelProto:
    init = f"<{initializers}>" if initializers else ""
    return onnx.parser.parse_model(f"{HEADER}g {signature} {init} {{\n{body}\n}}")


def _table(rows: int, cols: int = 2, name: str = "table") -> str:
    values = ", ".join(["0.5"] * (rows * cols))
    return f"float[{rows},{cols}] {name} = {{{values}}}"


def _ids(model: onnx.ModelProto, name: str = "ids", samples: int = 20, **kw) -> np.ndarray:
    return np.concatenate(
        [random_inputs(model, seed=s, dims={"n": 64}, **kw)[name].ravel() for s in range(samples)]
    )


# --- generated inputs --------------------------------------------------------------


GATHER_CASES = [
    pytest.param(
        "(int64[n] ids) => (float[n,2] y)", "y = Gather(table, ids)", _table(5), 5, id="direct"
    ),
    pytest.param(
        "(int32[n] ids) => (float[n,1,2] y)",
        "c = Cast<to = 7>(ids)\n u = Unsqueeze(c, one)\n r = Reshape(u, shape)\n"
        " y = Gather(table, r)",
        f"{_table(6)}, int64[1] one = {{1}}, int64[2] shape = {{-1, 1}}",
        6,
        id="through-cast-unsqueeze-reshape",
    ),
    pytest.param(
        "(int64[n] ids) => (float[3,n] y)",
        "y = Gather<axis = 1>(table, ids)",
        _table(3, cols=7),
        7,
        id="axis-1",
    ),
    pytest.param(
        "(int64[n] ids) => (float[3,n] y)",
        "y = Gather<axis = -1>(table, ids)",
        _table(3, cols=9),
        9,
        id="negative-axis",
    ),
    pytest.param(
        "(int64[n] ids) => (float[n,2] a, float[n,2] b)",
        "a = Gather(big, ids)\n i = Identity(ids)\n b = Gather(small, i)",
        f"{_table(11, name='big')}, {_table(4, name='small')}",
        4,
        id="smallest-of-two-tables",
    ),
    pytest.param(
        "(int64[n] ids, float[8,2] data) => (float[n,2] y)",
        "y = Gather(data, ids)",
        "",
        8,
        id="table-is-a-graph-input",
    ),
    pytest.param(
        "(int64[n] ids) => (float[n,2] y)",
        "t = Constant<value = float[3,2] {1, 2, 3, 4, 5, 6}>()\n y = Gather(t, ids)",
        "",
        3,
        id="table-is-a-constant",
    ),
]


@pytest.mark.parametrize(("signature", "body", "inits", "rows"), GATHER_CASES)
def test_gather_indices_cover_the_table_and_stay_inside_it(
    signature: str, body: str, inits: str, rows: int
) -> None:
    model = _model(signature, body, inits)
    (spec,) = [s for s in describe_inputs(model) if s.name == "ids"]
    assert (spec.kind, spec.high) == ("index", rows)
    ids = _ids(model, int_high=2)
    # Every row is reached (not just 0 and 1, the generic integer range) and none past it.
    assert ids.min() == 0 and ids.max() == rows - 1
    session = onnxruntime.InferenceSession(model.SerializeToString())
    session.run(None, random_inputs(model, seed=0, dims={"n": 64}))  # no out-of-range error


def test_gather_data_of_unknown_size_leaves_ints_generic() -> None:
    model = _model("(int64[n] ids, float[m,2] data) => (float[n,2] y)", "y = Gather(data, ids)")
    (spec, _) = describe_inputs(model, int_high=3)
    assert (spec.kind, spec.high) == ("int", 3)
    assert set(_ids(model, int_high=3).tolist()) == {0, 1, 2}


def test_integer_data_input_of_a_gather_is_not_an_index() -> None:
    model = _model("(int64[n] ids, int64[n] pos) => (int64[1] y)", "y = Gather(ids, pos)")
    kinds = {s.name: (s.kind, s.high) for s in describe_inputs(model, int_high=5)}
    assert kinds["ids"] == ("int", 5)
    assert kinds["pos"][0] == "int"  # data of unknown size: no bound to read


MASK_CASES = [
    pytest.param("attention_mask", "y = Add(attention_mask, attention_mask)", "mask", id="by-name"),
    pytest.param(
        "flags", "c = Cast<to = 7>(flags)\n y = Mul(c, c)", "mask", id="feeds-cast-then-mul"
    ),
    pytest.param(
        "flags",
        "s = Shape(flags)\n y = Equal(flags, flags)",
        "mask",
        id="shape-reads-no-values",
    ),
    pytest.param("flags", "y = Add(flags, flags)", "int", id="arithmetic-is-not-a-mask"),
    pytest.param("flags", "c = Cast<to = 7>(flags)\n y = Add(c, c)", "int", id="cast-then-add"),
]


@pytest.mark.parametrize(("name", "body", "kind"), MASK_CASES)
def test_masks_are_zero_or_one(name: str, body: str, kind: str) -> None:
    model = _model(f"(int64[n] {name}) => (y)", body)
    (spec,) = describe_inputs(model, int_high=10)
    assert spec.kind == kind
    values = set(_ids(model, name=name, int_high=10).tolist())
    assert values == ({0, 1} if kind == "mask" else set(range(10)))


def test_bool_inputs_are_coin_flips() -> None:
    model = _model("(bool[n] b) => (bool[n] y)", "y = Not(b)")
    values = random_inputs(model, seed=0, dims={"n": 200})["b"]
    assert values.dtype == np.bool_ and 50 < values.sum() < 150


def test_float_inputs_follow_the_configured_distribution() -> None:
    model = _model("(float[n] x, float16[n] h) => (float[n] y)", "y = Relu(x)")
    default = random_inputs(model, seed=0, dims={"n": 20_000})
    assert default["x"].dtype == np.float32 and default["h"].dtype == np.float16
    assert abs(default["x"].mean()) < 0.05 and abs(default["x"].std() - 1.0) < 0.05

    normal = FloatDistribution("normal", mean=5.0, std=0.5)
    x = random_inputs(model, seed=0, dims={"n": 20_000}, distribution=normal)["x"]
    assert abs(x.mean() - 5.0) < 0.02 and abs(x.std() - 0.5) < 0.02

    uniform = FloatDistribution("uniform", low=2.0, high=3.0)
    x = random_inputs(model, seed=0, dims={"n": 20_000}, distribution=uniform)["x"]
    assert x.min() >= 2.0 and x.max() <= 3.0
    assert x.min() < 2.01 and x.max() > 2.99 and abs(x.mean() - 2.5) < 0.02


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        pytest.param({"kind": "gamma"}, "unknown float input distribution", id="kind"),
        pytest.param({"std": 0.0}, "std must be > 0", id="std"),
        pytest.param({"kind": "uniform", "low": 1.0, "high": 1.0}, "low < high", id="range"),
    ],
)
def test_a_bad_distribution_is_a_clear_error(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        FloatDistribution(**kwargs)
    assert caught.value.hint


def test_string_inputs_are_not_generated() -> None:
    model = _model("(string[2] s) => (string[2] y)", "y = Identity(s)")
    with pytest.raises(ConfigError, match="cannot generate values for input 's'") as caught:
        random_inputs(model, seed=0)
    assert ".npz" in caught.value.hint


# --- the committed transformer exports ---------------------------------------------

MODELS = {m["file"]: m for m in MANIFEST["models"]}
OFF = CheckOptions(enabled=False)


def _embedding_rows(model: onnx.ModelProto) -> int:
    """The word-embedding table's rows, read from the initializer itself."""
    (table,) = [
        t
        for t in model.graph.initializer
        if t.name.endswith(("word_embeddings.weight", "wte.weight"))
    ]
    return int(table.dims[0])


@pytest.mark.parametrize("file", sorted(MODELS))
def test_transformer_inputs_respect_the_vocabulary_and_masks(file: str) -> None:
    model = onnx.load(TRANSFORMERS / file)
    dims = {"batch": 4, "sequence": 32}
    samples = [random_inputs(model, seed=s, dims=dims) for s in range(4)]
    if file.startswith("vit"):
        (pixels,) = {k for s in samples for k in s}
        assert pixels == "pixel_values"
        assert all(
            s[pixels].dtype == np.float32 and s[pixels].shape == (4, 3, 32, 32) for s in samples
        )
        return
    rows = _embedding_rows(model)
    assert rows == MODELS[file]["vocab_size"]
    ids = np.concatenate([s["input_ids"].ravel() for s in samples])
    assert ids.dtype == np.int64 and ids.min() >= 0
    assert ids.max() < rows and ids.max() > 2  # in range, and not the old 0..1 only
    masks = np.concatenate([s["attention_mask"].ravel() for s in samples])
    assert set(masks.tolist()) == {0, 1}
    session = onnxruntime.InferenceSession(model.SerializeToString())
    (out,) = session.run(None, samples[0])
    assert out.shape[:2] == (4, 32)


# --- user-supplied inputs ----------------------------------------------------------

USER = _model(
    "(float[n,3] x, int64[n] ids) => (float[n,3] y)",
    "r = Relu(x)\n e = Gather(table, ids)\n y = Add(r, e)",
    _table(4, cols=3),
)


def _shifted(by: float) -> onnx.ModelProto:
    return _model(
        "(float[n,3] x, int64[n] ids) => (float[n,3] y)",
        f"r = Relu(x)\n e = Gather(table, ids)\n s = Add(r, e)\n"
        f" c = Constant<value = float {{{by}}}>()\n y = Add(s, c)",
        _table(4, cols=3),
    )


def _save_pb(folder: Path, sample: dict[str, np.ndarray], *, named: bool = True) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for index, spec in enumerate(describe_inputs(USER)):
        tensor = onnx.numpy_helper.from_array(sample[spec.name], spec.name if named else "")
        (folder / f"input_{index}.pb").write_bytes(tensor.SerializeToString())
    # Expected outputs sit beside the inputs in ONNX's layout; they must be ignored.
    (folder / "output_0.pb").write_bytes(b"\x00 not read")


def _samples(count: int, seed: int = 7) -> list[dict[str, np.ndarray]]:
    return [random_inputs(USER, seed=seed + k, dims={"n": 5}) for k in range(count)]


def _assert_same_samples(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.keys() == y.keys()
        for name in x:
            assert x[name].dtype == y[name].dtype
            np.testing.assert_array_equal(x[name], y[name])


def test_npz_round_trip(tmp_path: Path) -> None:
    (sample,) = _samples(1)
    np.savez(tmp_path / "inputs.npz", **sample)
    _assert_same_samples(load_inputs(tmp_path / "inputs.npz", USER), [sample])


@pytest.mark.parametrize("named", [True, False], ids=["named", "by-position"])
def test_pb_folder_round_trip(tmp_path: Path, named: bool) -> None:
    (sample,) = _samples(1)
    _save_pb(tmp_path, sample, named=named)
    _assert_same_samples(load_inputs(tmp_path, USER), [sample])


def test_test_data_sets_are_samples_in_numeric_order(tmp_path: Path) -> None:
    samples = _samples(11)
    for k, sample in enumerate(samples):
        _save_pb(tmp_path / f"test_data_set_{k}", sample)
    _assert_same_samples(load_inputs(tmp_path, USER), samples)  # 10 after 9, not after 1


@pytest.mark.parametrize("shift", [1e-5, 1e-2], ids=["passes", "fails"])
def test_user_inputs_give_the_verdict_random_feeds_give(tmp_path: Path, shift: float) -> None:
    # compare_models draws sample j with seed + j: save exactly those, load them back.
    seed, samples = 7, 2
    for k, sample in enumerate(_samples(samples, seed)):
        _save_pb(tmp_path / "pb" / f"test_data_set_{k}", sample)
    (one,) = _samples(1, seed)
    np.savez(tmp_path / "one.npz", **one)
    fused = _shifted(shift)
    kw = {"rtol": 0.0, "atol": 1e-4}

    generated = compare_models(USER, fused, samples=samples, seed=seed, dims={"n": 5}, **kw)
    supplied = compare_models(USER, fused, feeds=load_inputs(tmp_path / "pb", USER), **kw)
    assert generated.passed == supplied.passed == (shift < 1e-4)
    assert generated.to_dict()["outputs"] == supplied.to_dict()["outputs"]

    single = compare_models(USER, fused, samples=1, seed=seed, dims={"n": 5}, **kw)
    from_npz = compare_models(USER, fused, feeds=load_inputs(tmp_path / "one.npz", USER), **kw)
    assert single.to_dict()["outputs"] == from_npz.to_dict()["outputs"]
    assert from_npz.samples == 1 and from_npz.profiles[0].seeds == []


def _write_bad(tmp_path: Path, case: str) -> Path:
    (good,) = _samples(1)
    npz = tmp_path / "in.npz"
    if case == "unknown-name":
        np.savez(npz, **good, idz=good["ids"])
    elif case == "missing-input":
        np.savez(npz, x=good["x"])
    elif case == "wrong-dtype":
        np.savez(npz, x=good["x"].astype(np.float64), ids=good["ids"])
    elif case == "wrong-rank":
        np.savez(npz, x=good["x"].ravel(), ids=good["ids"])
    elif case == "wrong-fixed-dim":
        np.savez(npz, x=np.zeros((5, 4), np.float32), ids=good["ids"])
    elif case == "not-an-npz":
        npz.write_bytes(b"this is not a zip archive")
    elif case == "pickled-npz":
        np.savez(npz, x=np.array([object()], dtype=object), ids=good["ids"])
    elif case == "unreadable-pb":
        (tmp_path / "input_0.pb").write_bytes(b"\xff\xff\xff\xff garbage")
        return tmp_path
    elif case == "empty-pb":
        (tmp_path / "input_0.pb").write_bytes(b"")
        return tmp_path
    elif case == "position-past-inputs":
        _save_pb(tmp_path, good, named=False)
        tensor = onnx.numpy_helper.from_array(good["ids"], "")
        (tmp_path / "input_2.pb").write_bytes(tensor.SerializeToString())
        return tmp_path
    elif case == "same-input-twice":
        _save_pb(tmp_path, good)
        tensor = onnx.numpy_helper.from_array(good["ids"], "ids")
        (tmp_path / "input_5.pb").write_bytes(tensor.SerializeToString())
        return tmp_path
    elif case == "empty-folder":
        return tmp_path
    elif case == "does-not-exist":
        return tmp_path / "nowhere.npz"
    elif case == "other-file":
        (tmp_path / "in.csv").write_text("1,2,3")
        return tmp_path / "in.csv"
    return npz


BAD_INPUTS = [
    ("unknown-name", r"\['idz'\] are not inputs of the model", "the model's inputs are"),
    ("missing-input", r"no value for input\(s\) \['ids'\]", "every sample"),
    ("wrong-dtype", "input 'x' is float64, the model expects float32", "dtype=numpy.float32"),
    ("wrong-rank", "input 'x' has rank 1 .* expects rank 2", "reshape"),
    ("wrong-fixed-dim", r"dimension 1 is fixed at 3", "fixed dimensions"),
    ("not-an-npz", "cannot read .* as a .npz file", "numpy.savez"),
    ("pickled-npz", "cannot read .* as a .npz file", "no pickled objects"),
    ("unreadable-pb", "cannot read .* as an ONNX TensorProto", "numpy_helper.from_array"),
    ("empty-pb", "is not an ONNX TensorProto", "numpy_helper.from_array"),
    ("position-past-inputs", "number 2 is past the model's 2 inputs", "name the tensor"),
    ("same-input-twice", "gives input 'ids' a second time", "different input"),
    ("empty-folder", "holds no input_N.pb files", "test_data_set_0"),
    ("does-not-exist", "do not exist", ".npz"),
    ("other-file", "cannot read inputs from", ".npz"),
]


@pytest.mark.parametrize(("case", "message", "hint"), BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_each_bad_user_input_is_a_clear_error(
    tmp_path: Path, case: str, message: str, hint: str
) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        load_inputs(_write_bad(tmp_path, case), USER)
    assert hint in caught.value.hint
    assert caught.value.code == "invalid-config"


def test_check_feeds_accepts_good_feeds_and_any_symbolic_size() -> None:
    check_feeds(random_inputs(USER, seed=0, dims={"n": 9}), USER)  # does not raise


@pytest.mark.parametrize("file", ["bert_eager_dynamo.onnx", "gpt2_sdpa_torchscript.onnx"])
def test_a_fused_transformer_checked_over_two_shape_profiles(file: str) -> None:
    result = optimize(TRANSFORMERS / file, OptimizeConfig(target="onnxruntime", check=OFF))
    fused = ir.serde.serialize_model(result.model)
    profiles = [{"batch": 1, "sequence": 16}, {"batch": 4, "sequence": 64}]
    check = compare_models(
        onnx.load(TRANSFORMERS / file), fused, rtol=0.0, atol=1e-4, samples=2, profiles=profiles
    )
    assert check.passed, check.to_dict()
    assert [p.dims for p in check.profiles] == profiles
    (output,) = check.outputs
    assert output.elements == 2 * (16 + 4 * 64) * MODELS[file]["hidden"]
    assert output.cosine_similarity == pytest.approx(1.0, abs=1e-6)
