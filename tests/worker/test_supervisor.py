"""``runjobs --processes N``: the supervisor's restart policy in-process, with tiny stand-in
children; then real ``runjobs`` supervisors with signals, kill -9 and a backlog."""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from tests.support.processes import Runjobs, alive, children_of, wait_for
from tests.testapp import jobs
from tests.testapp.models import Execution
from vellum_jobs.core.models import Job, Worker
from vellum_jobs.worker.supervisor import EXIT_GAVE_UP, Restarts, Supervisor, describe

# -- the policy, with children that are a line of Python ------------------

QUICK = Restarts(delay=0.01, stable=30, give_up_after=3)


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def exits_in_turn(path: Path, codes: list[int]) -> list[str]:
    """A child that exits with the next of ``codes`` each time it starts (the count kept in ``path``)."""
    return python(
        f"import pathlib, sys; p = pathlib.Path({str(path)!r}); n = len(p.read_text()) if p.exists() else 0;"
        f" p.write_text('x' * (n + 1)); sys.exit({codes!r}[min(n, {len(codes) - 1})])"
    )


@pytest.fixture
def events(caplog):
    caplog.set_level(logging.INFO, logger="vellum_jobs")
    return lambda words: [r.getMessage() for r in caplog.records if words in r.getMessage()]


def test_restart_delay_doubles_for_each_early_exit_until_the_supervisor_gives_up():
    restarts = Restarts()
    assert [restarts.delay_after(n) for n in range(1, restarts.give_up_after)] == [1, 2, 4]


def test_a_process_that_keeps_exiting_at_start_makes_the_supervisor_give_up_with_status_4(events):
    started = time.monotonic()
    assert Supervisor(python("raise SystemExit(2)"), 2, finite=False, restarts=QUICK).run() == EXIT_GAVE_UP
    assert time.monotonic() - started < 10
    restarts = events("worker process exited, restarting")
    assert len(restarts) >= 2
    assert all("reason=exit code 2 delay=" in line for line in restarts)
    assert events("keeps exiting, stopping them all")


@pytest.mark.parametrize(("stable", "code"), [(30.0, EXIT_GAVE_UP), (0.0, 0)])
def test_a_process_that_ran_past_stable_starts_its_count_of_early_exits_over(tmp_path, stable, code):
    restarts = Restarts(delay=0.01, stable=stable, give_up_after=2)
    command = exits_in_turn(tmp_path / "runs", [1, 1, 1, 0])
    assert Supervisor(command, 1, finite=True, restarts=restarts).run() == code


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        (3, "exit code 3 (stuck threads, --max-stuck)"),
        (5, "exit code 5 (no answer from the database, MAX_DATABASE_WAIT)"),
    ],
    ids=["stuck-threads", "no-answer"],
)
def test_a_process_that_exits_3_or_5_asking_for_a_restart_is_started_again(tmp_path, events, code, reason):
    command = exits_in_turn(tmp_path / "runs", [code, 0])
    assert Supervisor(command, 1, finite=True, restarts=QUICK).run() == 0
    assert events("restarting pid=")[0].endswith(f"reason={reason} delay=0.0s")


def test_under_burst_a_process_that_exits_0_is_done_and_not_started_again(events):
    assert Supervisor(python("pass"), 2, finite=True, restarts=QUICK).run() == 0
    assert len(events("worker process started")) == 2
    assert len(events("worker process finished")) == 2


def test_without_burst_a_process_that_exits_0_is_started_again(tmp_path, events):
    # Exits 0 the first time; the second time asks its supervisor to stop, and stops when told.
    command = python(
        "import os, pathlib, signal, sys, time\n"
        f"runs = pathlib.Path({str(tmp_path / 'runs')!r})\n"
        "if not runs.exists():\n"
        "    runs.touch()\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, lambda *args: sys.exit(0))\n"
        "os.kill(os.getppid(), signal.SIGTERM)\n"
        "time.sleep(30)\n"
    )
    assert Supervisor(command, 1, finite=False, restarts=QUICK).run() == 0
    assert [line.split(" pid=")[0] for line in events("worker process")] == [
        "worker process started",
        "worker process exited, restarting",
        "worker process started",
        "worker process stopped",
    ]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_is_forwarded_to_the_children_as_it_came(tmp_path, signum):
    # The child signals its supervisor, and notes what the supervisor sends back.
    heard = tmp_path / "heard"
    command = python(
        "import os, pathlib, signal, sys, time\n"
        "def note(signum, frame):\n"
        f"    pathlib.Path({str(heard)!r}).write_text(signal.Signals(signum).name)\n"
        "    sys.exit(0)\n"
        f"signal.signal({int(signum)}, note)\n"
        f"os.kill(os.getppid(), {int(signum)})\n"
        "time.sleep(30)\n"
    )
    assert Supervisor(command, 1, finite=False, restarts=QUICK).run() == 0
    assert heard.read_text() == signum.name


