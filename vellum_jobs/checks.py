"""System checks: the ``VELLUM_JOBS`` settings, schedules, time zone and the database options workers need.

Ids are permanent: ``vellum_jobs.E001``... for settings that cannot work,
``vellum_jobs.W001`` for SQLite options that invite "database is locked",
``vellum_jobs.W002`` for an isolation level the claim was not built for,
``vellum_jobs.W003`` (``check --deploy --database``) for a PostgreSQL server
whose autovacuum is off.
"""

from __future__ import annotations

import difflib
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import connections
from django.db.utils import load_backend

from vellum_jobs.conf import (
    DEFAULTS,
    DURATION_KEYS,
    MAX_ASYNC_WORKERS,
    RETENTION_STATES,
    conf,
    parse_duration,
)
from vellum_jobs.core import registry
from vellum_jobs.core.options import check_priority
from vellum_jobs.core.payload import normalise_call
from vellum_jobs.enqueueing import job_function
from vellum_jobs.exceptions import UnknownJob
from vellum_jobs.maintenance import schedules

# The integer settings' ranges: (least, most), None for no upper bound.
INTEGER_KEYS = {"WORKERS": (1, None), "MAX_ATTEMPTS": (1, None), "ASYNC_WORKERS": (0, MAX_ASYNC_WORKERS)}
# Durations where zero means something: retry at once; no probe, only the poll.
ZERO_ALLOWED = ("BACKOFF_BASE", "PROBE_INTERVAL")
HEALTH_KEYS = {"MAX_QUEUED_AGE", "REQUIRE_WORKER", "PUBLIC"}

RECOMMENDED_SQLITE_OPTIONS = {
    "transaction_mode": "IMMEDIATE",
    "timeout": 20,
    "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
}


# The tz database's names for UTC: naive times in them never jump.
UTC_NAMES = frozenset(
    prefix + name
    for prefix in ("", "Etc/")
    for name in ("UTC", "UCT", "Universal", "Zulu", "GMT", "GMT0", "GMT+0", "GMT-0", "Greenwich")
)


def register() -> None:
    checks.register(check_settings, "vellum_jobs")
    checks.register(check_time_zone, "vellum_jobs")
    checks.register(check_schedules, "vellum_jobs")
    # Not tagged "database": they read DATABASES, not the database, so a plain
    # `manage.py check` (and runserver, runjobs) warns of options that invite
    # "database is locked" or a claim built for another isolation level.
    checks.register(check_sqlite_options, "vellum_jobs")
    checks.register(check_isolation_level, "vellum_jobs")
    # Asks the server, so only where databases are checked, and only for a deploy.
    checks.register(check_autovacuum, "vellum_jobs", checks.Tags.database, deploy=True)


def _error(id_: int, msg: str, hint: str | None = None) -> checks.Error:
    return checks.Error(msg, hint=hint, id=f"vellum_jobs.E{id_:03d}")


def check_settings(**kwargs: Any) -> list[checks.CheckMessage]:
    value = conf.given()
    if not isinstance(value, dict):
        return [
            _error(
                1,
                f"VELLUM_JOBS must be a dict, got {type(value).__qualname__}: {value!r}",
                hint="like {'WORKERS': 4, 'RETENTION': {'done': '7d'}}; leave a key out to keep its default",
            )
        ]
    errors = _key_errors(value) + _value_errors(value)
    if not errors:
        # Only settings that are each right can be judged together.
        errors.extend(_timing_errors())
    return errors


def _key_errors(value: dict[Any, Any]) -> list[checks.CheckMessage]:
    """E002 for unknown keys, E003 for integers out of bounds, and the durations' errors."""
    errors: list[checks.CheckMessage] = []
    for key in sorted(set(value) - set(DEFAULTS), key=str):
        errors.append(_error(2, f"VELLUM_JOBS has an unknown key {key!r}", hint=_known(key, DEFAULTS)))
    for key, (least, most) in INTEGER_KEYS.items():
        given = value.get(key, least)
        if not isinstance(given, int) or isinstance(given, bool) or not least <= given <= (most or given):
            bounds = f">= {least}" if most is None else f"from {least} to {most}"
            errors.append(_error(3, f"VELLUM_JOBS[{key!r}] is {given!r}; it must be an integer {bounds}"))
    for key in DURATION_KEYS:
        if key in value:
            errors.extend(
                _duration_errors(f"VELLUM_JOBS[{key!r}]", value[key], allow_zero=key in ZERO_ALLOWED)
            )
    return errors


