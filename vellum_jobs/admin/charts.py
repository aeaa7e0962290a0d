"""The dashboard's charts, drawn on the server as inline SVG: no script, no CDN, readable offline.

``bars`` stacks each step's outcome counts; ``line`` draws one figure per
step, with gaps where a step has none; ``spark`` is a small stack of bars
without axes, for a table row. The two charts scale to a round number
above their largest value and draw a few gridlines with their values, 0
included, and the clock times of round steps along the bottom; every bar
has a ``<title>`` that a browser shows on hover.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime, timedelta

from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from vellum_jobs.store.rollup import Bucket

# The drawing's units, about the pixels of a chart's box on a laptop: the SVG scales to its box,
# and its text with it.
WIDTH, HEIGHT = 480, 150
LEFT, BOTTOM, TOP = 42, 18, 8  # room for the axis labels
PLOT = HEIGHT - BOTTOM - TOP  # the height the values scale to
GRIDLINES = 4  # at most this many above 0

# Outcome colours, the same as the state badges', in stacking order from the bottom.
COLOURS = {
    "done": "#1c7f3b",
    "snoozed": "#7fa7d9",
    "retried": "#d08a00",
    "lost": "#6b46c1",
    "failed": "#ba2121",
    "cancelled": "#8a6100",
}
# Steps between gridlines: counts, and seconds (round minutes and hours past a minute).
COUNT_STEPS = [m * 10**e for e in range(10) for m in (1, 2, 5)]
SECOND_STEPS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400]
# Minutes between the clock times along the bottom; the first that labels at most seven.
CLOCK_STEPS = [1, 2, 5, 10, 15, 30, 60, 120, 180, 240, 360, 720]


def bars(
    buckets: Sequence[Bucket], title: str, ends: tuple[str, str], outcomes: Sequence[str] = tuple(COLOURS)
) -> SafeString:
    """Stacked bars of each step's outcome counts, the outcomes in ``outcomes`` order from the bottom."""
    ticks = scale(max([sum(b.counts.get(o, 0) for o in outcomes) for b in buckets] + [0]), COUNT_STEPS)
    top = ticks[-1]
    step = (WIDTH - LEFT) / max(len(buckets), 1)
    rects = []
    for i, bucket in enumerate(buckets):
        y = float(HEIGHT - BOTTOM)
        for outcome in outcomes:
            n = bucket.counts.get(outcome, 0)
            if not n:
                continue
            height = n / top * PLOT
            y -= height
            rects.append(
                (LEFT + i * step, y, max(step - 1, 0.5), height, COLOURS[outcome], outcome, n, bucket)
            )
    body = format_html_join(
        "",
        '<rect class="vellum-bar" data-outcome="{}" x="{}" y="{}" width="{}" height="{}" '
        'fill="{}"><title>{} {}: {}</title></rect>',
        (
            (outcome, _n(x), _n(y), _n(w), _n(h), colour, _clock(bucket.start), outcome, n)
            for x, y, w, h, colour, outcome, n, bucket in rects
        ),
    )
    grid = _grid([(tick, _number(int(tick))) for tick in ticks], top)
    times = _times(buckets, step)
    return _svg(title, ends, grid + times, body, empty=not rects)


def line(buckets: Sequence[Bucket], title: str, ends: tuple[str, str]) -> SafeString:
    """The oldest due job's age per step, in seconds; a step without a sample breaks the line."""
    ages = [b.oldest_due_age for b in buckets]
    ticks = scale(max([a for a in ages if a is not None] + [0.0]), SECOND_STEPS)
    top = ticks[-1]
    step = (WIDTH - LEFT) / max(len(buckets) - 1, 1)
    runs: list[list[str]] = [[]]
    for i, age in enumerate(ages):
        if age is None:
            runs.append([])
            continue
        runs[-1].append(f"{LEFT + i * step:.1f},{HEIGHT - BOTTOM - age / top * PLOT:.1f}")
    body = format_html_join(
        "",
        '<polyline class="vellum-line" points="{}" fill="none" stroke="#1d62d6" stroke-width="2"/>',
        ((" ".join(points),) for points in runs if points),
    )
    grid = _grid([(tick, _seconds(tick)) for tick in ticks], top)
    return _svg(title, ends, grid + _times(buckets, step), body, empty=not any(runs))


