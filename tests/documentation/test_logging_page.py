"""The logging page lists every event the ``vellum_jobs`` logger emits, at its level, and no other.

The events are read from the code with ``ast``: each call of a logger method
(``logger.warning(...)``), of a level chosen on the spot (``log = logger.info
if ... else logger.warning``), and of ``transient_errors.log_failure``, whose
message gains `` error=%r``. A message and a row of the page are compared with
their placeholders blanked (``%s``, ``%.1fs`` in the code; ``{job}`` on the
page), so the page shows the whole line with its fields.
"""

from __future__ import annotations

import ast
import dataclasses
import io
import json
import logging
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "vellum_jobs"
PAGE = ROOT / "docs" / "reference" / "logging.md"

LEVELS = {"debug": "DEBUG", "info": "INFO", "warning": "WARNING", "error": "ERROR", "exception": "ERROR"}
PERCENT = re.compile(r"%[-#0 +]*\d*(?:\.\d+)?[sdrgfi]")
BRACES = re.compile(r"\{[^}]*\}")
ROW = re.compile(r"^\|\s*(?P<level>[A-Z, or]+?)\s*\|\s*`(?P<message>[^`]+)`\s*\|", re.M)


@dataclasses.dataclass(frozen=True)
class Event:
    message: str
    levels: frozenset[str]
    where: str

    @property
    def shape(self) -> str:
        return PERCENT.sub("{}", self.message)


def _text(node: ast.expr) -> str | None:
    """A message written as one string constant (implicitly joined pieces included)."""
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _chosen_levels(function: ast.AST, name: str) -> frozenset[str]:
    """The levels ``name = logger.info if ... else logger.warning`` chooses between."""
    for node in ast.walk(function):
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in node.targets
        ):
            return frozenset(
                LEVELS[a.attr]
                for a in ast.walk(node.value)
                if isinstance(a, ast.Attribute) and a.attr in LEVELS
            )
    return frozenset()


def events() -> list[Event]:
    """Every event the package's code logs, once each (a nested function is walked twice)."""
    found: dict[str, Event] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for function in ast.walk(tree):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for call in ast.walk(function):
                if not isinstance(call, ast.Call) or not call.args:
                    continue
                message, where = _text(call.args[0]), f"{path.relative_to(ROOT)}:{call.lineno}"
                func = call.func
                if isinstance(func, ast.Attribute) and func.attr == "log_failure":
                    assert message is not None, f"{where}: log_failure's message must be a constant"
                    found[where] = Event(message + " error=%r", frozenset({"WARNING", "ERROR"}), where)
                elif isinstance(func, ast.Attribute) and func.attr in LEVELS:
                    if not (isinstance(func.value, ast.Name) and func.value.id == "logger"):
                        continue
                    if message is None:  # a message built at run time: transient_errors.log_failure's own
                        continue
                    found[where] = Event(message, frozenset({LEVELS[func.attr]}), where)
                elif isinstance(func, ast.Name) and func.id == "log" and message is not None:
                    levels = _chosen_levels(function, "log")
                    assert levels, f"{where}: which levels does log() stand for?"
                    found[where] = Event(message, levels, where)
    return list(found.values())


def page_rows() -> dict[str, str]:
    """The page's events: the message with its placeholders blanked, and the level column."""
    return {BRACES.sub("{}", m["message"]): m["level"] for m in ROW.finditer(PAGE.read_text())}


def test_the_code_logs_events_and_the_reader_finds_them():
    # Guards the reader of the code: a call it misses would slip through the test below.
    found = events()
    assert len(found) > 60
    assert any(e.shape.startswith("{} job_id={} name={} outcome={}") for e in found)
    assert any(e.levels == {"INFO", "WARNING"} for e in found)
    assert any(e.message.startswith("heartbeat failed") for e in found)


def test_every_event_the_logger_emits_is_on_the_logging_page_at_its_level():
    rows = page_rows()
    missing = [f"{e.where}: {e.message}" for e in events() if e.shape not in rows]
    assert not missing, "not on docs/reference/logging.md:\n" + "\n".join(missing)
    wrong = [
        f"{e.where}: {e.message} is {sorted(e.levels)}, the page says {rows[e.shape]}"
        for e in events()
        if not all(level in rows[e.shape] for level in e.levels)
    ]
    assert not wrong, "\n".join(wrong)


def test_the_logging_page_lists_no_event_the_code_does_not_emit():
    emitted = {e.shape for e in events()}
    stale = [shape for shape in page_rows() if shape not in emitted]
    assert not stale, stale


def test_the_json_formatter_on_the_page_gives_the_message_and_its_fields():
    text = PAGE.read_text()
    (source,) = re.findall(r"```python\n([^`]*class JSONFormatter.*?)```", text, re.S)
    namespace: dict[str, object] = {}
    exec(compile(source, str(PAGE), "exec"), namespace)
    formatter = namespace["JSONFormatter"]
    assert isinstance(formatter, type) and issubclass(formatter, logging.Formatter)
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter())
    logger = logging.getLogger("vellum_jobs.test_logging_page")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning(
            "%s #%s timed out after %gs; its handler is asked to stop job_id=%s name=%s timeout=%gs",
            "mail.send",
            38,
            30.0,
            38,
            "mail.send",
            30.0,
        )
    finally:
        logger.removeHandler(handler)
    line = json.loads(stream.getvalue())
    assert line["message"].startswith("mail.send #38 timed out after 30s; its handler is asked to stop")
    assert line["level"] == "WARNING" and line["logger"] == "vellum_jobs.test_logging_page"
    assert (line["job_id"], line["name"], line["timeout"]) == (38, "mail.send", 30.0)
