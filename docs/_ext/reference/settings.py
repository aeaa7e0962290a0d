"""The settings page: every key of ``VELLUM_JOBS``, its type, default, description and checks.

The type of a duration or an integer, the defaults and the keys come from
``conf`` and ``checks``; a description comes from the docstring of the
key's property on ``conf.Settings`` where the table says so.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping

from docs._ext.reference import Incomplete, complete
from docs._ext.reference.markdown import check_label, code, from_rst, setting_label
from vellum_jobs.checks import INTEGER_KEYS
from vellum_jobs.conf import DEFAULTS, DURATION_KEYS, Settings
from vellum_jobs.maintenance import schedules


@dataclasses.dataclass(frozen=True)
class Setting:
    """What the reference says about one key, and a value of it that each check naming it refuses.

    A description of None takes the docstring of the key's property on
    ``conf.Settings``; an empty type or default is the one the code gives.
    """

    description: str | None
    rejected: Mapping[str, object] = dataclasses.field(default_factory=dict)
    type: str = ""
    default: str = ""


SETTINGS: dict[str, Setting] = {
    "WORKERS": Setting(
        "Threads per `runjobs` process, each running one job at a time (`runjobs --workers` overrides it).",
        {"vellum_jobs.E003": 0},
    ),
    "ASYNC_WORKERS": Setting(
        None,
        {"vellum_jobs.E003": -1},
    ),
    "ASYNC_BLOCKED_WARNING": Setting(None, {"vellum_jobs.E004": "soon"}),
    "POLL_INTERVAL": Setting(
        "How often an idle worker looks for due jobs, whatever else wakes it (a LISTEN, SQLite's "
        "data version, the MariaDB/MySQL probe).",
        {"vellum_jobs.E004": 0},
    ),
    "PROBE_INTERVAL": Setting(None, {"vellum_jobs.E004": "soon"}),
    "MAX_ATTEMPTS": Setting(
        "Runs a job gets before it is `failed`, for jobs whose `@job` does not set `max_attempts`.",
        {"vellum_jobs.E003": 0},
    ),
    "BACKOFF_BASE": Setting(
        "The delay before the first retry, doubled for each attempt after it, up to `BACKOFF_MAX`; "
        "0 retries at once.",
        {"vellum_jobs.E004": "soon"},
    ),
    "BACKOFF_MAX": Setting("The longest delay between two attempts.", {"vellum_jobs.E004": 0}),
    "LEASE": Setting(
        "How long a claim holds without a heartbeat: a job whose worker stopped renewing it for this "
        "long is recovered by another worker.",
        {"vellum_jobs.E004": "soon", "vellum_jobs.E007": "15s"},
    ),
    "HEARTBEAT": Setting(
        "How often a worker renews its leases and its `Worker` row; at most half of `LEASE`, so one "
        "missed beat does not lose a lease.",
        {"vellum_jobs.E004": 0, "vellum_jobs.E007": "40s"},
    ),
    "MAX_DATABASE_WAIT": Setting(
        None,
        {"vellum_jobs.E004": "soon", "vellum_jobs.E021": "30s"},
        type="duration or None",
    ),
    "RETENTION": Setting(
        "Automatic pruning by `runjobs`: a finished state (`done`, `failed`, `cancelled`) mapped to how "
        "long jobs in it are kept after `finished_at`, such as `{'done': '7d', 'failed': '30d'}`. A state "
        "left out is kept forever; `None` or `{}` turns automatic retention off (`prunejobs` still works).",
        {"vellum_jobs.E005": {"queued": "7d"}, "vellum_jobs.E004": {"done": "soon"}},
        type="dict of finished state to duration, or None",
    ),
    "HEALTH": Setting(
        "When the health view answers 503, and who may see it. A partial dict keeps the defaults of the "
        "keys it leaves out.",
        {"vellum_jobs.E006": "yes"},
        type="dict, with the keys below",
    ),
    "SCHEDULES": Setting(
        "Recurring jobs declared in settings: a schedule name mapped to its entry (the keys below). "
        "`@job(schedule=...)` declares them in code.",
        {"vellum_jobs.E010": ["nightly"]},
        type="dict of schedule name to entry",
    ),
    "RUN_INLINE": Setting(
        "Run each job at its enqueue, in the caller's thread and transaction, as a worker would (for "
        "tests); nothing waits for `runjobs`.",
        {"vellum_jobs.E017": "yes"},
        type="bool",
    ),
    "MAX_PAYLOAD_BYTES": Setting(
        "The most a job's arguments (positional and keyword together) or its result may take, as compact "
        "JSON in UTF-8. A larger enqueue raises `ValueError` and writes nothing; a larger result is not "
        "stored, and the job is `done` with the reason in `error`.",
        {"vellum_jobs.E018": 0},
        type="integer, at least 1 (bytes)",
    ),
    "LISTEN_DATABASE": Setting(
        "PostgreSQL: the database alias whose connection a worker LISTENs on for new jobs. `None`, the "
        "queue's own alias (`runjobs --database`); behind a pooler in transaction mode, which loses "
        "notifications, an alias that reaches PostgreSQL directly, or `False` to poll at `POLL_INTERVAL`.",
        {"vellum_jobs.E020": "nowhere"},
        type="database alias, None or False",
    ),
    "UNKNOWN_NAME_TIMEOUT": Setting(
        "How long a queued job waits while no live worker knows its name before it is `failed` with "
        "\"no handler registered for 'x'\" and the reason. In a rolling deploy new code can enqueue a new "
        "kind of job before any worker runs that code; workers of the old code leave it queued for the "
        "new ones. The time counts only while some worker is alive (checked once a minute, by one "
        "worker); a live worker that knows the name, or no job of it left queued, starts it again. See "
        "[rolling deploys](../howto/deploy.md#rolling-deploys).",
        {"vellum_jobs.E004": 0},
    ),
}

HEALTH: dict[str, Setting] = {
    "MAX_QUEUED_AGE": Setting(
        "A due job that has waited longer than this is a problem; `None` sets no limit.",
        {"vellum_jobs.E004": "an hour"},
        type="duration or None",
    ),
    "REQUIRE_WORKER": Setting("No live worker is a problem.", {"vellum_jobs.E006": "yes"}, type="bool"),
    "PUBLIC": Setting(
        "Anyone may read the view; `False` admits staff with the *view job* (or *change job*) "
        "permission only.",
        {"vellum_jobs.E006": 1},
        type="bool",
    ),
}

# A schedule's keys; ``rejected`` values go into an entry that is otherwise valid.
SCHEDULE_KEYS: dict[str, Setting] = {
    "job": Setting(
        "The name of the registered job to enqueue.",
        {"vellum_jobs.E012": "no-such-job"},
        type="job name",
        default="required",
    ),
    "cron": Setting(
        "Five fields, minute hour day-of-month month day-of-week, such as `'30 6 * * 1-5'` (a sixth "
        "field is seconds), read by croniter in the schedule's time zone.",
        {"vellum_jobs.E011": "every morning"},
        type="cron expression",
        default="required",
    ),
    "args": Setting(
        "Positional arguments of each run.", {"vellum_jobs.E015": "x"}, type="list", default="`[]`"
    ),
    "kwargs": Setting("Keyword arguments of each run.", {"vellum_jobs.E015": ["x"]}, type="dict"),
    "timezone": Setting(
        "The time zone the cron expression is read in.",
        {"vellum_jobs.E013": "Mars/Olympus"},
        type="time zone name",
        default="`TIME_ZONE`",
    ),
    "missed": Setting(
        "What happens to instants missed while no worker ran: `run_once` runs the latest of them once, "
        "as soon as a worker is back; `skip` waits for the next instant.",
        {"vellum_jobs.E014": "all"},
        type="`run_once` or `skip`",
    ),
    "queue": Setting(
        "The queue of each run.", {"vellum_jobs.E010": ""}, type="queue name", default="the job's queue"
    ),
    "priority": Setting(
        "The priority of each run, -100 to 100, higher first.",
        {"vellum_jobs.E010": 1000},
        type="integer",
        default="the job's priority",
    ),
}


def setting_description(key: str, setting: Setting) -> str:
    if setting.description is not None:
        return setting.description
    prop = getattr(Settings, key.lower(), None)
    doc = inspect.getdoc(prop) if prop is not None else None
    if not doc:
        raise Incomplete(f"VELLUM_JOBS[{key!r}] has no description, in the reference or in conf.Settings")
    return from_rst(doc)


def setting_type(key: str, setting: Setting) -> str:
    if setting.type:
        return setting.type
    if key in DURATION_KEYS:
        return "duration"
    if key in INTEGER_KEYS:
        least, most = INTEGER_KEYS[key]
        return f"integer, at least {least}" if most is None else f"integer, {least} to {most}"
    raise Incomplete(f"VELLUM_JOBS[{key!r}] has no type in the reference")


def _setting_section(level: str, label: str, title: str, body: list[str]) -> str:
    return "\n\n".join([f"({label})=", f"{level} {title}", *body])


def _fields(kind: str, default: str, rejected: Mapping[str, object]) -> str:
    checked = ", ".join(f"[{code(check_id)}](#{check_label(check_id)})" for check_id in rejected) or "—"
    return f"- **Type:** {kind}\n- **Default:** {default}\n- **Checked by:** {checked}"


def settings_markdown() -> str:
    """Every key of ``VELLUM_JOBS``: its type, default, description and the checks that validate it."""
    complete("VELLUM_JOBS", SETTINGS, DEFAULTS)
    complete("VELLUM_JOBS['HEALTH']", HEALTH, DEFAULTS["HEALTH"])
    complete("a schedule's keys", SCHEDULE_KEYS, schedules.KEYS)
    sections = []
    for key in DEFAULTS:
        setting = SETTINGS[key]
        default = code(repr(DEFAULTS[key]))
        if key in DURATION_KEYS:
            default += " (seconds)"
        body = [
            setting_description(key, setting),
            _fields(setting_type(key, setting), default, setting.rejected),
        ]
        if key == "HEALTH":
            for name, value in DEFAULTS[key].items():
                body.append(_sub_setting(key, name, HEALTH[name], code(repr(value))))
        if key == "SCHEDULES":
            for name in schedules.KEYS:
                entry = SCHEDULE_KEYS[name]
                body.append(_sub_setting(key, name, entry, entry.default or _schedule_default(name)))
        sections.append(_setting_section("##", setting_label(key), code(key), body))
    return "\n\n".join(sections)


def _sub_setting(parent: str, name: str, setting: Setting, default: str) -> str:
    assert setting.description is not None, f"{parent}[{name!r}] needs a description"
    body = [setting.description, _fields(setting.type, default, setting.rejected)]
    title = f"{parent}[{name!r}]" if parent == "HEALTH" else f"{parent}[name][{name!r}]"
    return _setting_section("###", setting_label(parent, name), code(title), body)


def _schedule_default(name: str) -> str:
    field = {f.name: f for f in dataclasses.fields(schedules.Definition)}[name]
    if field.default_factory is not dataclasses.MISSING:
        return code(repr(field.default_factory()))
    return code(repr(field.default))
