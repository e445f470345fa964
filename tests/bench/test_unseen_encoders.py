"""The sixth survey (bench/corpus/unseen_encoders.py): encoders, vision, speech and seq2seq
decoders outside the corpus. Its table's cells (an exporter's failure in one cell, the
fusions that are neither attention nor a norm, the first attention near miss only where a
Softmax is left), the family table's completeness (every family's kind has a wrapper,
none is a corpus family), and, in the corpus tier, four families end to end (DeiT,
and Funnel, Swin-V2 and WavLM, whose attention three rules each read), optimized with the
check, every attention fused.
"""

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "corpus"))
import _unseen_encoders as enc
import unseen_encoders as survey

# the corpus's encoder families (bench/corpus/_torch_families.py, make_transformer_models.py)
CORPUS = {"whisper_encoder", "t5_encoder", "swin", "deberta_v2", "modernbert", "torch_encoder"}
CORPUS |= {"bert", "roberta", "distilbert", "vit", "gpt2", "llama", "qwen2", "phi3", "gptj"}


def _row(**cells) -> dict:
    base = {"family": "beit", "exporter": "dynamo", "attn": "sdpa", "attention": 0}
    base |= {"softmax": 2, "softmax_left": 2, "norms": 5, "other": "", "check": "passed"}
    return base | {"miss": ""} | cells


def test_the_table_has_a_row_per_export_and_an_error_in_one_cell():
    miss = "attention: the bias | is not a mask"
    rows = [
        _row(exporter="torchscript", attention=2, softmax_left=0, other="gelu_erf_bias 2"),
        _row(miss=miss),
        {"family": "longformer", "exporter": "dynamo", "attn": "eager", "error": "export | x"},
    ]
    lines = survey.markdown(rows).splitlines()
    assert len(lines) == 2 + len(rows)
    assert all(line.count("|") == 10 for line in lines), "a '|' in a cell splits a column"
    assert "| torchscript (sdpa) | 2 | 2, 0 | 5 | gelu_erf_bias 2 | passed |  |" in lines[2]
    assert lines[3].endswith("| - | passed | attention: the bias / is not a mask |")
    assert "| dynamo (eager) | - | - | - | - | export / x | |" in lines[4]
    assert enc.FAMILIES["longformer"].about in lines[4]


def test_an_export_error_is_the_exporters_own_cause_in_one_short_cell():
    cause = RuntimeError("\x1b[31mCannot view\x1b[0m a tensor\n  with shape " + "x" * 300)
    wrapper = ValueError("Failed to export; see the report")
    wrapper.__cause__ = cause
    cell = survey.export_error(wrapper)
    assert cell.startswith("export failed: RuntimeError: Cannot view a tensor with shape x")
    assert len(cell) == 160 and "\x1b" not in cell and "\n" not in cell
    plain = survey.export_error(KeyError("no"))
    assert plain == "export failed: KeyError: 'no'"


def test_other_fusions_leave_out_attention_and_norms_most_first():
    counts = {"attention": 2, "layer_norm": 5, "skip_layer_norm": 3, "gelu_erf_bias": 2}
    counts |= {"qkv_bias_merge": 4, "encoder_attention_block": 1}
    assert survey.other_fusions(counts) == "qkv_bias_merge 4, gelu_erf_bias 2"
    assert survey.other_fusions({"attention": 2}) == ""


@pytest.mark.parametrize(
    ("left", "want"),
    [(0, ""), (1, "attention: the mask is computed from the values")],
    ids=["all-fused-no-miss", "softmax-left-first-attention-miss"],
)
def test_the_first_miss_is_an_attentions_and_only_where_a_softmax_is_left(left, want):
    misses = [
        SimpleNamespace(pattern="gelu_tanh", reason="not a GELU"),
        SimpleNamespace(pattern="attention", reason="the mask is computed from the values"),
        SimpleNamespace(pattern="attention", reason="a later one"),
    ]
    assert survey.first_miss(SimpleNamespace(near_misses=misses), left) == want


def test_every_family_has_a_wrapper_for_its_kind_and_none_is_the_corpus():
    assert not CORPUS & set(enc.FAMILIES), "the survey is of families the corpus lacks"
    assert len(enc.FAMILIES) >= 20
    for name, spec in enc.FAMILIES.items():
        assert spec.kind in enc.KINDS, name
        assert spec.about and "|" not in spec.about, name
        assert (spec.part == "decoder") == (spec.kind == "decoder"), name
        assert spec.config.endswith("Config") and spec.model[0].isupper(), name


def test_the_wrappers_and_classes_exist_in_transformers():
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("torch")
    import _unseen_encoder_export as export

    assert set(export.WRAPPERS) == set(enc.KINDS)
    for name, spec in enc.FAMILIES.items():
        assert hasattr(transformers, spec.config) and hasattr(transformers, spec.model), name


@pytest.mark.corpus
@pytest.mark.parametrize(
    ("family", "kind", "attention"),
    [
        ("deit", "torchscript", 2),
        ("funnel", "dynamo", 2),  # Einsum scores, a chain of biases, a -1e6 mask
        ("swinv2", "torchscript", 4),  # cosine attention, a per-head scale, window masks
        ("wavlm", "dynamo", 2),  # heads folded into the batch from [S, B, E], a gated bias
    ],
)
def test_a_surveyed_family_end_to_end_fuses_every_attention(tmp_path, family, kind, attention):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    row = survey.survey(family, kind, tmp_path)
    assert "error" not in row, row
    assert (row["attention"], row["softmax"], row["softmax_left"]) == (attention,) * 2 + (0,), row
    assert row["check"] == "passed" and row["miss"] == "", row


def test_the_survey_scripts_name_the_choices_of_an_unknown_family(capsys, tmp_path):
    """``known_families`` and ``emit_table``, which the three survey scripts share."""
    with pytest.raises(SystemExit):
        survey.main(["deit", "nosuch", "--out", str(tmp_path)])
    said = capsys.readouterr().err
    assert "unknown families ['nosuch']" in said and "deit, beit" in said
    parser = survey.argparse.ArgumentParser()
    assert survey.known_families(parser, [], enc.FAMILIES) == list(enc.FAMILIES)
    survey.emit_table("| a |\n", tmp_path / "t.md")
    assert (tmp_path / "t.md").read_text() == "| a |\n" and "| a |" in capsys.readouterr().out
