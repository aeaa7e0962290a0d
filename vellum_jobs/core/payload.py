"""JSON checks for job arguments and results, and the size limit on them and on errors.

Arguments are normalised the way Django's Tasks framework does it (tuples
become lists, non-string keys become strings) and anything JSON cannot hold
is refused with a ``TypeError`` that names where the bad value sits: a
value that holds itself, and lists and dicts nested past ``MAX_DEPTH`` in
their column (MariaDB's limit; a depth the recursion limit never reaches),
are refused on every database alike.

``MAX_PAYLOAD_BYTES`` bounds what one job writes to its row: arguments over
it are refused at enqueue, a result over it is not stored, an error over it
keeps its start and its end. Sizes are measured as compact JSON in UTF-8,
which costs one more encoding of each value (of a whole ``enqueue_many`` at
once when it fits); the database's own form differs by a few bytes (spaces,
escapes, jsonb's binary form).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from vellum_jobs.conf import conf

_SCALARS = (str, int, bool, type(None))
# Lists and dicts one inside another in a JSON column: MariaDB refuses a 32nd.
MAX_DEPTH = 31


def normalise(value: Any, path: str, *, enclosed: int = 0) -> Any:
    """Return ``value`` as JSON will store it, or raise ``TypeError`` naming ``path``.

    ``enclosed`` counts the lists and dicts around ``value`` in its column
    (one for an argument: the list of arguments or the dict of keywords).
    """
    return _normalise(value, path, (), MAX_DEPTH - enclosed)


def _normalise(value: Any, path: str, within: tuple[int, ...], room: int) -> Any:
    """``normalise``; ``within`` holds the ids of the containers ``value`` sits in, ``room``
    how many more levels its column takes."""
    if isinstance(value, str):
        return _text(value, path)
    if isinstance(value, _SCALARS):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise TypeError(f"{path} is {value!r}, which JSON cannot store")
        return value
    if isinstance(value, (Mapping, list, tuple)):
        within = _enter(value, path, within, room)
        if isinstance(value, Mapping):
            return {
                _key(k, path): _normalise(v, f"{path}[{k!r}]", within, room - 1) for k, v in value.items()
            }
        return [_normalise(v, f"{path}[{i}]", within, room - 1) for i, v in enumerate(value)]
    raise TypeError(
        f"{path} is a {type(value).__module__}.{type(value).__qualname__}, "
        "which is not JSON serializable: pass str, int, float, bool, None, list or dict "
        "(e.g. an id instead of a model instance, an ISO string instead of a datetime)"
    )


def _enter(container: Any, path: str, within: tuple[int, ...], room: int) -> tuple[int, ...]:
    """``within`` and ``container``, if JSON can hold it there."""
    # Checked before the depth: a loop would otherwise read as a deep value.
    if id(container) in within:
        raise TypeError(f"{path} holds itself (a circular reference), which JSON cannot store")
    if room <= 0:
        raise TypeError(
            f"{path} is nested more than {MAX_DEPTH} levels deep, counting the lists and dicts "
            "around it in its JSON column: MariaDB cannot store that"
        )
    return (*within, id(container))


def _text(value: str, path: str) -> str:
    """A string every database's JSON column stores: PostgreSQL's jsonb refuses the NUL
    character, and none takes a lone surrogate (half of a UTF-16 pair)."""
    if "\x00" in value:
        raise TypeError(f"{path} contains a NUL character, which PostgreSQL cannot store in JSON")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise TypeError(f"{path} contains a lone surrogate, which is not valid UTF-8") from None
    return value


def _key(key: Any, path: str) -> str:
    if isinstance(key, str):
        return _text(key, path)
    if isinstance(key, (int, float, bool, type(None))):
        return str(json.dumps(key))
    raise TypeError(f"{path} has a key {key!r} of type {type(key).__qualname__}, which JSON cannot store")


def normalise_call(
    name: str, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> tuple[list[Any], dict[str, Any]]:
    """Normalise the positional and keyword arguments of a call to job ``name``."""
    prefix = f"argument of job {name!r}:"
    try:
        norm_args = [normalise(v, f"args[{i}]", enclosed=1) for i, v in enumerate(args)]
        norm_kwargs = {k: normalise(v, k, enclosed=1) for k, v in kwargs.items()}
    except TypeError as exc:
        raise TypeError(f"{prefix} {exc}") from None
    return norm_args, norm_kwargs


# One encoder for every size: json.dumps() with options builds a new one per call.
_COMPACT = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


def json_size(value: Any) -> int:
    """Bytes of a normalised ``value`` as compact JSON in UTF-8."""
    text = _COMPACT.encode(value)
    if text.isascii():
        return len(text)
    # A lone surrogate counts as the three bytes it would take, not as an error.
    return len(text.encode("utf-8", "surrogatepass"))


def check_sizes(name: str, calls: Sequence[tuple[list[Any], dict[str, Any]]]) -> None:
    """Raise ``ValueError`` naming the call if the arguments of one are over ``MAX_PAYLOAD_BYTES``."""
    limit = conf.max_payload_bytes
    # Calls whose JSON together fits fit one by one: one encoding for the usual enqueue_many.
    if len(calls) > 1 and json_size(calls) <= limit:
        return
    for i, (args, kwargs) in enumerate(calls):
        size = json_size(args) + json_size(kwargs)
        if size > limit:
            which = f" (call {i} of {len(calls)})" if len(calls) > 1 else ""
            raise ValueError(
                f"arguments of job {name!r}{which} are {size:,} bytes as JSON, over the limit of "
                f"{limit:,} bytes (VELLUM_JOBS['MAX_PAYLOAD_BYTES']): store the data elsewhere "
                "and pass its id or path"
            )


def encode_call(name: str, args: list[Any], kwargs: dict[str, Any]) -> tuple[str, str]:
    """The JSON text a JSON column stores for one call's normalised arguments (``json.dumps``, as
    Django's ``JSONField`` writes it); ``ValueError`` as ``check_sizes`` if they are over the limit.

    That text escapes every non-ASCII character and spaces its separators, so
    it is never shorter than the compact UTF-8 the limit counts: only a call
    whose text is over the limit needs measuring.
    """
    args_text, kwargs_text = json.dumps(args), json.dumps(kwargs)
    if len(args_text) + len(kwargs_text) > conf.max_payload_bytes:
        check_sizes(name, [(args, kwargs)])
    return args_text, kwargs_text


def encode_result(value: Any) -> tuple[Any, str]:
    """The JSON form of a handler's return value and "", or None and why it cannot be stored."""
    if value is None:
        return None, ""
    try:
        result = normalise(value, "the return value")
    except TypeError as exc:
        return None, f"result not stored: {exc}"
    size, limit = json_size(result), conf.max_payload_bytes
    if size > limit:
        return None, (
            f"result not stored: the return value is {size:,} bytes as JSON, over the limit of "
            f"{limit:,} bytes (VELLUM_JOBS['MAX_PAYLOAD_BYTES'])"
        )
    return result, ""


CUT = "\n[... {:,} characters cut ...]\n"


def bounded_error(text: str) -> str:
    """``text``, or if it is over ``MAX_PAYLOAD_BYTES`` its start and its end around a note of what was cut.

    The end keeps three quarters of the room: a traceback ends with the
    innermost frames and the exception, the part that says what went wrong.
    A limit smaller than the note leaves the note alone.
    """
    limit = conf.max_payload_bytes
    # A lone surrogate (no database stores one) counts, and is kept, as "?".
    data = text.encode("utf-8", "replace")
    if len(data) <= limit:
        return text
    # The note's own size, with the most characters it could name.
    room = max(0, limit - len(CUT.format(len(text)).encode("utf-8")))
    tail_bytes = room - room // 4
    # A cut inside a character drops that character's bytes.
    head = data[: room // 4].decode("utf-8", "ignore")
    tail = data[len(data) - tail_bytes :].decode("utf-8", "ignore") if tail_bytes else ""
    return f"{head}{CUT.format(len(text) - len(head) - len(tail))}{tail}"
