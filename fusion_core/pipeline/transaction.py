"""Every step is a transaction: a rewrite, a canonical-form rule or a pre-pass that leaves
the graph cyclic, emits an op its opset lacks (or attributes its schema does not have),
writes types that do not infer, or raises, is taken back alone and the run goes on.

How a step is taken back depends on what it can tell us:

* a **rewrite** knows exactly what it changed (``rewriters.AppliedRewrite``): it is
  checked right after it is applied and undone in place (``rounds.py``); a rewrite that
  made a cycle is found after its round, where the cycle's nodes name it, and undone;
* a **canonical rule** or a **pre-pass** rewrites wherever it likes: ``StepGuard``
  checks what it wrote and raises ``StepFailed``, and ``optimize_once`` runs again from
  the model as loaded with that rule or pass left out (a rare path: one more pass).

Each such step becomes a ``Rejection`` of kind ``bug`` in the result (the report's
``rejected``), with what failed, so a user can report it; the rest of the run is as if
the step had never been tried.
"""

from __future__ import annotations

from collections.abc import Iterable

import onnx_ir as ir

from autofusion.fusion_core.pipeline.result import Rejection
from autofusion.fusion_core.validate import cycle_members, emitted_problems

__all__ = [
    "StepFailed",
    "StepGuard",
    "cycle_problem",
    "describe_exception",
    "step_problems",
]

MAX_RETRIES = 8  # steps left out of one run before it gives up on fusing at all


class StepFailed(Exception):
    """A step that cannot be undone in place failed: run again without it. ``fatal``:
    no step can be left out (the rounds themselves raised): the model comes back as it
    came, checked."""

    def __init__(self, rejection: Rejection, *, fatal: bool = False) -> None:
        super().__init__(f"{rejection.step} {rejection.name!r}: {rejection.failed}")
        self.rejection = rejection
        self.fatal = fatal


def step_problems(nodes: Iterable[ir.Node], model: ir.Model, target: str) -> str | None:
    """What is wrong with the nodes one step wrote, in one sentence; None: nothing."""
    problems = emitted_problems(nodes, model, target=target)
    return "; ".join(problems) if problems else None


def cycle_problem(graph: ir.Graph) -> str | None:
    """The cycle in ``graph``, named by a few of its nodes; None: there is none."""
    cyclic = cycle_members(graph)
    if not cyclic:
        return None
    names = [n.name or n.op_type for n in graph if id(n) in cyclic]
    shown = ", ".join(repr(n) for n in names[:4]) + (", ..." if len(names) > 4 else "")
    return f"the graph has a cycle through {len(names)} nodes ({shown})"


class StepGuard:
    """Checks, after each named step, what the step wrote into ``model``; raises
    ``StepFailed`` naming the step when it broke the graph (or raised: ``run``)."""

    def __init__(
        self, model: ir.Model, target: str, step: str, graph: ir.Graph | None = None
    ) -> None:
        self.model, self.target, self.step = model, target, step
        self.graph = graph if graph is not None else model.graph  # where the step works
        self.known = {id(n) for n in ir.traversal.RecursiveGraphIterator(self.graph)}

    def changed(self, name: str) -> None:
        """``name`` changed the graph: check what it wrote."""
        new = [
            n for n in ir.traversal.RecursiveGraphIterator(self.graph) if id(n) not in self.known
        ]
        self.known.update(id(n) for n in new)
        failed = step_problems(new, self.model, self.target) or cycle_problem(self.graph)
        if failed:
            nodes = tuple(n.name or n.op_type for n in new[:20])
            raise StepFailed(Rejection(self.step, name, nodes, failed))

    def raised(self, name: str, exc: Exception) -> StepFailed:
        """The failure to raise for a step that raised ``exc``."""
        return StepFailed(Rejection(self.step, name, (), describe_exception("it", exc)))


def describe_exception(who: str, exc: BaseException) -> str:
    """``who raised ValueError at _core.py: ...``: the exception and the file it came
    from, enough for a bug report without a traceback."""
    where = exc.__traceback__
    while where is not None and where.tb_next is not None:
        where = where.tb_next
    place = f" at {where.tb_frame.f_code.co_filename.rsplit('/', 1)[-1]}" if where else ""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{who} raised {type(exc).__name__}{place}: {text}".rstrip(": ")
