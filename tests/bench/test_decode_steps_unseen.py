"""The padded decode of the surveyed families (bench/corpus/decode_steps_unseen.py)
starts and carries every cache state as a generation loop does: keys, values and a
sparse attention's indexer keys start empty and grow (along axis 2, 2 and 1), a
convolution or recurrent state starts at zeros and is carried as is, a graph exported
for one new token is prefilled one token at a time, and one exported for one row runs
each row alone, to the same logits. No torch: a toy decoder graph in ONNX text stands in
for an export.
"""

import sys
from pathlib import Path

import numpy as np
import onnx
import onnx.parser
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "corpus"))
import decode_steps_unseen as decode

RTOL, ATOL = 0.0, 1e-6

# The three channels of logits[b, s] are the running sum of every token fed so far: channel
# 0 from the keys (a cache that grows along axis 2), channel 1 from a fixed-size state (the
# sum of earlier calls' tokens, carried as is), channel 2 from indexer keys (a cache that
# grows along axis 1, as DeepSeek sparse attention's): right whatever the calls' lengths
# only if both caches start empty, the state at zeros, and all are carried from present
# to past.
TOY = """
<ir_version: 8, opset_import: ["" : 18]>
toy (int64[batch, seq] input_ids, int64[batch, total] attention_mask,
     float[batch, 1, past, 1] past_key, float[batch, 1, 1] past_conv,
     float[batch, past, 1] past_index)
    => (float[batch, seq, 3] logits, float[batch, 1, total, 1] present_key,
        float[batch, 1, 1] present_conv, float[batch, total, 1] present_index) {
    ids = Cast<to = 1>(input_ids)
    heads_and_dim = Constant<value = int64[2] {1, 3}>()
    length_axis = Constant<value = int64[1] {2}>()
    token_axis = Constant<value = int64[1] {1}>()
    new_key = Unsqueeze(ids, heads_and_dim)
    present_key = Concat<axis = 2>(past_key, new_key)
    running = CumSum(present_key, length_axis)
    seq = Shape<start = 1, end = 2>(input_ids)
    zero = Constant<value = int64[1] {0}>()
    start = Sub(zero, seq)
    end = Constant<value = int64[1] {9223372036854775807}>()
    recent = Slice(running, start, end, length_axis)
    from_keys = Squeeze(recent, heads_and_dim)
    earlier = Squeeze(past_conv, length_axis)
    within = CumSum(ids, token_axis)
    from_state = Add(within, earlier)
    channel_0 = Unsqueeze(from_keys, length_axis)
    channel_1 = Unsqueeze(from_state, length_axis)
    new_index = Unsqueeze(ids, length_axis)
    present_index = Concat<axis = 1>(past_index, new_index)
    index_running = CumSum(present_index, token_axis)
    channel_2 = Slice(index_running, start, end, token_axis)
    logits = Concat<axis = 2>(channel_0, channel_1, channel_2)
    call_sum = ReduceSum<keepdims = 1>(ids, token_axis)
    call_total = Unsqueeze(call_sum, length_axis)
    present_conv = Add(past_conv, call_total)
}
"""
RENAMED = {
    "past_key": "past_key_values.0.key",
    "past_conv": "past_key_values.0.conv",
    "present_key": "present.0.key",
    "present_conv": "present.0.conv",
    "past_index": "past_key_values.0.indexer_key",
    "present_index": "present.0.indexer_key",
}


@pytest.fixture(scope="module", params=["any length", "one token", "one row, one token"])
def toy(request, tmp_path_factory) -> Path:
    """The toy for any number of new tokens, or exported for one (input_ids [batch, 1]),
    or for one row too (every batch dim 1, as torch.onnx fixes some)."""
    text = TOY
    if "one token" in request.param:
        text = text.replace("int64[batch, seq] input_ids", "int64[batch, 1] input_ids")
    if "one row" in request.param:
        text = text.replace("[batch,", "[1,")
    model = onnx.parser.parse_model(text)  # its parser takes no dots in names: renamed here
    for node in model.graph.node:
        node.input[:] = [RENAMED.get(name, name) for name in node.input]
        node.output[:] = [RENAMED.get(name, name) for name in node.output]
    for value in [*model.graph.input, *model.graph.output]:
        value.name = RENAMED.get(value.name, value.name)
    onnx.checker.check_model(model, full_check=True)
    path = tmp_path_factory.mktemp("toy") / "toy.onnx"
    onnx.save(model, path)
    return path


