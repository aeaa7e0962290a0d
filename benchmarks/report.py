"""Turn the rounds a run printed into medians with their spread, and those into Markdown tables."""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

DBS = {"sqlite": "SQLite", "postgresql": "PostgreSQL", "mariadb": "MariaDB"}

# vellum-jobs' own figures, in the order of the targets they answer to.
TARGETS = [
    (
        "drain_1x4",
        "drain, 1 `runjobs` process x 4 threads",
        "SQLite >= 3x huey and >= 0.5x the raw claim-1 loop; PostgreSQL >= 1.5x the raw claim-1 loop",
    ),
    ("drain_2x4", "drain, 2 processes x 4 threads", ""),
    ("drain_procs2", "drain, one `runjobs --processes 2 --workers 4`", ">= 5,000 jobs/s (PostgreSQL)"),
    (
        "latency",
        "pickup latency of an idle worker, p50 / p95",
        "SQLite 3 / 5, PostgreSQL 6 / 8, MariaDB < 50 ms",
    ),
    ("enqueue_one", "enqueue one by one (autocommit)", ">= huey (SQLite, PostgreSQL)"),
    ("enqueue_many", "`enqueue_many`", ""),
    (
        "batch_drain",
        "a batch of N jobs with an `on_done` callback over the same jobs plain: drain, 1 process x 4",
        ">= 0.8x (SQLite, PostgreSQL)",
    ),
    ("batch_enqueue", "`enqueue_many` of N jobs in a batch with a callback, over the same call plain", ""),
    (
        "baseline_drain",
        "drain of jobs without limits over the same drain by the code before limits"
        " (`--baseline`), 1 process x 4",
        ">= 0.90x (SQLite, PostgreSQL)",
    ),
    (
        "rate_drain",
        'drain under `rate=("1000/s", ...)`, 1 process x 4: starts/s after the first 1,000',
        ">= 900/s, 90% of the limit (PostgreSQL)",
    ),
    ("fairness", "2 processes share one backlog: the larger share", "<= 0.60"),
    ("priority_jump", "a priority-100 job in a busy worker starts within", "<= 2 cycles"),
    ("claim_cost_1m", "claim + record cost, 1,000,000 finished jobs vs an empty table", "<= 1.5x"),
    ("claim_cost_10m", "claim + record cost, 10,000,000 finished jobs vs an empty table", "<= 1.1x"),
    ("idle", "idle `runjobs`: CPU / memory", "< 2% of a core / < 50 MiB PSS"),
    ("footprint", "`runjobs --workers 4` draining N no-op jobs: its peak memory", "< 50 MiB PSS"),
    (
        "io_async200",
        "I/O-bound jobs (100 ms each) through one process, `--async-workers 200`",
        ">= 1,000 jobs/s and >= procrastinate (PostgreSQL)",
    ),
]

# Rows of the side-by-side table: (system, its figure for "drain with 4 workers", label).
PEERS = [
    ("vellum-jobs", "drain_1x4", "vellum-jobs (1 process x 4 threads)"),
    ("raw-SQL limit", "drain", "raw-SQL limit, claim 1 (4 threads)"),
    ("raw-SQL limit", "drain_batch10", "raw-SQL limit, claim 10 (4 threads)"),
    ("huey", "drain", "huey (4 threads)"),
    ("django-tasks-db", "drain", "django-tasks-db (4 `db_worker` processes)"),
    ("procrastinate", "drain", "procrastinate (concurrency 4)"),
    ("django-q2", "drain", "django-q2, ORM broker (4 workers)"),
    ("Oban", "drain", "Oban (`oban start`, queue limit 10 as in its docs)"),
    ("Oban", "drain_limit4", "Oban (queue limit 4)"),
    ("PgQueuer", "drain", "PgQueuer (worker cap `max_concurrent_tasks=20`, batch 10)"),
    ("PgQueuer", "drain_limit4", "PgQueuer (entrypoint `concurrency_limit=4`, batch 10)"),
]

# Rows of the I/O-bound table: (system, figure, label), the last row the one the others are divided by.
IO_BOUND = [
    ("vellum-jobs", "io_threads4", "vellum-jobs threads: `runjobs --workers 4`, `time.sleep`"),
    ("vellum-jobs", "io_threads32", "vellum-jobs threads: `runjobs --workers 32`, `time.sleep`"),
    ("procrastinate", "io_async200", "procrastinate: async worker, concurrency 200, `asyncio.sleep`"),
    (
        "vellum-jobs",
        "io_async200",
        "vellum-jobs async: `runjobs --workers 2 --async-workers 200`, `asyncio.sleep`",
    ),
]


