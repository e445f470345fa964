"""The original model's runs, before the fused model's: on each plan's feeds, its
session released after (one session at a time), its outputs kept to compare against.
Where the check chooses the sizes it settles them on the first the original runs at."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
import onnxruntime as ort

from autofusion.fusion_core.errors import ConfigError
from autofusion.fusion_core.validate._dims import CANDIDATES, candidate_dims, second_length_dims
from autofusion.fusion_core.validate._plans import Plan
from autofusion.fusion_core.validate._result import ORIGINAL_CANNOT_RUN, CheckResult, first_line
from autofusion.fusion_core.validate._sessions import ModelSource, make_session

__all__ = ["Expected", "Ran", "run_original"]


@dataclass
class Ran:
    """What the original did on one plan: each feed it ran and its outputs, in order;
    the failure that stopped it, if any (the fused model runs the feeds before it)."""

    feeds: list[Mapping[str, np.ndarray]] = field(default_factory=list)
    outputs: list[list[np.ndarray]] = field(default_factory=list)
    error: str | None = None
    failure: str | None = None
    skipped: str | None = None  # a profile the check added, left out: why


@dataclass
class Expected:
    """The original's outputs on every plan, kept while its session is released."""

    names: list[str]
    dtypes: dict[str, str]
    plans: list[Ran] = field(default_factory=list)
    # An input the generator cannot make (ConfigError): raised once the fused model is
    # known to load, as when both sessions were made before either ran
    pending: ConfigError | None = None


def run_original(
    original: ModelSource, plans: list[Plan], generate: Callable[..., dict], result: CheckResult
) -> Expected | None:
    """The original on every plan's feeds, its session released after; None when it
    cannot load (``result`` says why)."""
    try:
        reference = make_session(original)
    except Exception as exc:  # onnxruntime raises many types; report them all
        result.error = (
            f"onnxruntime cannot load the original model: {first_line(str(exc))}; the check "
            "needs it (--no-check fuses without checking)"
        )
        result.failure = ORIGINAL_CANNOT_RUN  # says nothing about the fusion
        return None
    outs = reference.get_outputs()
    expected = Expected([o.name for o in outs], {o.name: _dtype_name(o.type) for o in outs})
    try:
        for plan in plans:
            ran = Ran()
            expected.plans.append(ran)
            if plan.follows is not None:
                _run_second_length(reference, expected, plan, generate, ran)
                continue
            if plan.feeds is None and (error := _runnable_dims(reference, plan, generate, ran)):
                ran.error, ran.failure = error, ORIGINAL_CANNOT_RUN  # nothing to compare
                continue
            rest = plan.seeds[len(ran.feeds) :]  # the first sample ran as the candidate's trial
            generated = (generate(seed=s, dims=plan.check.dims) for s in rest)
            _run_reference(reference, expected.names, plan.feeds or generated, ran)
    except ConfigError as exc:  # without its frames, which hold the session
        expected.pending = exc.with_traceback(None)
    return expected  # the session goes here: its weights with it


def _run_second_length(
    reference: ort.InferenceSession,
    expected: Expected,
    plan: Plan,
    generate: Callable[..., dict],
    ran: Ran,
) -> None:
    """The original at the sizes the plan it follows settled on, its sequence changed:
    left out (``ran.skipped``) where that plan did not run or the original cannot run at
    these sizes (a model that runs at some lengths only), as a candidate that does not
    run is (``_runnable_dims``)."""
    follows, before = plan.follows, expected.plans[plan.index_of_follows]
    if follows is None or plan.info is None or before.error is not None:
        ran.skipped = ""  # the profile it varies failed: that says it all
        return
    plan.check.dims = second_length_dims(plan.info, follows.check.dims, plan.given) or {}
    generated = (generate(seed=s, dims=plan.check.dims) for s in plan.seeds)
    _run_reference(reference, expected.names, generated, ran)
    if ran.error is not None:
        ran.skipped = f"left out: {ran.error}"
        ran.feeds, ran.outputs, ran.error, ran.failure = [], [], None, None


def _run_reference(
    reference: ort.InferenceSession,
    names: list[str],
    feeds: Iterable[Mapping[str, np.ndarray]],
    ran: Ran,
) -> None:
    """The original on each feed in order, until one fails (``ran`` says why)."""
    for feed in feeds:
        try:
            outputs = reference.run(names, dict(feed))
        except ConfigError:
            raise  # an input the generator cannot make: the caller's to fix, not a run failure
        except Exception as exc:
            ran.error = f"the original model cannot run on these inputs: {first_line(str(exc))}"
            ran.failure = ORIGINAL_CANNOT_RUN
            return
        ran.feeds.append(feed)
        ran.outputs.append(outputs)


def _runnable_dims(
    reference: ort.InferenceSession,
    plan: Plan,
    generate: Callable[..., dict],
    ran: Ran,
) -> str | None:
    """Settle ``plan``'s dims on the first candidate the original runs on (its run is
    the plan's first sample, kept in ``ran``); else say why.

    Sizes the user gave are kept; the others are tried in ``candidate_dims`` order, so a
    detector whose Resize needs a multiple of 32 is not judged on a 1x1 image.
    """
    tried: list[dict[str, int]] = []
    last_error = ""
    for k in range(CANDIDATES):
        dims = candidate_dims(plan.info, plan.given, k)
        if dims in tried:
            continue
        tried.append(dims)
        try:
            feed = generate(seed=plan.seeds[0], dims=dims)
            outputs = reference.run(None, feed)
        except ConfigError:
            raise  # an input the generator cannot make: the caller's to fix
        except Exception as exc:
            last_error = first_line(str(exc))
            continue
        plan.check.dims = dims
        ran.feeds.append(feed)
        ran.outputs.append(outputs)
        return None
    free = [name for name in plan.info.names if name not in plan.given]
    hint = (
        f"give --shape NAME=VALUE for {', '.join(free)}"
        if free
        else "the sizes given with --shape do not suit it"
    )
    return (
        f"the original model cannot run on generated inputs (tried {tried}): {last_error}; "
        f"{hint}, or your own inputs with --inputs"
    )


_ORT_TYPE_NAMES = {"float": "float32", "double": "float64"}


def _dtype_name(ort_type: str) -> str:
    """'tensor(float16)' -> 'float16' (ONNX's 'float' and 'double' as numpy names)."""
    inner = ort_type.removeprefix("tensor(").removesuffix(")")
    return _ORT_TYPE_NAMES.get(inner, inner)