def _value_errors(value: dict[Any, Any]) -> list[checks.CheckMessage]:
    """The errors of the settings that take a value of their own kind (retention, health, ...)."""
    errors: list[checks.CheckMessage] = []
    if "RETENTION" in value:
        errors.extend(_retention_errors(value["RETENTION"]))
    if "HEALTH" in value:
        errors.extend(_health_errors(value["HEALTH"]))
    if "RUN_INLINE" in value and not isinstance(value["RUN_INLINE"], bool):
        errors.append(
            _error(17, f"VELLUM_JOBS['RUN_INLINE'] is {value['RUN_INLINE']!r}; it must be True or False")
        )
    if "MAX_PAYLOAD_BYTES" in value and (
        not isinstance(value["MAX_PAYLOAD_BYTES"], int)
        or isinstance(value["MAX_PAYLOAD_BYTES"], bool)
        or value["MAX_PAYLOAD_BYTES"] < 1
    ):
        errors.append(
            _error(
                18,
                f"VELLUM_JOBS['MAX_PAYLOAD_BYTES'] is {value['MAX_PAYLOAD_BYTES']!r}; "
                "it must be a positive integer, a number of bytes",
                hint=f"the default is {DEFAULTS['MAX_PAYLOAD_BYTES']} (1 MiB)",
            )
        )
    if value.get("MAX_DATABASE_WAIT") is not None:
        errors.extend(_duration_errors("VELLUM_JOBS['MAX_DATABASE_WAIT']", value["MAX_DATABASE_WAIT"]))
    if "LISTEN_DATABASE" in value:
        errors.extend(_listen_database_errors(value["LISTEN_DATABASE"]))
    if "SCHEDULES" in value and not isinstance(value["SCHEDULES"], dict):
        errors.append(
            _error(
                10,
                "VELLUM_JOBS['SCHEDULES'] must be a dict of schedule name -> entry, "
                f"got {value['SCHEDULES']!r}",
                hint="like {'nightly-report': {'job': 'report', 'cron': '30 6 * * 1-5'}}",
            )
        )
    return errors


def _timing_errors() -> list[checks.CheckMessage]:
    """E007 for a heartbeat too slow for the lease, else E021 for a database wait shorter than a
    lease and a beat."""
    if conf.heartbeat * 2 > conf.lease:
        return [
            _error(
                7,
                f"VELLUM_JOBS HEARTBEAT ({conf.heartbeat:g}s) must be at most half "
                f"of LEASE ({conf.lease:g}s)",
                hint="a lease must survive a missed heartbeat, or live jobs are recovered as lost",
            )
        ]
    if conf.max_database_wait < conf.lease + conf.heartbeat:
        return [
            _error(
                21,
                f"VELLUM_JOBS MAX_DATABASE_WAIT ({conf.max_database_wait:g}s) must be at least LEASE "
                f"plus one HEARTBEAT ({conf.lease + conf.heartbeat:g}s)",
                hint="a worker would exit for a call that may still renew its leases in time; "
                "None waits LEASE plus two HEARTBEATs",
            )
        ]
    return []


def check_time_zone(**kwargs: Any) -> list[checks.CheckMessage]:
    """E019 for ``USE_TZ = False`` with a ``TIME_ZONE`` other than UTC.

    Leases, ``run_after`` and heartbeats are then naive local times, and a
    daylight-saving change moves every one of them by an hour at once.
    """
    if conf.use_tz or conf.time_zone in UTC_NAMES:
        return []
    return [
        _error(
            19,
            f"USE_TZ is False and TIME_ZONE is {conf.time_zone!r}: vellum-jobs would store and compare "
            "leases and run_after as naive local time, so when the clocks go forward every lease "
            "expires at once and running jobs are run again, and when they go back leases, retries "
            "and delayed jobs wait an hour longer",
            hint="set USE_TZ = True (Django's default), or TIME_ZONE = 'UTC', which has no "
            "daylight-saving changes",
        )
    ]


