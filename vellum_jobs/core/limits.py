"""The limits a job is started under: its rate limits and the keys of ``concurrency={...}``.

Declared on ``@job`` or ``using()``, each with a key that may depend on the
job's arguments (``"customer:{customer_id}"``, or a function of them), and
resolved per job at enqueue into ``Limits``, which the job row keeps as
compact JSON (``Job.limits``). A worker's thread checks them just before it
starts the job (``vellum_jobs.store.limit_gate``). Nothing here touches the
database, so options can be checked while a ``jobs.py`` module is imported.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import re
import string
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from vellum_jobs.conf import parse_duration

MAX_KEY_LENGTH = 255

# A key: a string, formatted with the job's arguments by name ("customer:{customer_id}"),
# or a function of (some of) the job's arguments that returns one.
KeyTemplate = str | Callable[..., str]

# "100/m": a count per unit, or per a number of units ("10/5s").
_RATE = re.compile(r"^\s*(\d+)\s*/\s*(\d*(?:\.\d+)?)\s*(s|sec|second|m|min|minute|h|hour|d|day)s?\s*$")
_UNITS = {"s": 1, "sec": 1, "second": 1, "m": 60, "min": 60, "minute": 60, "h": 3600, "hour": 3600}
_UNITS.update(d=86400, day=86400)

# How long after its period a rate slot is kept from the next start: the
# lapse between a slot's start and the handler's first line (a thread
# switch, a commit), so that no window of ``period`` by the handlers' own
# clocks sees more than N starts. A twentieth of the period, at most this.
MAX_GUARD = 0.25


def guard(period: float) -> float:
    """The seconds a rate slot of ``period`` rests after its period (``MAX_GUARD``)."""
    return min(period / 20, MAX_GUARD)


@dataclasses.dataclass(frozen=True)
class Rate:
    """At most ``count`` starts per ``period`` seconds per key."""

    count: int
    period: float
    key: KeyTemplate

    def describe(self) -> str:
        return f"{self.count} per {period_text(self.period)}"


@dataclasses.dataclass(frozen=True)
class Concurrency:
    """At most ``count`` jobs of a key running at once."""

    key: KeyTemplate
    count: int


def rates(value: object) -> tuple[Rate, ...]:
    """``rate=`` as ``Rate``s: one ``(spec, key)`` pair or a list of them; ``ValueError`` naming a bad one.

    A spec is "100/m" (also /s, /h, /d, and "10/5s"), or ``(count, period)``
    with the period in seconds, a timedelta or a duration like "90s".
    """
    if value is None:
        return ()
    pairs = [value] if _is_pair(value) else value
    if not isinstance(pairs, (list, tuple)) or not pairs:
        raise ValueError(
            f'rate must be a (rate, key) pair like ("100/m", "customer:{{id}}") or a list of them, '
            f"got {value!r}"
        )
    return tuple(_rate(pair) for pair in pairs)


def _is_pair(value: object) -> bool:
    return isinstance(value, tuple) and len(value) == 2 and not isinstance(value[0], tuple)


def _rate(pair: object) -> Rate:
    if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
        raise ValueError(f'rate: {pair!r} is not a (rate, key) pair like ("100/m", "customer:{{id}}")')
    spec, key = pair
    count, period = parse_rate(spec)
    return Rate(count, period, _key("rate", key))


def parse_rate(spec: object) -> tuple[int, float]:
    """(count, period in seconds) of "100/m", "10/5s" or ``(count, period)``."""
    if isinstance(spec, str):
        match = _RATE.match(spec)
        if match is None:
            raise ValueError(
                f"rate {spec!r}: write it as a count per period, like '100/m', '5/s' or '10/30s'"
            )
        count, times, unit = int(match[1]), float(match[2] or 1), _UNITS[match[3]]
        period = times * unit
    elif isinstance(spec, (tuple, list)) and len(spec) == 2:
        count = spec[0]
        try:
            period = parse_duration(spec[1])
        except ValueError as exc:
            raise ValueError(f"rate {spec!r}: the period: {exc}") from None
    else:
        raise ValueError(f"rate {spec!r}: write it as '100/m' or as (count, period)")
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise ValueError(f"rate {spec!r}: the count must be an integer >= 1")
    if not period > 0:
        raise ValueError(f"rate {spec!r}: the period must be longer than zero")
    return count, period


def concurrency(value: Mapping[object, object]) -> tuple[Concurrency, ...]:
    """``concurrency={key: limit, ...}`` as ``Concurrency``s; ``ValueError`` naming a bad entry."""
    if not value:
        raise ValueError("concurrency: an empty dict limits nothing; pass {key: limit, ...}")
    limits = []
    for key, count in value.items():
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise ValueError(f"concurrency: the limit of {key!r} must be an integer >= 1, got {count!r}")
        limits.append(Concurrency(_key("concurrency", key), count))
    return tuple(limits)


def fair_key(value: object) -> KeyTemplate:
    return _key("fair_key", value)


def _key(option: str, key: object) -> KeyTemplate:
    if callable(key):
        return key
    if not isinstance(key, str) or not key:
        raise ValueError(
            f"{option}: a key must be a non-empty string or a function of the job's arguments, got {key!r}"
        )
    try:
        list(string.Formatter().parse(key))
    except ValueError as exc:
        raise ValueError(f"{option}: key {key!r} is not a valid template: {exc}") from None
    return key


@dataclasses.dataclass(frozen=True)
class Limits:
    """One job's limits, keys resolved: ``rates`` as (key, count, period), ``concurrency`` as (key, count)."""

    rates: tuple[tuple[str, int, float], ...] = ()
    concurrency: tuple[tuple[str, int], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.rates or self.concurrency)

    def keys(self) -> list[str]:
        """Every key the job starts under, in order, once each."""
        return list(dict.fromkeys([key for key, _, _ in self.rates] + [key for key, _ in self.concurrency]))

    def encode(self) -> str:
        """The ``Job.limits`` text; "" for none."""
        if not self:
            return ""
        data: dict[str, Any] = {}
        if self.rates:
            data["rate"] = [list(rate) for rate in self.rates]
        if self.concurrency:
            data["concurrency"] = [list(entry) for entry in self.concurrency]
        return json.dumps(data, separators=(",", ":"))

    @classmethod
    def decode(cls, text: str) -> Limits:
        if not text:
            return cls()
        data = json.loads(text)
        return cls(
            rates=tuple((str(k), int(n), float(p)) for k, n, p in data.get("rate", ())),
            concurrency=tuple((str(k), int(n)) for k, n in data.get("concurrency", ())),
        )

    def describe(self) -> list[str]:
        """Each limit in words, for explain() and the admin."""
        texts = [f"rate {key!r}: {n} per {period_text(p)}" for key, n, p in self.rates]
        texts += [f"concurrency {key!r}: {n} at once" for key, n in self.concurrency]
        return texts


