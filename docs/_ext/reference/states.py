"""The states page: each state's meaning from its comment in ``transitions.State``, and every transition."""

from __future__ import annotations

import inspect

from docs._ext.reference import complete
from docs._ext.reference.markdown import code, comments_above, from_rst, table
from vellum_jobs.core import transitions


def states_markdown() -> str:
    """The states and their meaning, a text diagram of every transition, and the transitions' table."""
    comments = comments_above(inspect.getsource(transitions.State))
    complete("the states' comments in transitions.State", comments, transitions.State.names)
    rows = [(code(state.value), from_rst(comments[state.name])) for state in transitions.State]
    states = table(("state", "what it means"), rows)
    return "\n\n".join([states, f"```text\n{diagram()}\n```", transitions.table()])


def diagram() -> str:
    """Every transition as an arrow from the state it leaves; ``[*]`` is outside the table."""
    edges: list[tuple[str, str, str]] = [
        ("[*]", "enqueued", "queued"),
        ("[*]", "enqueued after others", "waiting"),
    ]
    for t in transitions.TRANSITIONS:
        label = t.name + (" (fenced)" if t.fenced else "")
        edges += [(source, label, " | ".join(t.targets) or "[*]") for source in t.sources]
    order = ["[*]", *transitions.State.values]
    edges.sort(key=lambda edge: order.index(edge[0]))
    source_width = max(len(source) for source, _, _ in edges)
    label_width = max(len(label) for _, label, _ in edges)
    lines, previous = [], None
    for source, label, target in edges:
        shown = source if source != previous else ""
        lines.append(f"{shown:<{source_width}}  ── {label} {'─' * (label_width - len(label))}─▶ {target}")
        previous = source
    return "\n".join(lines)
