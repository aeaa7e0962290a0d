"""Every benchmark figure, vellum-jobs and its peers side by side: ``python -m benchmarks.run [--quick]``.

Runs each system on each database in its own subprocess (their settings and
global state never meet), several rounds each, then prints the medians and
spread as Markdown tables and writes every round to JSON. It reports; it never
judges a time. ``--markdown FILE`` prints the tables of an earlier run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks import baseline, machine, report

ROOT = Path(__file__).resolve().parent.parent
PEER_FIGURES = ["drain", "latency", "enqueue_one", "enqueue_many"]


@dataclass(frozen=True)
class System:
    name: str  # as its module reports it
    module: str
    figures: list[str]
    jobs: int  # jobs per drain in a full run; slow systems drain fewer so a round stays short
    extra: list[str] = field(default_factory=list)
    quick_extra: list[str] = field(default_factory=list)
    # Figures too slow for every run: measured only when --figures names them in full.
    opt_in: list[str] = field(default_factory=list)


SYSTEMS = {
    "vellum": System(
        "vellum-jobs",
        "benchmarks.vellum",
        [
            "drain_1x4",
            "drain_2x4",
            "drain_procs2",
            "fairness",
            "priority_jump",
            "latency",
            "enqueue_one",
            "enqueue_many",
            "batch_drain",
            "batch_enqueue",
            "baseline_drain",
            "rate_drain",
            "claim_cost_1m",
            "idle",
            "footprint",
            "io_threads4",
            "io_threads32",
            "io_async200",
        ],
        20000,
        ["--finished-rows", "1000000", "--claim-jobs", "2000", "--idle-seconds", "10"],
        ["--finished-rows", "50000", "--claim-jobs", "500", "--idle-seconds", "3"],
        opt_in=["claim_cost_10m"],
    ),
    "limit": System(
        "raw-SQL limit",
        "benchmarks.peers.limit_peer",
        ["drain", "drain_batch10", "latency", "enqueue_one", "enqueue_many"],
        20000,
    ),
    "huey": System("huey", "benchmarks.peers.huey_peer", PEER_FIGURES, 5000),
    "tasks-db": System("django-tasks-db", "benchmarks.peers.tasks_db_peer", PEER_FIGURES, 2000),
    "procrastinate": System(
        "procrastinate", "benchmarks.peers.procrastinate_peer", [*PEER_FIGURES, "io_async200"], 2000
    ),
    "q2": System("django-q2", "benchmarks.peers.q2_peer", PEER_FIGURES, 1000),
    "oban": System("Oban", "benchmarks.peers.oban_peer", ["drain", "drain_limit4", *PEER_FIGURES[1:]], 5000),
    "pgqueuer": System(
        "PgQueuer", "benchmarks.peers.pgqueuer_peer", ["drain", "drain_limit4", *PEER_FIGURES[1:]], 5000
    ),
}


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help="2 rounds of a tenth of the work: checks the harness"
    )
    parser.add_argument("--db", default="sqlite,postgresql,mariadb", help="comma-separated databases")
    parser.add_argument(
        "--systems", default=",".join(SYSTEMS), help="comma-separated, from: " + ", ".join(SYSTEMS)
    )
    parser.add_argument(
        "--figures",
        help="comma-separated figures, each by its name or the part before an underscore"
        " (drain, io: every I/O-bound variant); default all",
    )
    parser.add_argument("--rounds", type=int, help="rounds per figure (default 5, --quick 2)")
    parser.add_argument("--samples", type=int, help="jobs per latency round (default 30, --quick 8)")
    parser.add_argument(
        "--baseline",
        metavar="REF",
        help="the commit vellum-jobs' baseline_drain compares the drain with"
        f" (default {baseline.DEFAULT_REF}: the code before limits)",
    )
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/latest.json"))
    parser.add_argument("--markdown", metavar="JSON", help="print the tables of an earlier run and exit")
    return parser.parse_args()


def figures(name: str, args: argparse.Namespace) -> list[str]:
    """The figures of system ``name`` that ``--figures`` asks for, in the system's order."""
    wanted = args.figures.split(",") if args.figures else None
    system = SYSTEMS[name]
    return [
        figure
        for figure in system.figures
        if wanted is None or figure in wanted or figure.split("_")[0] in wanted
    ] + [figure for figure in system.opt_in if wanted is not None and figure in wanted]


def command(name: str, db: str, args: argparse.Namespace) -> list[str]:
    system = SYSTEMS[name]
    jobs = system.jobs // 10 if args.quick else system.jobs
    rounds = args.rounds or (2 if args.quick else 5)
    samples = args.samples or (8 if args.quick else 30)
    return [
        sys.executable, "-m", system.module, "--db", db, "--figures", ",".join(figures(name, args)),
        "--rounds", str(rounds), "--jobs", str(jobs), "--samples", str(samples),
        *(system.quick_extra if args.quick else system.extra),
        *(["--baseline", args.baseline] if args.baseline and name == "vellum" else []),
    ]  # fmt: skip


def measure(name: str, db: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """The rounds one system printed on one database; figures it never reached say why."""
    started = time.monotonic()
    print(f"{db:<10} {name:<16} ...", end=" ", file=sys.stderr, flush=True)
    try:
        done = subprocess.run(
            command(name, db, args),
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=600 if args.quick else 3600,
        )
        out, err, code = done.stdout, done.stderr, done.returncode
    except subprocess.TimeoutExpired as expired:
        out, err, code = _text(expired.stdout), "timed out", -1
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    print(f"{'ok' if code == 0 else 'failed'} ({time.monotonic() - started:.0f} s)", file=sys.stderr)
    if code != 0:
        reason = _last_line(err)
        reached = {line["figure"] for line in lines}
        lines += [
            {"system": SYSTEMS[name].name, "db": db, "figure": figure, "unavailable": f"failed: {reason}"}
            for figure in figures(name, args)
            if figure not in reached
        ]
    return lines


def _text(output: bytes | str | None) -> str:
    return output.decode() if isinstance(output, bytes) else output or ""


def _last_line(stderr: str) -> str:
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    return lines[-1][:200] if lines else "no error output"


def unreachable(name: str, db: str, error: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    return [
        {
            "system": SYSTEMS[name].name,
            "db": db,
            "figure": figure,
            "unavailable": f"{db} unreachable: {error}",
        }
        for figure in figures(name, args)
    ]


def _results(path: str) -> Path:
    """``path`` as given, or under benchmarks/ (so ``--markdown results/latest.json`` works from the root)."""
    given = Path(path)
    return given if given.exists() else ROOT / "benchmarks" / path


def main() -> None:
    args = parse()
    if args.markdown:
        print(report.markdown(json.loads(_results(args.markdown).read_text())))
        return
    dbs = args.db.split(",")
    names = [name for name in args.systems.split(",") if figures(name, args)]
    result: dict[str, Any] = {
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join(sys.argv),
        "profile": "quick" if args.quick else "full",
        "machine": machine.describe(dbs),
    }
    lines: list[dict[str, Any]] = []
    for db in dbs:
        error = result["machine"]["databases"][db].get("error")
        for name in names:
            lines += unreachable(name, db, error, args) if error else measure(name, db, args)
    result.update(finished=datetime.now(UTC).isoformat(timespec="seconds"), rounds=lines)
    result["summary"] = report.summarize(lines)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(report.markdown(result))
    print(f"Every round: {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
