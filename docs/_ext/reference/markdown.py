"""Markdown from plain text, the target names of the reference's sections, and comments read from source."""

from __future__ import annotations

import re
from collections.abc import Sequence

_SPECIAL = re.compile(r"([\\`*_\[\]<>|{}$~])")


def escape(text: str) -> str:
    """``text`` as Markdown that shows it as written."""
    return _SPECIAL.sub(r"\\\1", text)


def code(text: str) -> str:
    """An inline code span of ``text``, whatever backticks it holds."""
    ticks = "`" * (max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


def from_rst(text: str) -> str:
    """A docstring's reStructuredText literals (````x````) as Markdown code spans."""
    return re.sub(r"``(.+?)``", r"`\1`", text)


def prose(text: str) -> str:
    """Markdown of a help text: escaped, with the options it names (``--grace``) as code."""
    return re.sub(r"(?<![\w-])(--?[a-z][\w-]*)", lambda m: code(m[1].replace("\\", "")), escape(text))


def cell(text: str) -> str:
    """Markdown for one table cell: on one line, its pipes escaped."""
    return " ".join(text.split()).replace("|", "\\|")


def table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(value) for value in row) + " |" for row in rows]
    return "\n".join(lines)


def check_label(check_id: str) -> str:
    """The target name of a check's section: ``check-e004`` for ``vellum_jobs.E004``."""
    return "check-" + check_id.rsplit(".", 1)[-1].lower()


def setting_label(*keys: str) -> str:
    """The target name of a setting's section: ``setting-health-public`` for ``HEALTH["PUBLIC"]``."""
    return "setting-" + "-".join(key.lower().replace("_", "-") for key in keys)


def comments_above(source: str) -> dict[str, str]:
    """The ``#`` comment lines right above each ``name = ...`` line of ``source``, by name."""
    found: dict[str, str] = {}
    pending: list[str] = []
    for line in source.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            pending.append(stripped.lstrip("#").strip())
            continue
        match = re.match(r"(\w+)\s*(:[^=]+)?=", stripped)
        if match and pending:
            found[match[1]] = " ".join(pending)
        pending = []
    return found
