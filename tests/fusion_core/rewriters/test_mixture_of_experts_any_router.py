"""Any router whose choice and weights the graph computes becomes one com.microsoft.MoE,
exactly: the router stays as it is and the kernel is fed ``log`` of its weights
scattered over the experts (``_any_router.py``).

A generator (hypothesis) writes routers the kernel's own softmax and top-k do not
compute, as transformers' MoE families write them (DeepSeek-V3, AFMoE, ERNIE-4.5-MoE,
DeepSeek-V2's group-limited routing), drawing independently: the probabilities by
Softmax or Sigmoid; a selection bias added to them before the TopK (none, zeros, or
trained values that move the choice); group-limited routing (G groups, each scored by
the sum of its top 2, all but the best ``topk_group`` masked to -inf; some dropped or
none); the chosen weights gathered from the probabilities, renormalized or not (with
TorchScript's + 1e-20), times a routed scaling factor; over the expert spellings of
``test_mixture_of_experts.py`` (batched or dense, the sizes, k). Each block must become
exactly one MoE and compute what the original computes (onnxruntime, its optimizations
off) on several token counts: rtol = 1e-4, atol = 1e-5 (the kernel sums the experts in
another order and renormalizes in float32). transformers' own GLM-4.5 and DeepSeek-V2
blocks with group-limited routing, exported by TorchScript, fuse the same way (slow). A
router whose weights may be negative (the kernel weighs by a softmax) stays, with a near
miss saying so. The example budget is ``AUTOFUSION_SPELLING_EXAMPLES`` (25 in ``make
test``, 200 in ``make test-corpus``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import onnx
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from onnx import helper
from test_mixture_of_experts import (
    _PLAIN,
    HIDDEN,
    Spelling,
    _batched,
    _dense,
    _Graph,
    generated,
    group_mask,
    kernel_routing,
    ops_of,
    scaled_weights,
    token_feeds,
)

from autofusion.fusion_core.testing import build_model, make_session, optimize_quiet, run_both

pytestmark = pytest.mark.spelling  # the corpus tier runs it with 200 examples

TOL = dict(rtol=1e-4, atol=1e-5)


@dataclass(frozen=True)
class Router:
    probability: str  # "Softmax" or "Sigmoid"
    bias: str  # "none", "zero" (an Add of zeros) or "trained" (moves the choice)
    groups: int  # 0: no group step; else G groups
    topk_group: int  # the groups kept (G: none dropped)
    normalize: bool
    epsilon: bool  # TorchScript's + 1e-20 in the denominator
    scale: float  # routed_scaling_factor
    weights: str = "gathered"  # or "values": the TopK's values (the groups filled with 0)
    group_score: str = "top2"  # a group's score: the sum of its top 2, or its "max"
    # "probabilities": the choice and weights read the Softmax or Sigmoid; "logits": the
    # top k of the logits (plus the bias), weighed by Sigmoid(GatherElements(logits))
    picked_from: str = "probabilities"


@st.composite
def blocks(draw) -> tuple[Router, Spelling]:
    experts = draw(st.sampled_from([4, 6, 8]))
    k = draw(st.integers(1, min(3, experts)))
    groups = draw(st.sampled_from([0, *[g for g in (2, 4) if experts % g == 0]]))
    size = experts // groups if groups else experts
    # the kept groups must hold k experts, or the TopK picks a masked one
    kept = draw(st.integers(-(-k // size), groups)) if groups else 0
    values = draw(st.booleans())  # DeepSeek-V2's greedy groups: softmax, no bias
    router = Router(
        probability="Softmax" if values else draw(st.sampled_from(["Softmax", "Sigmoid"])),
        bias="none" if values else draw(st.sampled_from(["none", "zero", "trained"])),
        groups=groups,
        topk_group=kept,
        normalize=draw(st.booleans()),
        epsilon=draw(st.booleans()),
        scale=draw(st.sampled_from([1.0, 2.5])),
        weights="values" if values else "gathered",
        group_score=draw(st.sampled_from(["top2", "max"])),
    )
    if not values and not groups and router.probability == "Sigmoid" and draw(st.booleans()):
        router = replace(router, picked_from="logits")
    experts_spelling = replace(
        _PLAIN,
        experts=experts,
        k=k,
        inter=draw(st.sampled_from([4, 8])),
        layout=draw(st.sampled_from(["batched", "dense"])),
        gather_nd=draw(st.booleans()),
        weight_first=draw(st.booleans()),
        fused_gate_up=draw(st.booleans()),
        gate_second=draw(st.booleans()),
    )
    return router, experts_spelling


def _router(g: _Graph, r: Router, s: Spelling, x: str) -> tuple[str, str]:
    """(routing weights [T, k], chosen experts [T, k])."""
    logits = g.one("MatMul", x, g.const(g.weight(HIDDEN, s.experts), "router"))
    attrs = {"axis": -1} if r.probability == "Softmax" else {}
    by_logits = r.picked_from == "logits"
    probs = logits if by_logits else g.one(r.probability, logits, **attrs)
    choice = probs
    if r.bias != "none":
        bias = np.zeros(s.experts, np.float32)
        if r.bias == "trained":  # about the probabilities' spread: it moves the choice
            bias = np.random.default_rng(7).uniform(-0.3, 0.3, s.experts).astype(np.float32)
        choice = g.one("Add", probs, g.const(bias, "selection_bias"))
    if r.groups:
        fill = 0.0 if r.weights == "values" else -np.inf  # the TopK's values: 0 is no weight
        groups = (r.groups, r.topk_group)
        choice = group_mask(g, choice, s.experts, groups, score=r.group_score, fill=fill)
    top, chosen = g.op("TopK", choice, g.ints(s.k), outputs=2, axis=-1, sorted=0)
    weights = top if r.weights == "values" else g.one("GatherElements", probs, chosen, axis=1)
    if by_logits:  # sigmoid is increasing: after the gather it weighs the same experts
        weights = g.one("Sigmoid", weights)
    finished = dict(normalize=r.normalize, epsilon=r.epsilon, scale=r.scale)
    return scaled_weights(g, weights, **finished), chosen


def routed_block(r: Router, s: Spelling, seed: int = 0, tokens: int | str = "tokens"):
    """The block for ``tokens`` tokens (a number: a graph exported for one length)."""
    g = _Graph(seed)
    weights, chosen = _router(g, r, s, "hidden")
    build = _batched if s.layout == "batched" else _dense
    out = g.one("Add", build(g, s, "hidden", weights, chosen), "hidden")  # the residual
    return g.model("routed_moe", out, [tokens, HIDDEN])


feeds = token_feeds


def _misses(result) -> list[str]:
    return [f"{m.pattern}: {m.reason}" for m in result.near_misses if m.pattern.startswith("moe_")]


@generated()
@example((Router("Sigmoid", "trained", 0, 0, False, False, 1.0, picked_from="logits"), _PLAIN))
@given(blocks())
def test_every_router_becomes_one_moe_exactly(block) -> None:
    r, s = block
    model = routed_block(r, s)
    result = optimize_quiet(model, target="onnxruntime")
    fused = result.to_proto()
    ops = ops_of(fused)
    assert ops.count("MoE") == 1, f"{r} {s}: {_misses(result)}"
    assert "MatMul" not in ops[ops.index("MoE") :], f"{r} {s}: the experts stay: {ops}"
    for tokens in (1, 5, 17):
        run_both(model, fused, feeds=feeds(tokens), **TOL)


@pytest.mark.parametrize(
    "r",
    [
        Router("Sigmoid", "zero", 4, 4, True, False, 2.5),  # the kernel's own routing
        Router("Sigmoid", "none", 4, 2, True, False, 1.0),  # the groups drop experts
    ],
    ids=["kernel", "any"],
)
def test_a_router_exported_for_one_token_count_is_proven_at_that_count(r) -> None:
    """Group masks folded to ``[7, G]`` constants (a graph exported for one length) run
    at 7 tokens only: the router is proven there, not at the probe's own count."""
    model = routed_block(r, replace(_PLAIN, experts=8), tokens=7)
    result = optimize_quiet(model, target="onnxruntime")
    assert ops_of(result.to_proto()).count("MoE") == 1, _misses(result)
    run_both(model, result.to_proto(), feeds=feeds(7), **TOL)


