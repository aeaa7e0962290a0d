"""The checks page: every system check id the package can report, with its messages and hints.

The ids and messages are read from the package's source: a call of
``checks.Error``/``Warning`` with an ``id``, or of ``checks.py``'s
``_error(n, msg, hint)``. A message shows its literal text, with ``…`` for
each part computed when it is reported.
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Mapping

from docs._ext.reference import PACKAGE, complete
from docs._ext.reference.markdown import check_label, code, escape, setting_label
from docs._ext.reference.settings import SETTINGS

CHECKS: dict[str, str] = {
    "vellum_jobs.E001": "`VELLUM_JOBS` is not a dict.",
    "vellum_jobs.E002": "`VELLUM_JOBS` has a key vellum-jobs does not know, usually a typo: the hint names "
    "the closest known key.",
    "vellum_jobs.E003": "`WORKERS`, `MAX_ATTEMPTS` or `ASYNC_WORKERS` is not an integer in its range.",
    "vellum_jobs.E004": "A duration does not parse, or is zero where that cannot work (anywhere except "
    "`BACKOFF_BASE` and `PROBE_INTERVAL`).",
    "vellum_jobs.E005": "`RETENTION` is not a dict, or names a state that is not a finished one.",
    "vellum_jobs.E006": "`HEALTH` is not a dict, has an unknown key, or `REQUIRE_WORKER` or `PUBLIC` is "
    "not a bool.",
    "vellum_jobs.E007": "`HEARTBEAT` is longer than half of `LEASE`, so one missed beat would lose leases.",
    "vellum_jobs.E008": "A `TASKS` backend is `VellumTaskBackend` but `vellum_jobs` is not in "
    "`INSTALLED_APPS`.",
    "vellum_jobs.E010": "`SCHEDULES` is not a dict, or a schedule is not a dict, lacks `job` or `cron`, "
    "has an unknown key, or a bad `queue` or `priority`.",
    "vellum_jobs.E011": "A schedule's cron expression does not parse.",
    "vellum_jobs.E012": "A schedule names a job that is not registered.",
    "vellum_jobs.E013": "A schedule's time zone is unknown.",
    "vellum_jobs.E014": "A schedule's `missed` is neither `run_once` nor `skip`.",
    "vellum_jobs.E015": "A schedule's `args` or `kwargs` are not JSON, or the job cannot take them.",
    "vellum_jobs.E016": "A schedule is declared twice, by `@job(schedule=...)` and in `SCHEDULES`.",
    "vellum_jobs.E017": "`RUN_INLINE` is not a bool.",
    "vellum_jobs.E018": "`MAX_PAYLOAD_BYTES` is not a positive integer.",
    "vellum_jobs.E019": "`USE_TZ = False` with a `TIME_ZONE` other than UTC: leases, `run_after` and "
    "heartbeats would be naive local times, and a daylight-saving change would move them all by an hour.",
    "vellum_jobs.E020": "`LISTEN_DATABASE` is neither `False` nor the alias of a PostgreSQL database in "
    "`DATABASES`.",
    "vellum_jobs.E021": "`MAX_DATABASE_WAIT` is shorter than `LEASE` plus one `HEARTBEAT`: a worker would "
    "exit for a call that might still renew its leases in time.",
    "vellum_jobs.W001": "A SQLite database lacks the options a queue shared by web requests and workers "
    "needs (`transaction_mode` `IMMEDIATE`, a `timeout` of 10 s or more, WAL journal mode).",
    "vellum_jobs.W002": "A PostgreSQL or MariaDB/MySQL database runs at an isolation level other than READ "
    "COMMITTED, which the claim's concurrency limits rely on.",
    "vellum_jobs.W003": "A PostgreSQL server has autovacuum off: the dead rows every job leaves are never "
    "cleared (`check --deploy --database ALIAS`).",
}


@dataclasses.dataclass(frozen=True)
class Message:
    """One message a check can report, as its source builds it; ``…`` stands for each computed part."""

    text: str
    hint: str | None
    function: str


def _literal(node: ast.expr | None, names: Mapping[str, str] | None = None) -> str | None:
    """The text a message argument builds, ``…`` for each computed part; ``names``: local texts by name."""
    names = names or {}
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name) and node.id in names:
        return names[node.id]
    if isinstance(node, ast.JoinedStr):
        text = "".join(_part(part, names) for part in node.values)
        return None if text.strip("… ") == "" else text
    if isinstance(node, ast.IfExp):
        return _literal(node.body, names) or _literal(node.orelse, names)
    return None


def _part(part: ast.expr, names: Mapping[str, str]) -> str:
    if isinstance(part, ast.Constant) and isinstance(part.value, str):
        return part.value
    if isinstance(part, ast.FormattedValue) and isinstance(part.value, ast.Name) and part.value.id in names:
        return names[part.value.id]
    return "…"


def _local_texts(function: ast.FunctionDef | ast.AsyncFunctionDef) -> dict[str, str]:
    """The function's variables assigned a string once, such as ``where = f"schedule {name!r}"``."""
    texts: dict[str, str] = {}
    for node in ast.walk(function):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            text = _literal(node.value, texts)
            if text is not None:
                texts[node.targets[0].id] = text
    return texts