def check_schedules(**kwargs: Any) -> list[checks.CheckMessage]:
    """Every schedule, from ``@job(schedule=...)`` and ``SCHEDULES``: each problem names the schedule."""
    errors: list[checks.CheckMessage] = []
    decorated = {f.name for f in job_function.functions() if f.schedule is not None}
    for name in sorted(decorated & set(map(str, conf.schedules))):
        errors.append(
            _error(
                16,
                f"schedule {name!r} is declared twice: by @job({name!r}, schedule=...) and in "
                "VELLUM_JOBS['SCHEDULES']",
                hint="rename the SCHEDULES entry, or drop one of the two",
            )
        )
    for name, entry in sorted(schedules.declared().items()):
        errors.extend(_schedule_errors(name, entry, conf.schedules.get(name)))
    return errors


def _schedule_errors(name: str, entry: dict[str, Any], given: object) -> list[checks.CheckMessage]:
    where = f"schedule {name!r}"
    if name in conf.schedules and not isinstance(given, dict):
        return [_error(10, f"{where} must be a dict like {{'job': ..., 'cron': ...}}, got {given!r}")]
    errors: list[checks.CheckMessage] = []
    for key in sorted(set(entry) - set(schedules.KEYS), key=str):
        errors.append(_error(10, f"{where} has an unknown key {key!r}", hint=_known(key, schedules.KEYS)))
    for key in ("job", "cron"):
        if key not in entry:
            errors.append(_error(10, f"{where} has no {key!r}"))
    cron = entry.get("cron")
    if "cron" in entry and (not isinstance(cron, str) or not schedules.valid_cron(cron)):
        errors.append(
            _error(
                11,
                f"{where} has an invalid cron expression {cron!r}",
                hint="five fields: minute hour day-of-month month day-of-week, e.g. '30 6 * * 1-5' "
                "(a sixth field is seconds)",
            )
        )
    function = None
    if "job" in entry:
        try:
            function = job_function.get(entry["job"])
        except (UnknownJob, TypeError):
            errors.append(
                _error(
                    12,
                    f"{where} runs an unknown job {entry['job']!r}",
                    hint=f"registered jobs: {', '.join(registry.names()) or '(none)'}",
                )
            )
    zone = entry.get("timezone")
    if zone is not None:
        try:
            ZoneInfo(zone)
        except (ZoneInfoNotFoundError, ValueError, TypeError):
            errors.append(
                _error(13, f"{where} has an unknown time zone {zone!r}", hint="e.g. 'Europe/Paris'")
            )
    if entry.get("missed", "run_once") not in schedules.MISSED:
        errors.append(
            _error(
                14,
                f"{where} has missed={entry['missed']!r}; it must be one of {', '.join(schedules.MISSED)}",
                hint="run_once: one catch-up run after workers were down; skip: wait for the next instant",
            )
        )
    if "queue" in entry and (not isinstance(entry["queue"], str) or not entry["queue"]):
        errors.append(_error(10, f"{where} has queue={entry['queue']!r}; it must be a non-empty string"))
    if "priority" in entry:
        try:
            check_priority(entry["priority"])
        except ValueError as exc:
            errors.append(_error(10, f"{where}: {exc}"))
    if function is not None:
        errors.extend(_arguments_errors(where, function, entry.get("args", []), entry.get("kwargs", {})))
    return errors


def _arguments_errors(
    where: str, function: job_function.JobFunction[Any, Any], args: object, kwargs: object
) -> list[checks.CheckMessage]:
    if not isinstance(args, (list, tuple)) or not isinstance(kwargs, dict):
        return [_error(15, f"{where}: args must be a list and kwargs a dict, got {args!r} and {kwargs!r}")]
    try:
        normalise_call(function.name, args, kwargs)
        function.signature.bind(*args, **kwargs)
    except TypeError as exc:
        return [_error(15, f"{where} cannot call {function.name!r} with its arguments: {exc}")]
    return []


