"""A workflow's graph: layers by longest path, rows by the upstream jobs' places, and the SVG drawn
from them (boxes coloured by state and linked, arrows for dependencies, names escaped)."""

from __future__ import annotations

import re

from vellum_jobs.admin import workflow_graph
from vellum_jobs.observe.workflows import Edge, Step


def steps(*ids: int, state: str = "done") -> list[Step]:
    return [Step(pk, f"job.{pk}", state) for pk in ids]


def edges(*pairs: tuple[int, int]) -> list[Edge]:
    return [Edge(upstream, job, "") for upstream, job in pairs]


def test_a_job_s_layer_is_the_longest_path_to_it_from_a_job_that_waits_for_none():
    # 1 -> 2 -> 3 -> 4, and 1 -> 4 straight: 4 goes past 3, not beside 2.
    found = workflow_graph.layers(steps(1, 2, 3, 4, 5), edges((1, 2), (2, 3), (3, 4), (1, 4)))
    assert found == {1: 0, 2: 1, 3: 2, 4: 3, 5: 0}


def test_a_fan_out_and_gather_is_three_layers():
    found = workflow_graph.layers(steps(1, 2, 3, 4, 5), edges((1, 2), (1, 3), (1, 4), (2, 5), (3, 5), (4, 5)))
    assert found == {1: 0, 2: 1, 3: 1, 4: 1, 5: 2}


def test_edges_to_jobs_not_drawn_are_ignored_and_a_cycle_goes_past_the_rest():
    assert workflow_graph.layers(steps(1, 2), edges((99, 2), (1, 2))) == {1: 0, 2: 1}
    assert workflow_graph.layers(steps(1, 2, 3), edges((2, 3), (3, 2))) == {1: 0, 2: 1, 3: 1}


def test_within_a_layer_jobs_follow_their_upstream_jobs_places():
    # Two chains, enqueued interleaved: 1 -> 4 and 2 -> 3; 3 sits across from 2, 4 from 1.
    placed = workflow_graph.place(steps(1, 2, 3, 4), edges((1, 4), (2, 3)))
    assert [(p.step.id, p.layer, p.row) for p in placed] == [(1, 0, 0), (2, 0, 1), (4, 1, 0), (3, 1, 1)]


def test_the_svg_has_a_linked_box_per_job_coloured_by_state_and_an_arrow_per_edge():
    drawn = [Step(1, "fetch", "done"), Step(2, "parse", "running"), Step(3, "save", "waiting")]
    urls = {pk: f"/admin/vellum_jobs/job/{pk}/change/" for pk in (1, 2, 3)}
    svg = str(workflow_graph.svg(drawn, edges((1, 2), (2, 3)), urls, "workflow #7"))
    assert svg.startswith('<svg class="vellum-graph"') and svg.endswith("</svg>")
    assert "<script" not in svg
    boxes = re.findall(
        r'<a class="vellum-node-link" href="([^"]+)">'
        r'<g class="vellum-node vellum-node-(\w+)" data-job="(\d+)"',
        svg,
    )
    assert boxes == [(urls[1], "done", "1"), (urls[2], "running", "2"), (urls[3], "waiting", "3")]
    assert re.findall(r'data-from="(\d+)" data-to="(\d+)"', svg) == [("1", "2"), ("2", "3")]
    assert ">#1 fetch</text>" in svg and "<title>#3 save: waiting</title>" in svg
    # Left to right, one column per layer.
    assert re.findall(r'data-layer="(\d)" transform="translate\((\d+) 8\)"', svg) == [
        ("0", "8"),
        ("1", "238"),
        ("2", "468"),
    ]


def test_names_are_escaped_and_long_labels_cut_whole_in_the_tooltip():
    name = "<script>alert(1)</script>.and.a.very.long.name"
    svg = str(workflow_graph.svg([Step(1, name, "failed")], [], {1: "/j/1/"}, "w"))
    assert "<script>" not in svg
    assert "&lt;script&gt;alert(1)&lt;/script&gt;.and.a.very.long.name: failed</title>" in svg
    label = re.search(r"<text[^>]*>([^<]*)</text>", svg)
    assert label is not None and label[1].endswith("\u2026") and len(label[1]) < 40


def test_nothing_to_draw_is_an_empty_string():
    assert str(workflow_graph.svg([], [], {}, "w")) == ""