def _argument(call: ast.Call, position: int, keyword: str) -> ast.expr | None:
    for given in call.keywords:
        if given.arg == keyword:
            return given.value
    return call.args[position] if len(call.args) > position else None


def _check_id(call: ast.Call) -> tuple[str, int] | None:
    """The id a call builds a check message for, and where its message argument is."""
    # checks.py numbers its errors through _error(n, msg, hint), which names them vellum_jobs.E{n:03d}.
    if isinstance(call.func, ast.Name) and call.func.id == "_error" and call.args:
        number = call.args[0]
        if isinstance(number, ast.Constant) and isinstance(number.value, int):
            return f"vellum_jobs.E{number.value:03d}", 1
    name = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")
    given = _argument(call, 99, "id")
    if name in {"Error", "Warning", "Critical"} and isinstance(given, ast.Constant):
        return str(given.value), 0
    return None


def check_messages() -> dict[str, list[Message]]:
    """Every system check id the package can report, with the messages it builds, read from its source."""
    found: dict[str, list[Message]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if "migrations" in path.parts:
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        for function in ast.walk(tree):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            names = _local_texts(function)
            for node in ast.walk(function):
                if not isinstance(node, ast.Call) or (located := _check_id(node)) is None:
                    continue
                check_id, position = located
                text = _literal(_argument(node, position, "msg"), names) or "…"
                hint = _literal(_argument(node, position + 1, "hint"), names)
                message = Message(text, hint, function.name)
                messages = found.setdefault(check_id, [])
                if message not in messages:
                    messages.append(message)
    return dict(sorted(found.items()))


def checks_markdown() -> str:
    """Every system check id: what it reports, the settings it validates, and its messages and hints."""
    found = check_messages()
    complete("system checks", CHECKS, found)
    validates: dict[str, list[str]] = {}
    for key, setting in SETTINGS.items():
        for check_id in setting.rejected:
            validates.setdefault(check_id, []).append(f"[{code(key)}](#{setting_label(key)})")
    sections = []
    for check_id, messages in found.items():
        body = [f"({check_label(check_id)})=", f"## {code(check_id)}", CHECKS[check_id]]
        if check_id in validates:
            body.append("Validates " + ", ".join(validates[check_id]) + ".")
        lines = []
        for message in messages:
            line = f"- {escape(message.text)}"
            if message.hint:
                line += f"\n\n  *Hint:* {escape(message.hint)}"
            lines.append(line)
        body.append("\n".join(lines))
        sections.append("\n\n".join(body))
    return "\n\n".join(sections)