@pytest.mark.parametrize(
    "r",
    [
        Router("Sigmoid", "trained", 0, 0, True, False, 1.0),
        Router("Softmax", "trained", 0, 0, False, False, 1.0),
        Router("Sigmoid", "zero", 4, 1, True, True, 2.5),
        Router("Softmax", "none", 2, 1, False, False, 1.0),
        Router("Softmax", "none", 4, 2, False, False, 2.5, "values", "max"),
    ],
    ids=["sigmoid-bias", "softmax-bias", "sigmoid-groups", "softmax-groups", "greedy-groups"],
)
def test_the_kernel_reads_the_routers_own_choice(r) -> None:
    """What is emitted: the router as it was, ScatterElements(add) of its weights, Log,
    the MoE with normalize_routing_weights = 1 (and the sum of the weights after it when
    the block does not renormalize); the experts the router picks, not the kernel's top k."""
    s = replace(_PLAIN, experts=8, k=2)
    model = routed_block(r, s)
    fused = optimize_quiet(model, target="onnxruntime").to_proto()
    ops = ops_of(fused)
    assert ops.count("MoE") == 1 and "Log" in ops and "TopK" in ops, ops
    reductions = [
        helper.get_attribute_value(a)
        for n in fused.graph.node
        if n.op_type == "ScatterElements"
        for a in n.attribute
        if a.name == "reduction"
    ]
    assert reductions == [b"add"], reductions
    (moe,) = [n for n in fused.graph.node if n.op_type == "MoE"]
    attrs = {a.name: helper.get_attribute_value(a) for a in moe.attribute}
    assert attrs["k"] == 2 and attrs["normalize_routing_weights"] == 1
    assert ("Mul" in ops[ops.index("MoE") :]) == (not r.normalize or r.scale != 1.0)
    run_both(model, fused, feeds=feeds(33, seed=4), **TOL)