def spark(buckets: Sequence[Bucket], title: str, outcomes: Sequence[str] = tuple(COLOURS)) -> SafeString:
    """A row's small chart: each step's outcomes stacked, scaled to the largest step, no axes."""
    width, height = 120, 24
    top = max([sum(b.counts.get(o, 0) for o in outcomes) for b in buckets] + [1])
    step = width / max(len(buckets), 1)
    rects = []
    for i, bucket in enumerate(buckets):
        y = float(height)
        for outcome in outcomes:
            n = bucket.counts.get(outcome, 0)
            if n:
                h = n / top * height
                y -= h
                rects.append(
                    (outcome, _n(i * step), _n(y), _n(max(step - 0.4, 0.4)), _n(h), COLOURS[outcome])
                )
    body = format_html_join(
        "", '<rect data-outcome="{}" x="{}" y="{}" width="{}" height="{}" fill="{}"/>', rects
    )
    return format_html(
        '<svg class="vellum-spark" viewBox="0 0 {} {}" role="img" aria-label="{}" '
        'xmlns="http://www.w3.org/2000/svg"><title>{}</title>'
        '<line x1="0" y1="{}" x2="{}" y2="{}" stroke="#ccc"/>{}</svg>',
        width, height, title, title, height - 0.5, width, height - 0.5, body,
    )  # fmt: skip


def scale(largest: float, steps: Sequence[float]) -> list[float]:
    """The gridlines' values, 0 first: the smallest step of ``steps`` that covers ``largest`` in at
    most ``GRIDLINES`` lines, up to the first line at or above it."""
    if largest <= 0:
        return [0.0, float(steps[0])]
    step = next((s for s in steps if largest / s <= GRIDLINES), largest / GRIDLINES)
    lines = max(math.ceil(largest / step - 1e-9), 1)
    return [i * float(step) for i in range(lines + 1)]


def _grid(ticks: list[tuple[float, str]], top: float) -> SafeString:
    """A horizontal line and its value at each tick; the baseline darker."""
    return format_html_join(
        "",
        '<line class="vellum-grid" x1="{}" y1="{}" x2="{}" y2="{}" stroke="{}"/>'
        '<text class="vellum-tick" x="{}" y="{}" text-anchor="end">{}</text>',
        (
            (LEFT, _n(y), WIDTH, _n(y), "#999" if not value else "#e4e4e4", LEFT - 4, _n(y + 3.5), label)
            for value, label in ticks
            for y in [HEIGHT - BOTTOM - value / top * PLOT]
        ),
    )


def _times(buckets: Sequence[Bucket], step: float) -> SafeString:
    """The clock times of round steps along the bottom, each under a short tick."""
    if len(buckets) < 2:
        return SafeString("")
    span = (buckets[-1].start - buckets[0].start) / timedelta(minutes=1)
    every = next((m for m in CLOCK_STEPS if span / m <= 7), CLOCK_STEPS[-1])
    width = (buckets[1].start - buckets[0].start) / timedelta(minutes=1)
    marks = []
    for i, bucket in enumerate(buckets):
        # The round time within this step, if any: steps need not start on one (a day's
        # ten-minute steps start at whatever minute it is now).
        local = _local(bucket.start)
        ahead = -(local.hour * 60 + local.minute) % every
        if ahead >= width:
            continue
        x = LEFT + (i + ahead / width) * step
        if x > WIDTH - 14:
            continue
        mark = bucket.start + timedelta(minutes=ahead)
        marks.append((_n(x), HEIGHT - BOTTOM, _n(x), HEIGHT - BOTTOM + 3, _n(x), HEIGHT - 5, _clock(mark)))
    return format_html_join(
        "",
        '<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="#999"/>'
        '<text class="vellum-time" x="{}" y="{}" text-anchor="middle">{}</text>',
        marks,
    )


def _svg(title: str, ends: tuple[str, str], axes: SafeString, body: SafeString, empty: bool) -> SafeString:
    note = format_html(
        '<text x="{}" y="{}" text-anchor="middle">no data yet</text>', (WIDTH + LEFT) / 2, HEIGHT / 2
    )
    return format_html(
        '<svg class="vellum-chart" viewBox="0 0 {} {}" role="img" aria-label="{} ({} to {})" '
        'xmlns="http://www.w3.org/2000/svg"><title>{}</title>{}{}</svg>',
        WIDTH, HEIGHT, title, *ends, title, axes, note if empty else body,
    )  # fmt: skip


def legend(outcomes: Sequence[str] = tuple(COLOURS)) -> SafeString:
    return format_html_join(
        "",
        '<span class="vellum-legend"><span style="background:{}"></span>{}</span>',
        ((COLOURS[o], o) for o in outcomes),
    )


def _local(moment: datetime) -> datetime:
    # With USE_TZ = False the rollup's minutes are naive, in local time already.
    return timezone.localtime(moment) if timezone.is_aware(moment) else moment


def _clock(moment: datetime) -> str:
    return _local(moment).strftime("%H:%M")


def _n(value: float) -> str:
    """A coordinate, to a tenth of a unit."""
    return f"{value:.1f}"


def _number(n: int) -> str:
    return f"{n:,}"


def _seconds(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds / 60:g}m"
    return f"{seconds / 3600:g}h"
