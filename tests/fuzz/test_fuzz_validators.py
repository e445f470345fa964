"""Bounded fuzzing of the two validators that take hostile input (issue 15, item 4).

``inspect_model`` on mutated valid models may only refuse (ProblemError), and the
pattern compiler on mutated built-in patterns only with a PatternError: anything else
would reach a client as a 500. The generators are bench/fuzz_validators.py's (which
runs them for longer); each input a run found is kept below as an explicit example.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import fuzz_validators as fv

from autofusion.fusion_core import compile_pattern
from autofusion.fusion_core.errors import PatternError

BOUNDED = settings(
    max_examples=200,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _seed_bytes(index: int, word: bytes, replacement: bytes) -> bytes:
    """Seed model ``index`` serialized, ``word`` replaced by as many other bytes."""
    assert len(word) == len(replacement)
    content = fv.seed_models()[index].SerializeToString()
    assert word in content
    return content.replace(word, replacement, 1)


def _external_seed(**entries: str) -> bytes:
    model = fv.seed_models()[1]
    tensor = model.graph.initializer[0]
    for key, value in entries.items():
        tensor.external_data.add(key=key, value=value)
    return model.SerializeToString()


# Inputs found by the fuzzer (or by the attack list) that raised something
# other than a ProblemError before the fix: TypeError on bytes where protobuf found
# no UTF-8, ValueError/OSError from the file system, size checks missing.
MODEL_REGRESSIONS = {
    "domain-not-utf8": _seed_bytes(3, b"ai.acme", b"ai.\xff\xfe\xfd\xfc"),
    "location-not-utf8": _seed_bytes(1, fv.DATA_NAME.encode(), b"\xc3\x28bin"),
    "key-not-utf8": _seed_bytes(1, b"location", b"loca\xfftio"),
    "op-type-not-utf8": _seed_bytes(0, b"Add", b"\xfe\xffd"),
    "location-with-nul": _external_seed(location="w\x00.bin"),
    "location-too-long": _external_seed(location="a" * 5000),
    "duplicate-key": _external_seed(location="w.bin"),
    "basepath-key": _external_seed(basepath="/etc"),
}


@pytest.mark.parametrize("content", MODEL_REGRESSIONS.values(), ids=MODEL_REGRESSIONS.keys())
def test_found_model_inputs_are_refused_as_problems(content, tmp_path):
    refused = fv.refusal(content, tmp_path)
    assert refused is not None and refused.status == 422, "accepted"


@BOUNDED
@given(fv.model_bytes())
@example(MODEL_REGRESSIONS["domain-not-utf8"])
def test_inspect_model_raises_only_problems_on_mutated_models(content):
    fv.check_model_bytes(content)


def _with_formula(text: str) -> dict:
    return {
        "name": "fuzz.formula",
        "nodes": [{"id": "m", "op": "Mul"}],
        "constraints": [{"kind": "formula", "value": "m.in1", "equals": text}],
        "rewriter": {"name": "fused_region", "params": {"domain": "ai.fuzz"}},
    }


def _chain(length: int) -> dict:
    nodes = [{"id": "n0", "op": "Relu"}]
    nodes += [{"id": f"n{k}", "op": "Relu", "inputs": {"0": f"n{k - 1}"}} for k in range(1, length)]
    return {"name": "fuzz.chain", "nodes": nodes, "rewriter": {"name": "fused_region"}}


PATTERN_REGRESSIONS = {
    "formula-2000-terms": _with_formula("+".join(["1"] * 2000)),  # RecursionError
    "formula-600-unary": _with_formula("-" * 400 + "1"),
    "formula-deep-parens": _with_formula("(" * 250 + "1" + ")" * 250),
    "formula-nul": _with_formula("1\x00"),
    "formula-pow-chain": _with_formula("**".join(["2"] * 100)),
    "chain-3000-nodes": _chain(3000),  # RecursionError in the cycle check; now too long
}


@pytest.mark.parametrize("spec", PATTERN_REGRESSIONS.values(), ids=PATTERN_REGRESSIONS.keys())
def test_found_pattern_inputs_are_pattern_errors(spec):
    with pytest.raises(PatternError):
        compile_pattern(spec)


@BOUNDED
@given(fv.pattern_specs())
@example(PATTERN_REGRESSIONS["formula-2000-terms"])
@example(PATTERN_REGRESSIONS["chain-3000-nodes"])
def test_the_pattern_compiler_raises_only_pattern_errors(spec):
    fv.check_pattern(spec)


def test_a_formula_at_the_limits_still_compiles():
    """The limits refuse the hostile, not what a pattern needs (the attention scale)."""
    compile_pattern(_with_formula("1 / sqrt(dim(m.out0, -1))"))
    compile_pattern(_with_formula("+".join(["1"] * 16)))