@pytest.mark.parametrize(
    ("code", "words"),
    [
        (1, "exit code 1"),
        (3, "exit code 3 (stuck threads, --max-stuck)"),
        (5, "exit code 5 (no answer from the database, MAX_DATABASE_WAIT)"),
        (-signal.SIGKILL, "killed by SIGKILL"),
        (-signal.SIGTERM, "killed by SIGTERM"),
    ],
)
def test_an_exit_status_in_words(code, words):
    assert describe(code) == words


def test_processes_below_1_and_call_command_are_command_errors():
    with pytest.raises(CommandError, match="--processes must be at least 1, got 0"):
        call_command("runjobs", processes=0)
    with pytest.raises(CommandError, match="call_command"):
        call_command("runjobs", processes=2)


# -- real supervisors ----------------------------------------------------


def state(job: Job) -> str:
    return Job.objects.get(pk=job.pk).state


def started(job: Job) -> bool:
    return Execution.objects.filter(job_id=job.pk).exists()


def workers_up(supervisor: Runjobs, count: int) -> set[int]:
    """Wait until ``count`` children of ``supervisor`` have registered worker rows; their pids."""

    def registered() -> set[int]:
        pids = set(Worker.objects.values_list("pid", flat=True))
        return pids if len(pids) == count and pids == children_of(supervisor.pid) else set()

    return wait_for(registered, what=f"{count} worker processes registered")


