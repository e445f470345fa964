"""The numerical check: compare_models and the sessions it runs.

Each test states the tolerance it checks against (rtol/atol) and builds its models in
ONNX text; perturbations are constants added by the "fused" model, so the expected
error is known exactly.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnx.numpy_helper
import onnx.parser
import pytest
from pydantic import ValidationError

import autofusion.fusion_core.validate._sessions as sessions_module
from autofusion.fusion_core.config import CheckOptions
from autofusion.fusion_core.errors import ConfigError
from autofusion.fusion_core.validate import compare_models, make_session, random_inputs


def _model(body: str, out: str = "float[2,3] y") -> onnx.ModelProto:
    return onnx.parser.parse_model(
        '<ir_version: 8, opset_import: ["" : 17]>\n'
        f"g (float[2,3] x, int64[2] ids) => ({out}) {{\n {body}\n}}"
    )


IDENTITY = _model("y = Relu(x)")


def test_identical_models_pass_with_zero_difference() -> None:
    result = compare_models(IDENTITY, IDENTITY, rtol=0.0, atol=0.0, samples=3)
    assert result.passed and result.error is None
    assert result.max_abs_diff == 0.0
    assert [o.name for o in result.outputs] == ["y"]


def test_a_small_change_fails_and_is_measured() -> None:
    changed = _model("c = Constant<value = float {0.001}>()\n r = Relu(x)\n y = Add(r, c)")
    result = compare_models(IDENTITY, changed, rtol=0.0, atol=1e-4)
    assert not result.passed
    (output,) = result.outputs
    assert output.max_abs_diff == pytest.approx(1e-3, rel=1e-3)
    assert "exceeds atol" in output.detail
    assert compare_models(IDENTITY, changed, rtol=0.0, atol=1e-2).passed


def test_shape_mismatch_fails() -> None:
    other = _model("y = Flatten<axis = 0>(x)", out="float[1,6] y")
    result = compare_models(IDENTITY, other)
    assert not result.passed
    assert "shape" in result.outputs[0].detail


def test_unloadable_model_is_an_error_not_a_crash() -> None:
    broken = _model("y = NoSuchOp(x)")
    result = compare_models(IDENTITY, broken)
    assert not result.passed
    assert result.error is not None and "cannot load the fused model" in result.error
    assert result.failure == "cannot_load"


def test_random_inputs_are_seeded_and_typed() -> None:
    a = random_inputs(IDENTITY, seed=5)
    b = random_inputs(IDENTITY, seed=5)
    assert set(a) == {"x", "ids"}
    assert a["x"].dtype == np.float32 and a["ids"].dtype == np.int64
    np.testing.assert_array_equal(a["x"], b["x"])
    assert not np.array_equal(a["x"], random_inputs(IDENTITY, seed=6)["x"])


def test_session_for_a_model_over_the_protobuf_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    # Pretend the limit is tiny: the session must be built from a file with external
    # data, and the caller's model must keep its weights.
    model = onnx.load("tests/data/resnet/resnet50_w8_torchscript.onnx")
    size = model.ByteSize()
    monkeypatch.setattr(sessions_module, "PROTOBUF_LIMIT_BYTES", 1000)
    big = make_session(model)
    monkeypatch.undo()
    small = make_session(model)
    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
    np.testing.assert_allclose(
        big.run(None, {"input": x})[0], small.run(None, {"input": x})[0], rtol=0, atol=0
    )
    assert model.ByteSize() == size


# --- Monte Carlo statistics, shape profiles and tolerances --------------------------

HEADER = '<ir_version: 8, opset_import: ["" : 17]>\n'


def _sym(
    body: str, sig: str = "(float[batch,seq,4] x) => (float[batch,seq,4] y)"
) -> onnx.ModelProto:
    return onnx.parser.parse_model(f"{HEADER}g {sig} {{\n {body}\n}}")


def _plus(c: float, dtype: str = "float") -> str:
    return f"c = Constant<value = {dtype} {{{c}}}>()\n y = Add(x, c)"


SYM = _sym("y = Identity(x)")
PROFILES = [{"batch": 1, "seq": 4}, {"batch": 3, "seq": 7}]


def test_every_profile_is_checked_with_its_own_seeded_samples() -> None:
    result = compare_models(SYM, _sym(_plus(1e-5)), samples=2, seed=10, profiles=PROFILES)
    assert result.passed and result.samples == 2
    assert [p.dims for p in result.profiles] == PROFILES
    assert [p.seeds for p in result.profiles] == [[10, 11], [12, 13]]
    per_sample = [b * s * 4 for b, s in ((1, 4), (3, 7))]
    assert [p.outputs[0].elements for p in result.profiles] == [2 * n for n in per_sample]
    assert result.outputs[0].elements == 2 * sum(per_sample)
    again = compare_models(SYM, _sym(_plus(1e-5)), samples=2, seed=10, profiles=PROFILES)
    assert again.to_dict() == result.to_dict()


def test_a_failure_in_one_profile_fails_the_verdict_and_names_the_profile() -> None:
    # Adds (batch - 1): right for batch 1, wrong for any other batch.
    only_batch_one = _sym(
        "s = Shape(x)\n b = Gather<axis = 0>(s, zero)\n f = Cast<to = 1>(b)\n"
        " one = Constant<value = float {1.0}>()\n d = Sub(f, one)\n y = Add(x, d)"
    )
    only_batch_one.graph.initializer.append(onnx.numpy_helper.from_array(np.array(0), "zero"))
    result = compare_models(SYM, only_batch_one, rtol=0.0, atol=1e-4, profiles=PROFILES)
    assert [p.passed for p in result.profiles] == [True, False]
    assert not result.passed
    assert "fails in profile(s) [1]" in result.outputs[0].detail
    assert result.outputs[0].mismatches == result.profiles[1].outputs[0].elements


def test_dims_is_the_single_profile_and_unset_dims_take_their_role_default() -> None:
    result = compare_models(SYM, SYM, samples=1, dims={"batch": 2})
    # The check adds a second profile at another length where it chose the sequence
    # (fusion_core.validate._dims, second_length_dims): dims is still the only one asked
    profile, second = result.profiles
    assert profile.dims == {"batch": 2, "seq": 16}  # a sequence: 16 (fusion_core.validate._dims)
    assert profile.outputs[0].elements == 2 * 16 * 4
    assert not profile.added and second.added and second.dims == {"batch": 2, "seq": 7}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        pytest.param(
            {"profiles": [{"batch": 1}, {"bacth": 2}]}, r"profile 1 names \['bacth'\]", id="dim"
        ),
        pytest.param({"dims": {"seq": 0}}, "whole numbers >= 1", id="zero"),
        pytest.param({"tolerances": {"z": {"atol": 1.0}}}, "output 'z'", id="output"),
        pytest.param({"tolerances": {"y": {"atl": 1.0}}}, "tolerance for output 'y'", id="key"),
        pytest.param(
            {"tolerances": {"y": {"atol": -1.0}}}, "tolerance for output 'y'", id="negative"
        ),
    ],
)
def test_a_bad_profile_or_tolerance_is_a_clear_error(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        compare_models(SYM, SYM, **kwargs)
    assert caught.value.hint


def test_histogram_counts_every_element_in_its_decade() -> None:
    result = compare_models(SYM, _sym(_plus(3e-5)), samples=3, profiles=PROFILES)
    (output,) = result.outputs
    assert sum(output.histogram) == output.elements == 3 * (16 + 84)
    edges = result.histogram_edges
    assert len(edges) == len(output.histogram) and edges[0] == 0.0 and edges[-1] == 1.0
    # |error| is 3e-5 up to float32 rounding of x: all of it in [1e-5, 1e-4).
    assert output.histogram[edges.index(1e-5)] == output.elements
    for profile in result.profiles:
        assert sum(profile.outputs[0].histogram) == profile.outputs[0].elements


def test_identical_outputs_fall_in_the_first_bin_and_nan_pairs_are_equal() -> None:
    nan = _sym("z = Sub(x, x)\n d = Div(z, z)\n y = Add(d, x)")  # NaN everywhere, both sides
    result = compare_models(nan, nan, rtol=0.0, atol=0.0, samples=1, dims={"batch": 2, "seq": 2})
    (output,) = result.outputs
    assert result.passed and output.histogram[0] == output.elements == 16


def test_cosine_similarity_and_the_verdict_against_atol() -> None:
    tiny = compare_models(SYM, _sym(_plus(1e-6)), rtol=0.0, atol=1e-4, profiles=PROFILES)
    (output,) = tiny.outputs
    assert tiny.passed
    assert output.cosine_similarity == pytest.approx(1.0, abs=1e-9)
    assert output.max_abs_diff == pytest.approx(1e-6, rel=0.2)
    assert output.mean_abs_diff == pytest.approx(1e-6, rel=0.2)

    beyond = compare_models(SYM, _sym(_plus(1e-3)), rtol=0.0, atol=1e-4, profiles=PROFILES)
    (output,) = beyond.outputs
    assert not beyond.passed and output.mismatches == output.elements
    assert output.cosine_similarity > 0.999  # still aligned: cosine alone would not catch it
    assert "exceeds atol 0.0001" in output.detail

    flipped = compare_models(SYM, _sym("y = Neg(x)"), profiles=PROFILES)
    assert flipped.outputs[0].cosine_similarity == pytest.approx(-1.0, abs=1e-9)


TWO_OUT = "(float[batch,seq,4] x) => (float[batch,seq,4] y, float[batch,seq,4] w)"


def test_a_per_output_tolerance_overrides_the_default() -> None:
    original = _sym("y = Identity(x)\n w = Identity(x)", TWO_OUT)
    fused = _sym("c = Constant<value = float {1e-3}>()\n y = Add(x, c)\n w = Add(x, c)", TWO_OUT)
    default = compare_models(original, fused, rtol=0.0, atol=1e-4)
    assert [o.passed for o in default.outputs] == [False, False]

    looser = compare_models(original, fused, rtol=0.0, atol=1e-4, tolerances={"y": {"atol": 1e-2}})
    y, w = looser.outputs
    assert (y.passed, y.atol, y.rtol, y.tolerance_source) == (True, 1e-2, 0.0, "override")
    assert (w.passed, w.atol, w.tolerance_source) == (False, 1e-4, "configured")
    assert not looser.passed

    both = {"y": {"atol": 1e-2}, "w": {"atol": 2e-3}}
    assert compare_models(original, fused, rtol=0.0, atol=1e-4, tolerances=both).passed
    stricter = compare_models(
        original, original, rtol=0.0, atol=1.0, tolerances={"y": {"atol": 0.0}}
    )
    assert stricter.outputs[0].atol == 0.0 and stricter.passed  # identical stays identical


def test_float16_outputs_get_the_float16_default_tolerance() -> None:
    sig = (
        "(float16[batch,seq,4] x, float[batch,seq,4] x32)"
        " => (float16[batch,seq,4] y, float[batch,seq,4] z)"
    )
    original = _sym("y = Identity(x)\n z = Identity(x32)", sig)
    # Adding 5e-4 is within fp16's default (atol 1e-3 + rtol 1e-2 * |x|, which also
    # covers fp16 rounding) but far outside the configured fp32 atol 1e-6.
    fused = _sym(
        "d = Constant<value = float {5e-4}>()\n c = Cast<to = 10>(d)\n y = Add(x, c)\n"
        " z = Add(x32, d)",
        sig,
    )
    result = compare_models(original, fused, rtol=0.0, atol=1e-6, profiles=PROFILES)
    y, z = result.outputs
    assert (y.dtype, y.rtol, y.atol, y.tolerance_source) == (
        "float16",
        1e-2,
        1e-3,
        "default for float16",
    )
    assert y.passed
    assert (z.dtype, z.atol, z.passed) == ("float32", 1e-6, False)

    far = _sym(
        "d = Constant<value = float {5e-2}>()\n c = Cast<to = 10>(d)\n y = Add(x, c)\n"
        " z = Identity(x32)",
        sig,
    )
    assert not compare_models(original, far, rtol=0.0, atol=1e-6).outputs[0].passed


def test_integer_outputs_must_be_exact_unless_overridden() -> None:
    sig = "(int64[batch] i) => (int64[batch] y)"
    original = _sym("y = Identity(i)", sig)
    off_by_one = _sym("one = Constant<value = int64 {1}>()\n y = Add(i, one)", sig)
    result = compare_models(original, off_by_one, rtol=1.0, atol=10.0, dims={"batch": 5})
    (output,) = result.outputs
    assert not result.passed
    assert (output.dtype, output.rtol, output.atol) == ("int64", 0.0, 0.0)
    assert "exact equality" in output.detail
    relaxed = compare_models(
        original, off_by_one, dims={"batch": 5}, tolerances={"y": {"atol": 1.0, "rtol": 0.0}}
    )
    assert relaxed.passed


def test_to_dict_is_plain_json_without_infinities() -> None:
    other = _sym("y = Flatten<axis = 0>(x)", "(float[batch,seq,4] x) => (float[1,16] y)")
    result = compare_models(SYM, other, dims={"batch": 2, "seq": 2})
    assert not result.passed and result.outputs[0].max_abs_diff == float("inf")
    data = json.loads(json.dumps(result.to_dict(), allow_nan=False))
    assert data["outputs"][0]["max_abs_diff"] is None
    assert data["max_abs_diff"] is None and "shape" in data["outputs"][0]["detail"]
    good = compare_models(SYM, _sym(_plus(1e-5)), profiles=PROFILES).to_dict()
    text = json.dumps(good, allow_nan=False)
    expected_keys = {
        "passed",
        "samples",
        "seed",
        "outputs",
        "error",
        "profiles",
        "histogram_edges",
        "max_abs_diff",
        "max_rel_diff",
        "failure",
        "reason",
        "dynamic_dims",
        "noise_floor",  # None: the model quantizes no activation (validate/_floor.py)
        "skipped",  # []: profiles the check added and could not run (a second length)
    }
    assert set(json.loads(text)) == expected_keys
    assert {"cosine_similarity", "histogram", "mean_abs_diff", "tolerance_source"} <= set(
        good["outputs"][0]
    )
    assert {"dims", "seeds", "samples", "passed", "outputs", "error"} <= set(good["profiles"][0])


def test_a_run_failure_in_one_profile_is_reported_not_raised() -> None:
    # Reshape to a fixed 12 elements: fine for batch 1, seq 3; impossible for the other.
    original = _sym(
        "s = Constant<value = int64[1] {12}>()\n y = Reshape(x, s)",
        "(float[batch,seq,4] x) => (float[12] y)",
    )
    result = compare_models(
        original, original, profiles=[{"batch": 1, "seq": 3}, {"batch": 2, "seq": 3}]
    )
    assert not result.passed
    assert [p.error is None for p in result.profiles] == [True, False]
    assert result.error is not None and "profile 1" in result.error
    assert "the original model cannot run" in result.error and "--shape" in result.error
    assert result.failure == "original_cannot_run"


def test_check_options_profiles_fall_back_to_dims_and_validate() -> None:
    assert CheckOptions(dims={"batch": 2}).shape_profiles() == [{"batch": 2}]
    assert CheckOptions().shape_profiles() == [{}]
    both = CheckOptions(dims={"batch": 2}, profiles=PROFILES)
    assert both.shape_profiles() == PROFILES
    options = CheckOptions(tolerances={"y": {"atol": 1e-2}})
    assert options.model_dump()["tolerances"] == {"y": {"atol": 1e-2}}


@pytest.mark.parametrize(
    ("fields", "where"),
    [
        pytest.param({"profiles": [{"batch": 0}]}, "profiles.0.batch", id="zero-dim"),
        pytest.param({"tolerances": {"y": {"btol": 1.0}}}, "tolerances.y.btol", id="key"),
        pytest.param({"tolerances": {"y": {"atol": -1.0}}}, "tolerances.y.atol", id="negative"),
        pytest.param({"input_std": 0.0}, "input_std", id="std"),
        pytest.param(
            {"input_distribution": "uniform", "input_low": 1.0, "input_high": 1.0},
            "input_low",
            id="uniform-range",
        ),
    ],
)
def test_check_options_reject_bad_values(fields: dict, where: str) -> None:
    with pytest.raises(ValidationError) as caught:
        CheckOptions(**fields)
    assert where in str(caught.value)
