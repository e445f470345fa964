"""The survey's KV-cache wrapper (bench/corpus ``_llm_torch.DecodeWithCache``) loads the
past into the cache the model builds for itself (``_kv_states``) and computes the decode
step torch computes, for attention, hybrid, latent-attention, sliding and DeepSeek
sparse-attention families (whose indexer keeps its keys in the cache too), so
that the survey's KV rows (docs/benchmarks-unseen.md) are the decode step of each family.
Eager torch only, no export: about 10 s in all; it needs the corpus extra (torch,
transformers), so the corpus tier runs it.
"""

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "corpus"))
import _kv_states as kv  # noqa: E402 (torch first: importorskip)
import _llm_families as fam  # noqa: E402 (torch first: importorskip)
import _llm_torch  # noqa: E402 (torch first: importorskip)
from _unseen_fifth import FIFTH  # noqa: E402 (torch first: importorskip)
from _unseen_third import THIRD  # noqa: E402 (torch first: importorskip)

pytestmark = pytest.mark.spelling  # the corpus tier runs it with 200 examples

RTOL, ATOL = 1e-5, 1e-5
# family -> what its cache holds per layer (kind names of _kv_states.State)
CASES = {
    "llama": [("key", "value"), ("key", "value")],
    "lfm2": [("conv",), ("key", "value")],  # a short convolution: no recurrent state
    "bamba": [("conv", "recurrent"), ("key", "value")],
    "falcon_h1": [("key", "value", "conv", "recurrent")] * 2,  # both in every layer
    "youtu": [("key", "value")] * 2,  # multi-head latent attention: one latent head
    "modernbert-decoder": [("key", "value")] * 2,  # 8 KV heads, a sliding layer
    # sparse attention: without its past indexer keys the top-k keeps every key (dense)
    "deepseek_v32": [("key", "value", "indexer_key")] * 2,
    "glm_moe_dsa": [("key", "value", "indexer_key"), ("key", "value")],  # reuses the top-k
}


@pytest.fixture(autouse=True, scope="module")
def _families():
    surveyed = {**THIRD, **FIFTH}
    added = {name: spec for name, (spec, _) in surveyed.items() if name not in fam.FAMILIES}
    fam.FAMILIES.update(added)
    yield
    for name in added:
        fam.FAMILIES.pop(name)


def _prefill(model):
    ids = fam.prompt()
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=True)
    return ids.shape[1], out.logits[:, -1:].argmax(-1), out.past_key_values


@pytest.mark.parametrize("family", list(CASES))
def test_the_wrapper_computes_torchs_decode_step_from_the_cache_states(family):
    model = fam.build(family)
    states = kv.layout(model, fam.prompt())
    kinds = [tuple(s.kind for s in states if s.layer == i) for i in range(len(CASES[family]))]
    assert kinds == CASES[family]
    length, token, cache = _prefill(model)
    past = [t.clone() for t in kv.read(cache, states)]
    mask = torch.ones(1, length + 1, dtype=torch.int64)
    positions = torch.tensor([[length]])
    with torch.no_grad():
        step = model(
            input_ids=token,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
        )
        got = _llm_torch.DecodeWithCache(model, states)(token, mask, positions, past)
    want = [step.logits, *kv.read(step.past_key_values, states)]
    for name, a, b in zip(["logits", *(s.name("present") for s in states)], got, want, strict=True):
        if a.shape != b.shape:  # torch's sliding layer keeps window - 1 keys, the wrapper all
            a = a[:, :, -b.shape[2] :]
        torch.testing.assert_close(a, b, rtol=RTOL, atol=ATOL, msg=name)


def test_state_names_say_the_layer_and_what_the_tensor_is():
    states = [
        kv.State(0, "conv", 0, (1, 8, 4), False),
        kv.State(0, "recurrent", 1, (1, 2, 4, 4), False),
        kv.State(1, "key", 0, (1, 2, 7, 4), True),
        kv.State(1, "indexer_key", 0, (1, 7, 32), True),  # [batch, length, dim]
    ]
    names = [s.name("past_key_values") for s in states]
    assert names == [
        "past_key_values.0.conv",
        "past_key_values.0.recurrent.1",
        "past_key_values.1.key",
        "past_key_values.1.indexer_key",
    ]
    dims = [{0: "b"}, {0: "b"}, {0: "b", 2: "p"}, {0: "b", 1: "p"}]
    assert kv.dynamic_shapes(states, "b", "p") == dims
    pasts = kv.example(states, 2, 5, torch.Generator().manual_seed(0))
    assert [tuple(t.shape) for t in pasts] == [(2, 8, 4), (2, 2, 4, 4), (2, 2, 5, 4), (2, 5, 32)]
