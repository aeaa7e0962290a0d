"""A workflow's graph drawn on the server as inline SVG: no script, no layout library.

Each job is a box labelled ``#id name``, coloured by its state (the state
badges' colours, from ``admin.css``: classes, not inline styles, so a
Content-Security-Policy without ``unsafe-inline`` still colours them) and
linked to its page; each ``Dependency`` is an arrow from the upstream job to
the job that waits for it. Jobs are laid out in layers, left to right: a
job's layer is the longest path to it from a job that waits for none, so
every arrow points right. Within a layer, jobs are ordered by the mean
place of their upstream jobs (one barycentre pass), which keeps the arrows
of chains and fans mostly straight, then by id.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Sequence

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from vellum_jobs.observe.workflows import Edge, Step

# The drawing's units are pixels: the SVG is drawn at its size and scrolls in its box.
BOX_WIDTH, BOX_HEIGHT = 170, 26
COLUMN, ROW = BOX_WIDTH + 60, BOX_HEIGHT + 12  # from one box's start to the next's
MARGIN = 8
# Characters of a label that fit a box; a longer one is cut, whole in its tooltip.
LABEL_CHARS = 24


@dataclasses.dataclass(frozen=True)
class Placed:
    step: Step
    layer: int
    row: int

    @property
    def x(self) -> int:
        return MARGIN + self.layer * COLUMN

    @property
    def y(self) -> int:
        return MARGIN + self.row * ROW


def layers(steps: Sequence[Step], edges: Sequence[Edge]) -> dict[int, int]:
    """Each step's layer: 0 for one that waits for none of ``steps``, else one past its upstream jobs'.

    Steps on a cycle (refused at enqueue, so never expected) go one past the rest.
    """
    ids = {step.id for step in steps}
    upstream: dict[int, list[int]] = defaultdict(list)
    downstream: dict[int, list[int]] = defaultdict(list)
    for edge in edges:
        if edge.upstream in ids and edge.job in ids:
            upstream[edge.job].append(edge.upstream)
            downstream[edge.upstream].append(edge.job)
    waiting = {pk: len(upstream[pk]) for pk in ids}
    ready = sorted(pk for pk, n in waiting.items() if n == 0)
    layer: dict[int, int] = {}
    while ready:  # Kahn's order: a job's layer is final once all its upstream jobs have theirs
        pk = ready.pop()
        layer[pk] = max((layer[up] + 1 for up in upstream[pk]), default=0)
        for down in downstream[pk]:
            waiting[down] -= 1
            if waiting[down] == 0:
                ready.append(down)
    beyond = max(layer.values(), default=-1) + 1
    return {step.id: layer.get(step.id, beyond) for step in steps}


def place(steps: Sequence[Step], edges: Sequence[Edge]) -> list[Placed]:
    """Each step in its layer (a column) and row."""
    layer_of = layers(steps, edges)
    upstream: dict[int, list[int]] = defaultdict(list)
    for edge in edges:
        upstream[edge.job].append(edge.upstream)
    columns: dict[int, list[Step]] = defaultdict(list)
    for step in steps:
        columns[layer_of[step.id]].append(step)
    row_of: dict[int, int] = {}
    placed = []
    for layer in sorted(columns):

        def barycentre(step: Step) -> tuple[float, int]:
            rows = [row_of[up] for up in upstream[step.id] if up in row_of]
            return (sum(rows) / len(rows) if rows else -1.0, step.id)

        for row, step in enumerate(sorted(columns[layer], key=barycentre)):
            row_of[step.id] = row
            placed.append(Placed(step, layer, row))
    return placed


def svg(steps: Sequence[Step], edges: Sequence[Edge], job_urls: dict[int, str], title: str) -> SafeString:
    """The graph of ``steps`` and the ``edges`` between them; each box links to its ``job_urls`` entry."""
    placed = place(steps, edges)
    if not placed:
        return format_html("{}", "")
    at = {p.step.id: p for p in placed}
    width = max(p.x for p in placed) + BOX_WIDTH + MARGIN
    height = max(p.y for p in placed) + BOX_HEIGHT + MARGIN
    arrows = format_html_join(
        "",
        '<path class="vellum-edge" data-from="{}" data-to="{}" data-ended="{}" d="{}" '
        'marker-end="url(#vellum-arrow)"><title>#{} then #{}</title></path>',
        (
            (
                edge.upstream,
                edge.job,
                edge.upstream_state,
                _curve(at[edge.upstream], at[edge.job]),
                edge.upstream,
                edge.job,
            )
            for edge in edges
            if edge.upstream in at and edge.job in at
        ),
    )
    boxes = format_html_join(
        "",
        '<a class="vellum-node-link" href="{}"><g class="vellum-node vellum-node-{}" data-job="{}" '
        'data-layer="{}" transform="translate({} {})"><title>#{} {}: {}</title>'
        '<rect width="{}" height="{}" rx="4"/><text x="8" y="17">{}</text></g></a>',
        (
            (
                job_urls[p.step.id],
                p.step.state,
                p.step.id,
                p.layer,
                p.x,
                p.y,
                p.step.id,
                p.step.name,
                p.step.state,
                BOX_WIDTH,
                BOX_HEIGHT,
                _label(p.step),
            )
            for p in placed
        ),
    )
    return format_html(
        '<svg class="vellum-graph" xmlns="http://www.w3.org/2000/svg" width="{}" height="{}" '
        'viewBox="0 0 {} {}" role="img" aria-label="{}"><title>{}</title>'
        '<defs><marker id="vellum-arrow" viewBox="0 0 8 8" refX="8" refY="4" markerWidth="8" '
        'markerHeight="8" orient="auto"><path d="M0,0 L8,4 L0,8 z"/></marker></defs>{}{}</svg>',
        width,
        height,
        width,
        height,
        title,
        title,
        arrows,
        boxes,
    )


def _label(step: Step) -> str:
    label = f"#{step.id} {step.name}"
    return label if len(label) <= LABEL_CHARS else label[: LABEL_CHARS - 1] + "\u2026"


def _curve(start: Placed, end: Placed) -> str:
    """From the right edge of ``start``'s box to the left edge of ``end``'s.

    To the next layer, one bend across the gap between them. Further, the
    arrow would cross the boxes between: it drops into the gap below the
    lower of the two rows, runs along it, and rises to ``end``, each turn
    inside a gap between columns.
    """
    x1, y1 = start.x + BOX_WIDTH, start.y + BOX_HEIGHT / 2
    x2, y2 = end.x, end.y + BOX_HEIGHT / 2
    if end.layer - start.layer <= 1:
        bend = (x2 - x1) / 2
        return f"M{x1},{y1:g} C{x1 + bend:g},{y1:g} {x2 - bend:g},{y2:g} {x2},{y2:g}"
    lane = max(start.y, end.y) + BOX_HEIGHT + (ROW - BOX_HEIGHT) / 2
    turn = (COLUMN - BOX_WIDTH) / 4
    return (
        f"M{x1},{y1:g} C{x1 + turn:g},{y1:g} {x1 + turn:g},{lane:g} {x1 + 2 * turn:g},{lane:g} "
        f"L{x2 - 2 * turn:g},{lane:g} C{x2 - turn:g},{lane:g} {x2 - turn:g},{y2:g} {x2},{y2:g}"
    )