def resolve(
    name: str,
    signature: inspect.Signature,
    args: Iterable[Any],
    kwargs: Mapping[str, Any],
    rate_limits: tuple[Rate, ...],
    concurrency_limits: tuple[Concurrency, ...],
    rate_key: str | None = None,
) -> Limits:
    """The limits of job ``name`` called with these arguments; ``ValueError`` for a key that cannot be made.

    ``rate_key`` (``using(rate_key=...)``) stands for the key of every rate limit.
    """
    if not (rate_limits or concurrency_limits):
        return Limits()
    arguments = _arguments(signature, args, kwargs)
    rates_ = tuple(
        (rate_key if rate_key is not None else render(name, "rate", r.key, arguments), r.count, r.period)
        for r in rate_limits
    )
    concurrency_ = tuple((render(name, "concurrency", c.key, arguments), c.count) for c in concurrency_limits)
    return Limits(rates_, concurrency_)


def _arguments(
    signature: inspect.Signature, args: Iterable[Any], kwargs: Mapping[str, Any]
) -> dict[str, Any]:
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    return dict(bound.arguments)


def render_key(name: str, option: str, key: KeyTemplate, signature: inspect.Signature,
               args: Iterable[Any], kwargs: Mapping[str, Any]) -> str:  # fmt: skip
    """One key for a job called with these arguments (a fair key)."""
    return render(name, option, key, _arguments(signature, args, kwargs))


def render(name: str, option: str, key: KeyTemplate, arguments: Mapping[str, Any]) -> str:
    """``key`` for these arguments: a template formatted with them, or a function's return value."""
    if callable(key):
        value = key(**_accepted(key, arguments))
    else:
        try:
            value = key.format_map(arguments)
        except (KeyError, IndexError, AttributeError) as exc:
            raise ValueError(f"{option} key {key!r} of job {name!r}: the job has no argument {exc}") from None
    if not isinstance(value, str) or not value or len(value) > MAX_KEY_LENGTH:
        raise ValueError(
            f"{option} key of job {name!r} must come out a non-empty string of up to "
            f"{MAX_KEY_LENGTH} characters, got {value!r}"
        )
    return value


def _accepted(func: Callable[..., Any], arguments: Mapping[str, Any]) -> dict[str, Any]:
    parameters = inspect.signature(func).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return dict(arguments)
    return {name: value for name, value in arguments.items() if name in parameters}


def period_text(seconds: float) -> str:
    """A period in words: "minute", "5m", "30s"."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            count = int(seconds // size)
            return f"{count}{unit}" if count != 1 else {"d": "day", "h": "hour", "m": "minute"}[unit]
    return "second" if seconds == 1 else f"{seconds:g}s"