def test_keys_and_values_start_empty_and_other_states_at_zeros():
    key = decode.empty_state("past_key_values.3.key", ["batch", 2, "past", 32], 2)
    indexer = decode.empty_state("past_key_values.3.indexer_key", ["batch", "past", 32], 2)
    conv = decode.empty_state("past_key_values.0.conv.1", ["batch", 768, 4], 2)
    assert key.shape == (2, 2, 0, 32)
    assert indexer.shape == (2, 0, 32)  # [batch, length, dim]: one head, length on axis 1
    assert conv.shape == (2, 768, 4) and not conv.any()


def test_an_empty_state_of_unknown_size_is_an_error_naming_it():
    with pytest.raises(ValueError, match=r"past_key_values.0.recurrent: dims \[2\]"):
        decode.empty_state("past_key_values.0.recurrent", ["batch", 8, "d", 32], 1)


def test_each_present_state_becomes_the_next_past_and_a_missing_one_is_an_error():
    outputs = {"logits": 0, "present.0.key": 1, "present.0.conv": 2}
    past = ["past_key_values.0.key", "past_key_values.0.conv"]
    assert decode.carry(outputs, past) == {past[0]: 1, past[1]: 2}
    with pytest.raises(ValueError, match="past_key_values.1.key"):
        decode.carry(outputs, [*past, "past_key_values.1.key"])


def _expected(ids: np.ndarray, tokens: list[np.ndarray]) -> list[np.ndarray]:
    """The toy's logits by hand: the running sum of every token fed so far."""
    whole = np.concatenate([ids, *(t[:, None] for t in tokens)], axis=1).astype(np.float32)
    running = np.repeat(np.cumsum(whole, axis=1)[..., None], 3, axis=-1)
    length = ids.shape[1]
    return [running[:, :length]] + [running[:, length + i :][:, :1] for i in range(len(tokens))]


@settings(max_examples=20, deadline=None)
@given(length=st.integers(1, 6), steps=st.integers(0, 3))
def test_the_decode_carries_every_state_call_after_call(toy, length, steps):
    ids, mask = decode.prompts(2, length, length // 2)
    tokens = [np.array([3 + i, 5 + i]) for i in range(steps)]
    logits, chosen = decode.run_steps(toy, ids, mask, steps, tokens)
    assert len(chosen) == steps
    for got, want in zip(logits, _expected(ids, tokens), strict=True):
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


def test_the_check_cell_says_what_the_check_left_out() -> None:
    """A graph fixed to some lengths passes its check on the lengths the original runs
    at; the row must say the rest was left out (Falcon-H1's any-length export fixed to 4
    new tokens read "passed" alone), and a fallback or a failure say so."""
    from types import SimpleNamespace

    def result(passed=True, skipped=(), failure=None, fallback=None):
        check = SimpleNamespace(passed=passed, skipped=list(skipped), failure=failure)
        return SimpleNamespace(check=check, fallback=fallback)

    cell = decode.unseen.check_cell
    assert cell(result()) == "passed"
    left = cell(result(skipped=["{'sequence': 7}: left out: the original cannot run"]))
    assert left.startswith("passed; left out, the original cannot run there: {'sequence': 7}")
    assert cell(result(passed=False, failure="mismatch")) == "mismatch"
    assert cell(result(fallback={"failure": "fused_cannot_run"})) == "fell back: fused_cannot_run"
    assert cell(SimpleNamespace(check=None, fallback=None)) == "none"
