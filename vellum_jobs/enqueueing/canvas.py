"""Steps and how they combine: ``chain``, ``group`` and a named graph (``workflow``).

``fetch.s(url)`` is a step: a job function and its arguments, not enqueued
yet. ``chain(a, b, c)`` runs each after the one before, handing each the
previous result first; ``group(a, b)`` runs them side by side, and a step
after a group is handed their results as a list, in order (Celery's chord).
``workflow(name).add("key", step, after=["other"])`` is any graph of named
steps, refused if it has a cycle or names a step it does not have.

``enqueue()`` writes every step in one transaction and returns the
``Workflow`` row: a step with upstream steps is inserted waiting and is
released when they have ended (``vellum_jobs.core.dependencies``). Nothing
here imports a model at import time.
"""

from __future__ import annotations

import dataclasses
import graphlib
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Union

from django.db import DEFAULT_DB_ALIAS, router, transaction

if TYPE_CHECKING:
    from vellum_jobs.core.registry import Handler
    from vellum_jobs.core.workflow_models import Workflow

# What a step is handed first (``Job.upstream_arg``): nothing, its one
# upstream step's result, or its upstream steps' results in order.
NOTHING, RESULT, RESULTS = "", "result", "results"


@dataclasses.dataclass(frozen=True)
class Step:
    """A job function and its arguments, to enqueue as part of a chain, group, workflow or batch.

    ``takes_result`` False (``.si()``) runs it with its own arguments only.
    """

    function: Handler[Any, Any]
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    takes_result: bool = True

    def __repr__(self) -> str:
        shown = [repr(a) for a in self.args] + [f"{k}={v!r}" for k, v in self.kwargs.items()]
        return f"{self.function.name}.s({', '.join(shown)})"


Part = Union[Step, "Chain", "Group"]


class Chain:
    """Steps (or groups) run one after another; each is handed the result of the one before."""

    def __init__(self, *parts: Part) -> None:
        self.parts: tuple[Part, ...] = tuple(_flatten(_checked(parts, "chain")))
        if not self.parts:
            raise ValueError("chain() needs at least one step")

    def then(self, part: Part) -> Chain:
        """This chain, then ``part``."""
        return Chain(*self.parts, part)

    def enqueue(self, name: str = "") -> Workflow:
        """Enqueue every step in one transaction; returns the workflow they make up."""
        return _enqueue(_Graph.of(self), name)


class Group:
    """Steps (or chains) run side by side; a step after the group is handed their results, in order."""

    def __init__(self, *parts: Part | Iterable[Part]) -> None:
        if len(parts) == 1 and not isinstance(parts[0], (Step, Chain, Group)):
            parts = tuple(parts[0])  # group(resize.s(i) for i in ids)
        self.parts: tuple[Part, ...] = tuple(_checked(parts, "group"))

    def then(self, part: Part) -> Chain:
        """Run ``part`` once every step of the group has ended done, handed their results."""
        return Chain(self, part)

    def enqueue(self, name: str = "") -> Workflow:
        """Enqueue every step in one transaction; returns the workflow they make up."""
        return _enqueue(_Graph.of(self), name)


class NamedWorkflow:
    """A graph of named steps (``workflow("nightly")``); each ``add`` names the steps it waits for.

    A step is handed nothing: its handler reads its upstream steps' outcomes
    with ``vellum_jobs.upstream()``.
    """

    def __init__(self, name: str = "") -> None:
        self.name = name
        self.steps: dict[str, tuple[Step, tuple[str, ...]]] = {}

    def add(self, key: str, step: Step, *, after: Sequence[str] = ()) -> NamedWorkflow:
        if not isinstance(key, str) or not key:
            raise ValueError(f"workflow {self.name!r}: a step's name must be a non-empty string, got {key!r}")
        if key in self.steps:
            raise ValueError(f"workflow {self.name!r}: there is a step {key!r} already")
        if isinstance(after, str):
            raise ValueError(f"workflow {self.name!r}: after= takes a list of step names, got {after!r}")
        self.steps[key] = (_checked([step], "workflow")[0], tuple(after))  # type: ignore[assignment]
        return self

    def enqueue(self) -> Workflow:
        """Enqueue every step in one transaction; ``ValueError`` for a cycle or an unknown step."""
        return _enqueue(_Graph.of_named(self), self.name)


def chain(*parts: Part) -> Chain:
    """Steps run one after another, each handed the result of the one before:
    ``chain(fetch.s(url), parse.s(), save.s()).enqueue()``. A group in a chain
    hands the step after it a list of its results, in order."""
    return Chain(*parts)


def group(*parts: Part | Iterable[Part]) -> Group:
    """Steps run side by side: ``group(resize.s(i) for i in ids)``; ``.then(report.s())``
    runs ``report`` once all have ended done, handed their results in order."""
    return Group(*parts)