def summarize(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per system, database and figure: the median of its rounds and their spread."""
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for line in lines:
        groups[line["system"], line["db"], line["figure"]].append(line)
    return [_summary(key, rounds) for key, rounds in groups.items()]


def _summary(key: tuple[str, str, str], rounds: list[dict[str, Any]]) -> dict[str, Any]:
    system, db, figure = key
    entry: dict[str, Any] = {"system": system, "db": db, "figure": figure}
    measured = [r for r in rounds if "value" in r]
    if not measured:
        entry["unavailable"] = next((r["unavailable"] for r in rounds if "unavailable" in r), "no result")
        return entry
    values = [r["value"] for r in measured]
    median = statistics.median(values)
    entry.update(
        median=median, min=min(values), max=max(values), rounds=len(values), unit=measured[0]["unit"]
    )
    # Spread: half the range of the rounds as a share of their median.
    entry["spread_pct"] = (max(values) - min(values)) / 2 / median * 100 if median else 0.0
    extras = (
        "p95",
        "rss_mb",
        "pss_mb",
        "server_cpu",
        "empty_us_per_job",
        "full_us_per_job",
        "finished_rows",
        "cpu_us_per_job",
        "statements_per_job",
        "jobs",
        "jobs_s",
        "plain_jobs_s",
        "batch_jobs_s",
        "current_jobs_s",
        "baseline_jobs_s",
        "cpu_ratio",
        "share",
        "max_in_1s",
        "claims_per_start",
        "started",
    )
    for extra in extras:
        if extra in measured[0]:
            entry[extra] = statistics.median(r[extra] for r in measured)
    return entry


def markdown(result: dict[str, Any]) -> str:
    summary = {(s["system"], s["db"], s["figure"]): s for s in result["summary"]}
    dbs = [db for db in DBS if any(key[1] == db for key in summary)]
    parts = [_targets_table(summary, dbs)] if any(key[0] == "vellum-jobs" for key in summary) else []
    parts += [table for db in dbs if (table := _peers_table(summary, db))]
    parts += [table] if (table := _io_table(summary, dbs)) else []
    parts.append(_machine(result.get("machine", {}), result.get("profile", "")))
    return "\n\n".join(parts) + "\n"


def _targets_table(summary: dict[tuple[str, str, str], dict[str, Any]], dbs: list[str]) -> str:
    rows = ["| figure | target | " + " | ".join(DBS[db] for db in dbs) + " |", "|---" * (len(dbs) + 2) + "|"]
    for figure, label, target in TARGETS:
        if not any(("vellum-jobs", db, figure) in summary for db in dbs):
            continue  # left out of this run (--figures)
        cells = [_vellum_cell(summary.get(("vellum-jobs", db, figure))) for db in dbs]
        rows.append(f"| {label} | {target} | " + " | ".join(cells) + " |")
    return "vellum-jobs (median of the rounds, ± half their range):\n\n" + "\n".join(rows)


def _vellum_cell(entry: dict[str, Any] | None) -> str:
    if entry is None:
        return "not run"
    if "unavailable" in entry:
        return f"cannot run: {entry['unavailable']}"
    figure = entry["figure"]
    if figure == "latency":
        return f"{_num(entry['median'])} / {_num(entry['p95'])} ms ±{entry['spread_pct']:.0f}%"
    if figure == "idle":
        memory = f"{entry['rss_mb']:.0f} MiB"
        if "pss_mb" in entry:
            memory = f"{entry['pss_mb']:.0f} MiB PSS, {memory} RSS"
        cell = f"{entry['median']:.1f}% / {memory}"
        return cell + (f" (server {entry['server_cpu']:.1f}%)" if "server_cpu" in entry else "")
    if figure == "footprint":
        return f"{entry['median']:.1f} MiB PSS ±{entry['spread_pct']:.0f}% ({entry['rss_mb']:.0f} MiB RSS)"
    if figure == "fairness":
        return f"{entry['median']:.2f} ±{entry['spread_pct']:.0f}%"
    if figure == "priority_jump":
        return f"{entry['median']:.1f} cycles"
    if figure in ("claim_cost_1m", "claim_cost_10m"):
        per_job = f"{entry['empty_us_per_job']:.0f} -> {entry['full_us_per_job']:.0f} µs/job"
        return f"{entry['median']:.2f}x ({per_job}, {entry['finished_rows']:,.0f} rows)"
    if figure in ("batch_drain", "batch_enqueue"):
        rates = f"{_num(entry['batch_jobs_s'])} vs {_num(entry['plain_jobs_s'])} jobs/s"
        return f"{entry['median']:.2f}x ±{entry['spread_pct']:.0f}% ({rates})"
    if figure == "baseline_drain":
        rates = f"{_num(entry['current_jobs_s'])} vs {_num(entry['baseline_jobs_s'])} jobs/s"
        return (
            f"{entry['median']:.2f}x ±{entry['spread_pct']:.0f}% ({rates}; CPU/job {entry['cpu_ratio']:.2f}x)"
        )
    if figure == "rate_drain":
        started = (
            "" if entry["started"] >= entry["jobs"] else f", {entry['started']:,.0f} of the jobs started"
        )
        details = (
            f"{entry['share']:.0%} of the limit; at most {entry['max_in_1s']:,.0f} starts in any second;"
            f" {entry['claims_per_start']:.1f} claims a start{started}"
        )
        return f"{_num(entry['median'])} starts/s ±{entry['spread_pct']:.0f}% ({details})"
    cell = f"{_num(entry['median'])} {entry['unit']} ±{entry['spread_pct']:.0f}%"
    if "statements_per_job" in entry:
        cell += f" ({entry['cpu_us_per_job']:.0f} µs CPU, {entry['statements_per_job']:.3f} statements a job)"
    elif "cpu_us_per_job" in entry:
        cell += f" ({entry['cpu_us_per_job']:.0f} µs CPU/job)"
    return cell


def _peers_table(summary: dict[tuple[str, str, str], dict[str, Any]], db: str) -> str:
    vellum = {f: summary.get(("vellum-jobs", db, f)) for f in ("drain_1x4", "latency", "enqueue_one")}
    rows = [
        "| system | drain, jobs/s | vellum/peer | pickup p50 / p95, ms | vellum/peer (p50) | "
        "enqueue one, jobs/s | vellum/peer |",
        "|---|---|---|---|---|---|---|",
    ]
    for system, drain_figure, label in PEERS:
        drain = summary.get((system, db, drain_figure))
        if drain is None:
            continue
        if "unavailable" in drain:
            rows.append(f"| {label} | cannot run: {drain['unavailable']} | | | | | |")
            continue
        # A system's second drain row leaves its latency and enqueue to the first.
        first = drain_figure not in ("drain_batch10", "drain_limit4")
        lat = summary.get((system, db, "latency")) if first else None
        enq = summary.get((system, db, "enqueue_one")) if first else None
        rows.append(
            f"| {label} | {_plain(drain)} | {_ratio(vellum['drain_1x4'], drain)} | {_latency(lat)} | "
            f"{_ratio(vellum['latency'], lat)} | {_plain(enq)} | {_ratio(vellum['enqueue_one'], enq)} |"
        )
    if len(rows) == 2:
        return ""  # no drain in this run (--figures)
    return f"Side by side on {DBS[db]}: no-op jobs, 4 workers:\n\n" + "\n".join(rows)


def _io_table(summary: dict[tuple[str, str, str], dict[str, Any]], dbs: list[str]) -> str:
    """Jobs/s of each way to run I/O-bound jobs in one process, and vellum-jobs async's over each."""
    columns = " | ".join(f"{DBS[db]}, jobs/s | async/this" for db in dbs)
    rows = [
        f"| system, one process | jobs | {columns} |",
        "|---|---" + "|---|---" * len(dbs) + "|",
    ]
    for system, figure, label in IO_BOUND:
        entries = [summary.get((system, db, figure)) for db in dbs]
        if all(entry is None for entry in entries):
            continue
        jobs = next((f"{entry['jobs']:,.0f}" for entry in entries if entry and "jobs" in entry), "")
        cells = []
        for db, entry in zip(dbs, entries, strict=True):
            ours = summary.get(("vellum-jobs", db, "io_async200"))
            cells += [_plain(entry) or "not run", _ratio(ours, entry)]
        rows.append(f"| {label} | {jobs} | " + " | ".join(cells) + " |")
    if len(rows) == 2:
        return ""
    heading = (
        "I/O-bound jobs through one process: each job waits 100 ms; first start to last finish "
        "(async/this: vellum-jobs async's jobs/s over the row's, same database and run):"
    )
    return heading + "\n\n" + "\n".join(rows)


def _plain(entry: dict[str, Any] | None) -> str:
    if entry is None:
        return ""
    if "unavailable" in entry:
        return f"n/a: {entry['unavailable']}"
    return f"{_num(entry['median'])} ±{entry['spread_pct']:.0f}%"


def _latency(entry: dict[str, Any] | None) -> str:
    if entry is None or "unavailable" in entry:
        return _plain(entry)
    return f"{_num(entry['median'])} / {_num(entry['p95'])}"


def _ratio(ours: dict[str, Any] | None, theirs: dict[str, Any] | None) -> str:
    if not ours or not theirs or "median" not in ours or "median" not in theirs or not theirs["median"]:
        return ""
    return f"{ours['median'] / theirs['median']:.2f}"


def _num(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def _machine(machine: dict[str, Any], profile: str) -> str:
    if not machine:
        return ""
    packages = ", ".join(f"{k} {v}" for k, v in machine.get("packages", {}).items() if v)
    dbs = "; ".join(
        f"{DBS[k]} " + ", ".join(f"{n}={v}" for n, v in d.items()) for k, d in machine["databases"].items()
    )
    load = ", ".join(f"{x:.2f}" for x in machine.get("load_average", []))
    return (
        f"Machine: {machine['cores']} cores, {machine['cpu']}, {machine.get('memory_gb')} GiB; "
        f"load average at start {load}; {machine['os']}; Python {machine['python']}; {packages}. "
        f"Databases: {dbs}. Profile: {profile}."
    )
