"""JSON checks for job arguments and results.

Arguments are normalised the way Django's Tasks framework does it (tuples
become lists, non-string keys become strings) and anything JSON cannot hold
is refused with a ``TypeError`` that names where the bad value sits.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

_SCALARS = (str, int, bool, type(None))


def normalise(value: Any, path: str) -> Any:
    """Return ``value`` as JSON will store it, or raise ``TypeError`` naming ``path``."""
    if isinstance(value, _SCALARS):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise TypeError(f"{path} is {value!r}, which JSON cannot store")
        return value
    if isinstance(value, Mapping):
        return {_key(k, path): normalise(v, f"{path}[{k!r}]") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [normalise(v, f"{path}[{i}]") for i, v in enumerate(value)]
    raise TypeError(
        f"{path} is a {type(value).__module__}.{type(value).__qualname__}, "
        "which is not JSON: pass str, int, float, bool, None, list or dict "
        "(e.g. an id instead of a model instance, an ISO string instead of a datetime)"
    )


def _key(key: Any, path: str) -> str:
    if isinstance(key, str):
        return key
    if isinstance(key, (int, float, bool, type(None))):
        return str(json.dumps(key))
    raise TypeError(f"{path} has a key {key!r} of type {type(key).__qualname__}, which JSON cannot store")


def normalise_call(
    name: str, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> tuple[list[Any], dict[str, Any]]:
    """Normalise the positional and keyword arguments of a call to job ``name``."""
    prefix = f"argument of job {name!r}:"
    try:
        norm_args = [normalise(v, f"args[{i}]") for i, v in enumerate(args)]
        norm_kwargs = {k: normalise(v, k) for k, v in kwargs.items()}
    except TypeError as exc:
        raise TypeError(f"{prefix} {exc}") from None
    return norm_args, norm_kwargs


def encode_result(value: Any) -> tuple[Any, str]:
    """The JSON form of a handler's return value and "", or None and why it cannot be stored."""
    try:
        return normalise(value, "the return value"), ""
    except TypeError as exc:
        return None, f"result not stored: {exc}"