def workflow(name: str = "") -> NamedWorkflow:
    """A graph of named steps: ``workflow("nightly").add("load", load.s(), after=["extract"])``.
    ``enqueue()`` refuses a cycle or an unknown step with ``ValueError``, before writing anything."""
    return NamedWorkflow(name)


def _checked(parts: Iterable[object], where: str) -> list[Part]:
    checked = []
    for part in parts:
        if not isinstance(part, (Step, Chain, Group)):
            raise TypeError(f"{where}() takes steps such as fetch.s(url), chains and groups, got {part!r}")
        checked.append(part)
    return checked


def _flatten(parts: Iterable[Part]) -> Iterable[Part]:
    for part in parts:
        yield from (part.parts if isinstance(part, Chain) else (part,))


@dataclasses.dataclass
class _Node:
    step: Step
    upstream: list[int]  # indexes of earlier nodes
    handed: str


@dataclasses.dataclass
class _Graph:
    """The steps in an order where each comes after its upstream steps."""

    nodes: list[_Node] = dataclasses.field(default_factory=list)

    @classmethod
    def of(cls, part: Part) -> _Graph:
        graph = cls()
        graph._add(part, [], NOTHING)
        return graph

    def _add(self, part: Part, upstream: list[int], handed: str) -> list[int]:
        """Add ``part`` after the nodes ``upstream``; returns its last nodes (what comes next waits for)."""
        if isinstance(part, Step):
            self.nodes.append(_Node(part, upstream, handed if upstream and part.takes_result else NOTHING))
            return [len(self.nodes) - 1]
        if isinstance(part, Group):
            return [tail for member in part.parts for tail in self._add(member, upstream, handed)]
        for member in part.parts:
            upstream = self._add(member, upstream, handed)
            handed = RESULTS if isinstance(member, Group) else RESULT
        return upstream

    @classmethod
    def of_named(cls, named: NamedWorkflow) -> _Graph:
        label = f"workflow {named.name!r}"
        for key, (_, after) in named.steps.items():
            unknown = [name for name in after if name not in named.steps]
            if unknown:
                raise ValueError(f"{label}: step {key!r} waits for {unknown[0]!r}, which it does not have")
        sorter = graphlib.TopologicalSorter({key: after for key, (_, after) in named.steps.items()})
        try:
            order = list(sorter.static_order())
        except graphlib.CycleError as exc:
            raise ValueError(f"{label}: the steps {' -> '.join(exc.args[1])} form a cycle") from None
        index = {key: i for i, key in enumerate(order)}
        graph = cls()
        for key in order:
            step, after = named.steps[key]
            graph.nodes.append(_Node(step, [index[name] for name in after], NOTHING))
        return graph


def _enqueue(graph: _Graph, name: str) -> Workflow:
    """Insert the graph's steps in order, in one transaction, in the open batch or a new workflow."""
    from vellum_jobs.core import clock
    from vellum_jobs.core.models import Job
    from vellum_jobs.core.workflow_models import Workflow
    from vellum_jobs.enqueueing import batches

    alias = router.db_for_write(Job) or DEFAULT_DB_ALIAS
    with transaction.atomic(using=alias):
        batch = batches.current_id()
        holder = (
            Workflow.objects.using(alias).get(pk=batch)
            if batch is not None
            else Workflow.objects.using(alias).create(name=name, created_at=clock.of(alias))
        )
        ids: list[int] = []
        for run in _runs(graph.nodes):
            ids += _insert(run, [ids[i] for i in run[0].upstream], holder.pk)
    return holder


def _runs(nodes: list[_Node]) -> Iterable[list[_Node]]:
    """Consecutive nodes of one function, one upstream list and one hand-over: one insert each."""
    run: list[_Node] = []
    for node in nodes:
        if run and (node.step.function, node.upstream, node.handed) != (
            run[0].step.function,
            run[0].upstream,
            run[0].handed,
        ):
            yield run
            run = []
        run.append(node)
    if run:
        yield run


def _insert(run: list[_Node], upstream: list[int], workflow: int) -> list[int]:
    from vellum_jobs.enqueueing.rows import enqueue_calls
    from vellum_jobs.enqueueing.waiting import enqueue_after

    function = run[0].step.function
    calls = [(node.step.args, node.step.kwargs) for node in run]
    after = [*upstream, *function.options.after]
    if not after:
        return [job.pk for job in enqueue_calls(function, calls, columns={"workflow_id": workflow})]
    jobs = enqueue_after(
        function,
        calls,
        after=after,
        run_if=function.options.run_if,
        upstream_arg=run[0].handed,
        workflow_id=workflow,
    )
    return [job.pk for job in jobs]