def holds_no_database(pid: int) -> bool:
    """Whether ``pid`` has neither a socket nor the SQLite file open."""
    database = str(connection.settings_dict["NAME"])
    fd_dir = Path(f"/proc/{pid}/fd")
    targets = [os.readlink(fd) for fd in fd_dir.iterdir() if int(fd.name) > 2]
    return not [t for t in targets if t.startswith("socket:") or t.startswith(database)]


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
class TestRunjobsProcesses:
    def test_two_processes_drain_a_backlog_exactly_once(self):
        supervisor = Runjobs("--processes", "2", "--workers", "4")
        try:
            workers_up(supervisor, 2)
            created = jobs.record.enqueue_many([(i,) for i in range(1000)])
            done = Job.objects.filter(state=Job.State.DONE)
            wait_for(lambda: done.count() == 1000, timeout=120, what="the backlog drained")
        finally:
            supervisor.signal(signal.SIGTERM)
            assert supervisor.wait() == 0
        executed = list(Execution.objects.values_list("job_id", flat=True))
        assert sorted(executed) == sorted(j.pk for j in created)
        pids = set(Execution.objects.values_list("pid", flat=True))
        assert len(pids) == 2 and supervisor.pid not in pids
        assert Job.objects.values("worker_id").distinct().count() == 2
        assert not Worker.objects.exists()

    def test_burst_exits_0_once_the_queue_is_empty(self):
        created = jobs.record.enqueue_many([(i,) for i in range(50)])
        supervisor = Runjobs("--processes", "2", "--workers", "2", "--burst")
        assert supervisor.wait(60) == 0
        assert Job.objects.filter(state=Job.State.DONE).count() == len(created)
        assert Execution.objects.count() == len(created)
        out, _ = supervisor.output()
        assert out.count("vellum-jobs worker ") == 2
        assert not Worker.objects.exists()

    def test_each_child_is_a_worker_row_and_a_killed_one_is_started_again(self):
        supervisor = Runjobs("--processes", "2", "--workers", "1", "-v", "2", "--grace", "5")
        try:
            first = workers_up(supervisor, 2)
            assert holds_no_database(supervisor.pid)
            assert all(os.getpgid(pid) == pid for pid in first)  # a terminal's Ctrl-C misses them
            victim = min(first)
            with open(f"/proc/{victim}/cmdline") as cmdline:
                argv = cmdline.read().split("\0")[:-1]
            interpreter = [sys.executable, "-X", "faulthandler", "-m", "django"]
            assert argv == [*interpreter, "runjobs", "--workers", "1", "-v", "2", "--grace", "5"]
            os.kill(victim, signal.SIGKILL)
            wait_for(
                lambda: len(children_of(supervisor.pid)) == 2 and victim not in children_of(supervisor.pid)
            )
            # The dead worker's row stays until it is forgotten; the new one registers beside it.
            replaced = wait_for(
                lambda: set(Worker.objects.values_list("pid", flat=True)) - first,
                timeout=30,
                what="a new worker",
            )
            assert replaced == children_of(supervisor.pid) - first
            line = f"worker process exited, restarting pid={victim} reason=killed by SIGKILL delay=1.0s"
            assert line in supervisor.output()[1]
            job = jobs.add.enqueue(2, 3)
            wait_for(lambda: state(job) == Job.State.DONE, what="a job done after the restart")
        finally:
            supervisor.signal(signal.SIGTERM)
            assert supervisor.wait() == 0

    def test_sigterm_stops_every_child_gracefully_finishing_or_handing_back_their_jobs(self):
        short, long = jobs.sleep.enqueue(2), jobs.sleep.enqueue(60)
        supervisor = Runjobs("--processes", "2", "--workers", "1", "--grace", "5")
        children = workers_up(supervisor, 2)
        wait_for(lambda: started(short) and started(long), what="both jobs running")
        signalled = time.monotonic()
        supervisor.signal(signal.SIGTERM)
        assert supervisor.wait() == 0
        assert time.monotonic() - signalled < 15
        assert state(short) == Job.State.DONE
        long.refresh_from_db()
        assert (long.state, long.attempts) == (Job.State.QUEUED, 0)
        assert "handed back at shutdown" in long.error
        assert not Worker.objects.exists()
        assert not any(alive(pid) for pid in children)

    def test_a_second_signal_kills_every_child_at_once_and_exits_1(self):
        job = jobs.sleep.enqueue(60)
        supervisor = Runjobs(
            "--processes", "2", "--workers", "1", "--grace", "60", env={"VELLUM_LOG_LEVEL": "INFO"}
        )
        children = workers_up(supervisor, 2)
        wait_for(lambda: started(job), what="job start")
        supervisor.signal(signal.SIGTERM)
        wait_for(
            lambda: (
                "shutdown requested by SIGTERM: passing it on to 2 runjobs processes"
                " signal=SIGTERM processes=2" in supervisor.output()[1]
            )
        )
        signalled = time.monotonic()
        supervisor.signal(signal.SIGTERM)
        assert supervisor.wait() == 1
        assert time.monotonic() - signalled < 20  # at once: far below the 60 s grace
        assert not any(alive(pid) for pid in children)
        assert state(job) == Job.State.RUNNING  # left to its lease

    def test_children_stop_gracefully_when_their_supervisor_is_killed(self):
        supervisor = Runjobs("--processes", "2", "--workers", "1")
        children = workers_up(supervisor, 2)
        supervisor.kill()
        wait_for(lambda: not any(alive(pid) for pid in children), what="the children to stop")
        assert not Worker.objects.exists()  # each removed its row on the way out

    def test_children_that_keep_failing_at_start_make_the_supervisor_exit_4(self):
        # Every statement the children make fails as a database user without
        # privileges would; the supervisor makes none (no system checks either).
        # The faults are raised above the driver, so every database gives the
        # supervisor the same exits: one is enough.
        if connection.vendor != "sqlite":
            pytest.skip("the children's faults are the same on every database; SQLite's cells run it")
        broken = {"VELLUM_TEST_FAULTS": "1", "VELLUM_TEST_FAULTS_ERRORS": "ProgrammingError"}
        started_at = time.monotonic()
        supervisor = Runjobs("--processes", "2", "--workers", "1", "--skip-checks", env=broken)
        assert supervisor.wait(90) == EXIT_GAVE_UP
        assert time.monotonic() - started_at < 60
        err = supervisor.output()[1]
        assert "worker process exited, restarting" in err and "reason=exit code 1" in err
        assert "worker process keeps exiting, stopping them all" in err
