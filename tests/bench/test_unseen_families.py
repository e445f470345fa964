"""The decoder surveys (bench/corpus/unseen_families.py) as a guard in the corpus tier:
a few surveyed families, one per spelling a rule reads, exported and optimized end to end
with the check on. Their families are not the corpus's, so without this a change that
breaks only them shows when a survey is rerun: XGLM's TorchScript graph (heads folded into
the batch by bmm, the keys' fold read by a ``-1``) fused 0 of 2 for two stops before the
first survey was rerun.
"""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "corpus"))
import unseen_families as survey

# family, exporter, rotary ops the survey records: one per spelling a rule reads
GUARDED = [
    ("xglm", "torchscript", 0),  # heads folded into the batch (bmm), a -1 of N * batch
    ("bloom", "dynamo", 0),  # ALiBi in baddbmm over folded heads
    ("gpt_bigcode", "torchscript", 0),  # multi-query: one KV head from a fused projection
    ("codegen", "dynamo", 4),  # model-parallel blocks of one projection, interleaved rotary
    ("gemma3", "torchscript", 4),  # a norm of each head after the head Transpose
    ("phi", "dynamo", 4),  # partial rotary
]


@pytest.mark.corpus
@pytest.mark.parametrize(("family", "kind", "rotary"), GUARDED)
def test_a_surveyed_family_still_fuses_every_attention(tmp_path, family, kind, rotary):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    survey.register_unseen()
    row = survey.survey(family, kind, tmp_path)
    assert "error" not in row, row
    assert (row["attention"], row["softmax"], row["softmax_left"]) == (2, 2, 0), row
    assert row["rotary"] == rotary and row["check"] == "passed" and row["miss"] == "", row