def test_log_of_scattered_weights_is_what_the_kernel_weighs() -> None:
    """The fact the rewrite rests on, on the kernel itself: fed log(W) with W zero off
    the chosen experts (-inf there), it weighs W / sum(W) whatever its k beyond the
    chosen count, and a token with no weight at all gets an output of 0."""
    rng = np.random.default_rng(5)
    weights = np.zeros((32, 8), np.float32)
    for t in range(32):
        chosen = rng.choice(8, size=1 + t % 3, replace=False)
        weights[t, chosen] = rng.uniform(0.01, 1.0, chosen.size)
    weights[0] = 0
    with np.errstate(divide="ignore"):
        router = np.log(weights)
    expected = weights / np.maximum(weights.sum(-1, keepdims=True), 1e-30)
    for k in (3, 4):
        got = kernel_routing(router, k, 1)
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)


def test_a_router_that_picks_one_expert_twice_fuses_exactly() -> None:
    """Two ArgMax rounds with nothing masked between them pick the same expert: the block
    weighs it by both weights, and so does the scatter with add (no distinctness proof
    is needed)."""
    g = _Graph(seed=8)
    logits = g.one("MatMul", "hidden", g.const(g.weight(HIDDEN, 4), "router"))
    probs = g.one("Softmax", logits, axis=-1)
    weights, chosen = [], []
    for factor in (1.0, 0.5):
        choice = g.one("ArgMax", logits, axis=-1, keepdims=1)
        picked = g.one("GatherElements", probs, choice, axis=-1)
        weights.append(g.one("Mul", picked, g.const(np.array(factor, np.float32), "f")))
        chosen.append(choice)
    s = replace(_PLAIN, experts=4, k=2)
    routed = _batched(
        g, s, "hidden", g.one("Concat", *weights, axis=-1), g.one("Concat", *chosen, axis=-1)
    )
    model = g.model("twice", g.one("Add", routed, "hidden"), ["tokens", HIDDEN])
    result = optimize_quiet(model, target="onnxruntime")
    fused = result.to_proto()
    assert ops_of(fused).count("MoE") == 1, _misses(result)
    run_both(model, fused, feeds=feeds(21, seed=2), **TOL)