def _listen_database_errors(value: object) -> list[checks.CheckMessage]:
    """E020 unless ``value`` is None, False, or the alias of a PostgreSQL database."""
    if value is None or value is False:
        return []
    where = f"VELLUM_JOBS['LISTEN_DATABASE'] is {value!r}"
    direct = (
        "an alias in DATABASES that reaches PostgreSQL directly, not through a pooler in transaction mode"
    )
    if not isinstance(value, str):
        return [_error(20, f"{where}; it must be a database alias or False", hint=f"{direct}; False to poll")]
    aliases = conf.databases()
    if value not in aliases:
        known = ", ".join(repr(alias) for alias in aliases)
        return [
            _error(20, f"{where}, which is not in DATABASES", hint=f"DATABASES has {known}; name {direct}")
        ]
    try:
        vendor = load_backend(str(aliases[value].get("ENGINE", ""))).DatabaseWrapper.vendor
    except ImproperlyConfigured:
        return []  # Django says what is wrong with the ENGINE when it connects
    if vendor != "postgresql":
        return [
            _error(
                20,
                f"{where}, a {vendor} database: only PostgreSQL has LISTEN/NOTIFY",
                hint=f"name {direct}, or leave LISTEN_DATABASE out",
            )
        ]
    return []


def _known(key: object, known: Any) -> str:
    """The hint for an unknown key: the closest known one (unknown keys are usually typos), then all."""
    close = difflib.get_close_matches(str(key), list(known), n=1) or difflib.get_close_matches(
        str(key).upper(), list(known), n=1
    )
    suggestion = f"did you mean {close[0]!r}? " if close else ""
    return f"{suggestion}known keys: {', '.join(known)}"


def _duration_errors(where: str, value: object, *, allow_zero: bool = False) -> list[checks.CheckMessage]:
    try:
        seconds = parse_duration(value)
    except ValueError as exc:
        return [_error(4, f"{where} is invalid: {exc}")]
    if seconds == 0 and not allow_zero:
        return [_error(4, f"{where} is {value!r}; it must be longer than zero")]
    return []


def _retention_errors(value: object) -> list[checks.CheckMessage]:
    if value is None:
        return []
    if not isinstance(value, dict):
        return [_error(5, f"VELLUM_JOBS['RETENTION'] must be a dict like {{'done': '7d'}}, got {value!r}")]
    errors: list[checks.CheckMessage] = []
    for state, age in value.items():
        if state not in RETENTION_STATES:
            errors.append(
                _error(
                    5,
                    f"VELLUM_JOBS['RETENTION'] has {state!r}; states that can be pruned: "
                    f"{', '.join(RETENTION_STATES)}",
                    hint="queued and running jobs are never pruned"
                    if state in ("queued", "running")
                    else _known(state, RETENTION_STATES),
                )
            )
        else:
            errors.extend(_duration_errors(f"VELLUM_JOBS['RETENTION'][{state!r}]", age))
    return errors


def _health_errors(value: object) -> list[checks.CheckMessage]:
    if not isinstance(value, dict):
        return [
            _error(
                6,
                f"VELLUM_JOBS['HEALTH'] must be a dict like {DEFAULTS['HEALTH']!r}, got {value!r}",
                hint="leave a key out to keep its default",
            )
        ]
    errors: list[checks.CheckMessage] = []
    for key in sorted(set(value) - HEALTH_KEYS, key=str):
        errors.append(
            _error(
                6,
                f"VELLUM_JOBS['HEALTH'] has an unknown key {key!r}; known: {', '.join(sorted(HEALTH_KEYS))}",
                hint=_known(key, sorted(HEALTH_KEYS)),
            )
        )
    if "MAX_QUEUED_AGE" in value and value["MAX_QUEUED_AGE"] is not None:
        errors.extend(_duration_errors("VELLUM_JOBS['HEALTH']['MAX_QUEUED_AGE']", value["MAX_QUEUED_AGE"]))
    for key in ("REQUIRE_WORKER", "PUBLIC"):
        if key in value and not isinstance(value[key], bool):
            errors.append(
                _error(6, f"VELLUM_JOBS['HEALTH'][{key!r}] is {value[key]!r}; it must be True or False")
            )
    return errors


