"""The limit keys' figures as the metrics label them: a bounded number of ``key`` labels.

Keys are often made from the arguments (``customer:{customer_id}``), so a
label per key would grow with the customers. The ``LIMIT_KEYS_SHOWN`` keys
with the most jobs waiting (held ones first among equals, then the busiest)
have a label of their own; the rest are added up under ``key="(other)"``
(in brackets, to tell it from a key named "other"). A scrape so has at
most ``LIMIT_KEYS_SHOWN + 1`` key labels per metric, and two kinds; which
keys have their own label may change from one scrape to the next, as
their backlogs do.

A key with two rate limits (10 per second and 500 per hour) reports, as
kind ``rate``, the use of the one nearer its limit.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

from vellum_jobs.observe import limits

# Keys with a label of their own, and the label of the rest.
LIMIT_KEYS_SHOWN = 50
OTHER = "(other)"


@dataclasses.dataclass(frozen=True)
class LimitFigures:
    in_use: dict[tuple[str, str], int]  # by (key label, kind): rate starts in the period, or running
    waiting: dict[tuple[str, str], int]  # by (key label, kind): queued jobs under it
    held: dict[str, int]  # by key label: keys held now (0 or 1 for a key of its own)
    keys: int  # keys in use, labelled or not
    complete: bool = True  # False: the waiting counts are lower bounds

    @classmethod
    def none(cls) -> LimitFigures:
        return cls({}, {}, {}, 0)


def figures(overview: limits.Overview) -> LimitFigures:
    """The figures of ``overview``'s keys by label."""
    ranked = sorted(overview.keys, key=lambda k: (-k.waiting, k.hold is None, -_busy(k), k.key))
    own = {key.key for key in ranked[:LIMIT_KEYS_SHOWN]}
    in_use: Counter[tuple[str, str]] = Counter()
    waiting: Counter[tuple[str, str]] = Counter()
    held: Counter[str] = Counter()
    for key in overview.keys:
        label = key.key if key.key in own else OTHER
        for kind, limit in _by_kind(key).items():
            in_use[label, kind] += limit.in_use
            waiting[label, kind] += max(other.waiting for other in key.limits if other.kind == kind)
        held[label] += key.hold is not None
    return LimitFigures(dict(in_use), dict(waiting), dict(held), len(overview.keys), overview.complete)


def _by_kind(key: limits.KeyView) -> dict[str, limits.KeyLimit]:
    """The key's limit of each kind; of two rates, the one nearer its limit."""
    chosen: dict[str, limits.KeyLimit] = {}
    for limit in key.limits:
        if limit.kind not in chosen or _fill(limit) > _fill(chosen[limit.kind]):
            chosen[limit.kind] = limit
    return chosen


def _fill(limit: limits.KeyLimit) -> float:
    return limit.in_use / limit.count if limit.count else 0.0


def _busy(key: limits.KeyView) -> int:
    return sum(limit.in_use for limit in key.limits)