def test_weights_that_may_be_negative_keep_the_block_with_a_near_miss() -> None:
    """The sigmoid's weights shifted by a constant may be negative: log of them is NaN,
    and the kernel weighs by a softmax, never negative; the block stays, unchanged."""
    g = _Graph(seed=9)
    logits = g.one("MatMul", "hidden", g.const(g.weight(HIDDEN, 4), "router"))
    scores = g.one("Sigmoid", logits)
    choice = g.one("Add", scores, g.const(np.full(4, 0.1, np.float32), "selection_bias"))
    chosen = g.op("TopK", choice, g.ints(2), outputs=2, axis=-1)[1]
    picked = g.one("GatherElements", scores, chosen, axis=1)
    weights = g.one("Sub", picked, g.const(np.array(0.5, np.float32), "centre"))
    routed = _batched(g, replace(_PLAIN, experts=4, k=2), "hidden", weights, chosen)
    model = g.model("signed", g.one("Add", routed, "hidden"), ["tokens", HIDDEN])
    result = optimize_quiet(model, target="onnxruntime")
    fused = result.to_proto()
    assert "MoE" not in ops_of(fused)
    reasons = _misses(result)
    assert any("may be negative" in m and "Sub" in m for m in reasons), reasons
    run_both(model, fused, feeds=feeds(9), rtol=1e-5, atol=1e-6)


SIGNS = """<ir_version: 8, opset_import: ["" : 18]>
g (float[T, 4] logits) => (float[T, 2] w) {{
    p = {probability} (logits)
    v, i = TopK (p, two)
    picked = GatherElements <axis = 1> (p, i)
    total = ReduceSum (picked, last)
    mask = Greater (picked, zero)
    w = {step}
}}"""


@pytest.mark.parametrize(
    "probability, step, negative",
    [
        ("Softmax", "Div (picked, total)", False),
        ("Sigmoid", "Mul (picked, factor)", False),
        ("Sigmoid", "Max (picked, floor)", False),
        ("Sigmoid", "Clip (picked, zero)", False),
        ("Softmax", "Where (mask, zero, picked)", False),
        ("Sigmoid", "Sub (picked, factor)", True),
        ("Sigmoid", "Where (mask, floor, picked)", True),
        ("Identity", "Mul (picked, factor)", True),  # the raw logits
    ],
    ids=[
        "renormalized",
        "scaled",
        "max",
        "clip",
        "zero-fill",
        "shifted",
        "negative-fill",
        "logits",
    ],
)
def test_which_weights_cannot_be_negative(probability, step, negative) -> None:
    from autofusion.fusion_core.ir import model_from_proto
    from autofusion.fusion_core.rewriters.mixture_of_experts._any_router import nonnegative

    text = SIGNS.format(probability=probability, step=step)
    constants = {
        "two": np.array([2], np.int64),
        "last": np.array([-1], np.int64),
        "factor": np.array(2.5, np.float32),
        "floor": np.array(-1.0, np.float32),
        "zero": np.array(0.0, np.float32),
    }
    model = model_from_proto(build_model(text, constants))
    nodes = list(model.graph)
    (w,) = model.graph.outputs
    reason = nonnegative(w, {id(n) for n in nodes}, {})
    assert (reason is not None) == negative, reason