def check_sqlite_options(databases: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    return sqlite_warnings(_checked(databases))


def sqlite_warnings(databases: dict[str, dict[str, Any]]) -> list[checks.CheckMessage]:
    warnings: list[checks.CheckMessage] = []
    for alias, config in databases.items():
        if not str(config.get("ENGINE", "")).endswith("sqlite3"):
            continue
        options: dict[str, Any] = config.get("OPTIONS", {})
        missing = []
        if str(options.get("transaction_mode", "")).upper() != "IMMEDIATE":
            missing.append(
                "transaction_mode 'IMMEDIATE' (so transactions wait for the lock instead of failing)"
            )
        if float(options.get("timeout", 5)) < 10:
            missing.append("timeout of 10 s or more (time to wait for another writer)")
        if "journal_mode=wal" not in str(options.get("init_command", "")).lower().replace(" ", ""):
            missing.append("init_command with PRAGMA journal_mode=WAL (readers don't block the writer)")
        if missing:
            warnings.append(
                checks.Warning(
                    f"SQLite database {alias!r} is not set up for a job queue shared by web "
                    f"requests and workers; it is missing: {'; '.join(missing)}",
                    hint=f"DATABASES[{alias!r}]['OPTIONS'] = {RECOMMENDED_SQLITE_OPTIONS!r}",
                    id="vellum_jobs.W001",
                )
            )
    return warnings


def check_isolation_level(databases: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    return isolation_warnings(_checked(databases))


def _checked(databases: Any) -> dict[str, dict[str, Any]]:
    """The settings of the databases being checked: every alias for a plain ``check``, else those named
    (``migrate``'s, ``check --database``'s)."""
    configured = conf.databases()
    if databases is None:
        return configured
    return {alias: configured[alias] for alias in databases if alias in configured}


def isolation_warnings(databases: dict[str, dict[str, Any]]) -> list[checks.CheckMessage]:
    """W002 for a PostgreSQL or MariaDB/MySQL database set to an isolation level other than READ COMMITTED.

    The claim re-counts a concurrency key's running jobs after it waits for
    the key's lock; only READ COMMITTED (Django's default on both) lets that
    count see the claims committed meanwhile.
    """
    warnings: list[checks.CheckMessage] = []
    for alias, config in databases.items():
        level = _isolation_level(config)
        if level is None:
            continue
        warnings.append(
            checks.Warning(
                f"Database {alias!r} runs transactions at isolation level {level}: concurrency limits "
                "may be exceeded, and claims may fail with serialization errors and be retried",
                hint=f"remove DATABASES[{alias!r}]['OPTIONS']['isolation_level'] (Django's default, "
                "READ COMMITTED), or give vellum-jobs a database alias of its own that uses READ COMMITTED",
                id="vellum_jobs.W002",
            )
        )
    return warnings


def _isolation_level(config: dict[str, Any]) -> str | None:
    """The isolation level a database is set to, when it is not READ COMMITTED."""
    engine = str(config.get("ENGINE", ""))
    level = config.get("OPTIONS", {}).get("isolation_level")
    if level is None:
        return None
    if engine.endswith("postgresql"):
        try:
            from django.db.backends.postgresql.psycopg_any import IsolationLevel

            name = IsolationLevel(level).name.replace("_", " ")
        # Django refuses the level, or the missing driver, when it connects, in its own words.
        except (ImportError, ValueError):
            return None
    elif engine.endswith("mysql"):
        name = str(level).upper()
    else:
        return None
    return None if name == "READ COMMITTED" else name


def check_autovacuum(databases: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """W003 for a PostgreSQL database being checked whose server has autovacuum off.

    Every job is inserted, updated at least twice and deleted: without
    autovacuum the dead row versions stay, the table and its indexes grow
    without end, and each claim steps over more of them. Per-table settings
    cannot turn it back on.
    """
    warnings: list[checks.CheckMessage] = []
    for alias in databases or ():
        connection = connections[alias]
        if connection.vendor != "postgresql":
            continue
        with connection.cursor() as cursor:
            cursor.execute("SHOW autovacuum")
            (setting,) = cursor.fetchone()
        if setting != "on":
            warnings.append(
                checks.Warning(
                    f"PostgreSQL database {alias!r} has autovacuum {setting}: the dead rows every job "
                    "leaves are never cleared, so the jobs table and its indexes grow and claims slow down",
                    hint="set autovacuum = on in postgresql.conf (the server's default); "
                    "docs/howto/volume.md gives per-table settings for a busy queue",
                    id="vellum_jobs.W003",
                )
            )
    return warnings