def _exported_block(name: str, tmp_path):
    """transformers' MoE block ``name`` (8 experts in 2 groups, 1 kept, top 2, weights
    with std 0.1, a trained-like selection bias where the router has one), exported by
    TorchScript at opset 17 with the tokens dynamic; the model and the block."""
    torch = pytest.importorskip("torch")  # the corpus extra's: make test runs without it

    if name == "deepseek_v2":  # groups scored by their max, the weights the TopK's values
        ds = pytest.importorskip("transformers.models.deepseek_v2.modeling_deepseek_v2")
        config = ds.DeepseekV2Config(
            hidden_size=64, moe_intermediate_size=32, n_routed_experts=8,
            num_experts_per_tok=2, n_group=2, topk_group=1,
            topk_method="group_limited_greedy", routed_scaling_factor=2.5,
        )  # fmt: skip
        make = ds.DeepseekV2Moe
    else:  # DeepSeek-V3's router: groups scored by their top 2, a selection bias
        glm = pytest.importorskip("transformers.models.glm4_moe.modeling_glm4_moe")
        config = glm.Glm4MoeConfig(
            hidden_size=64, moe_intermediate_size=32, n_routed_experts=8,
            num_experts_per_tok=2, n_group=2, topk_group=1, routed_scaling_factor=2.5,
        )  # fmt: skip
        make = glm.Glm4MoeMoE
    config._experts_implementation = "batched_mm"
    torch.manual_seed(0)
    block = make(config).eval()
    for parameter in block.parameters():
        torch.nn.init.normal_(parameter, std=0.1)
    if hasattr(block.gate, "e_score_correction_bias"):
        block.gate.e_score_correction_bias.data.uniform_(-0.3, 0.3)
    path = tmp_path / f"{name}.onnx"
    x = torch.randn(1, 7, 64)
    torch.onnx.export(
        block, (x,), str(path), input_names=["x"], output_names=["y"],
        dynamic_axes={"x": {1: "seq"}}, opset_version=17, dynamo=False,
    )  # fmt: skip
    return onnx.load(str(path)), block


@pytest.mark.slow  # importing transformers (and torch), a TorchScript export: about 15 s
@pytest.mark.parametrize("name", ["glm4_moe", "deepseek_v2"])
def test_group_limited_routers_as_transformers_exports_them(name, tmp_path) -> None:
    """Group-limited routing as an exporter writes it, on models no rule was written
    from: one MoE, the same outputs as the export and as torch (rtol 1e-4, atol 1e-5)."""
    torch = pytest.importorskip("torch")  # the corpus extra's: make test runs without it
    model, block = _exported_block(name, tmp_path)
    result = optimize_quiet(model, target="onnxruntime")
    fused = result.to_proto()
    assert ops_of(fused).count("MoE") == 1, _misses(result)
    x = np.random.default_rng(1).standard_normal((1, 33, 64)).astype(np.float32)
    run_both(model, fused, feeds={"x": x}, **TOL)
    with torch.no_grad():
        expected = block(torch.from_numpy(x)).numpy()
    (got,) = make_session(fused).run(None, {"x": x})
    np.testing.assert_allclose(got, expected, **TOL)


def test_generic_keeps_the_block_and_says_why() -> None:
    r = Router("Softmax", "trained", 0, 0, True, False, 1.0)
    result = optimize_quiet(routed_block(r, _PLAIN), target="generic")
    assert "MoE" not in ops_of(result.to_proto())
    assert any("ONNX has no mixture-of-experts op" in m for m in _misses(result)), _misses(result)


@pytest.mark.parametrize("normalize", [False, True])
def test_a_sigmoid_router_weighed_by_its_topk_values_fuses_without_a_near_miss(normalize) -> None:
    """Sigmoid, then TopK, the weights the TopK's values (``moe_sigmoid_topk_values``);
    the router copy the general path keeps is no candidate: no near miss is left."""
    r = Router("Sigmoid", "none", 0, 0, normalize, False, 1.0, "values")
    model = routed_block(r, _PLAIN)
    result = optimize_quiet(model, target="onnxruntime")
    assert result.counts.get("moe_sigmoid_topk_values") == 1, result.counts
    assert _misses(result) == [], _misses(result)
    for tokens in (1, 5, 17):
        run_both(model, result.to_proto(), feeds=feeds(tokens), **TOL)
