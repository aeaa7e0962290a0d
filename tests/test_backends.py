"""``VellumTaskBackend``: Django's Tasks framework on vellum-jobs, held to its documented behaviour."""

from __future__ import annotations

import asyncio
import importlib
import logging
import sys
import textwrap
import uuid
from datetime import timedelta
from functools import partial

import django
import pytest
from django.db import connections, transaction
from django.db.models import Max, Min
from django.test import override_settings
from django.utils import timezone

from tests.support.leases import beat_past_a_lease
from tests.support.processes import Runjobs, wait_for
from tests.support.workers import Background
from tests.testapp.models import Execution
from vellum_jobs import registry
from vellum_jobs.core.models import Job
from vellum_jobs.worker.process import WorkerOptions, WorkerProcess

if django.VERSION >= (6, 0):
    from asgiref.sync import sync_to_async
    from django.tasks import TaskResultStatus, default_task_backend, task_backends
    from django.tasks import task as django_task
    from django.tasks.exceptions import (
        InvalidTask,
        InvalidTaskBackend,
        TaskResultDoesNotExist,
        TaskResultMismatch,
    )
    from django.tasks.signals import task_enqueued, task_finished, task_started

    from tests.testapp import tasks

needs_django_6 = pytest.mark.skipif(django.VERSION < (6, 0), reason="django.tasks is new in Django 6.0")
pytestmark = pytest.mark.django_db

BACKEND = "vellum_jobs.backends.VellumTaskBackend"


def drain(**options) -> WorkerProcess:
    """Run due jobs in this process with a burst worker until none is left."""
    worker = WorkerProcess(WorkerOptions(**{"burst": True, "threads": 1, **options}))
    assert worker.run() == 0
    return worker


# -- Django 5.2 ----------------------------------------------------------------


@pytest.mark.skipif(django.VERSION >= (6, 0), reason="Django 6 has django.tasks")
def test_on_django_5_2_importing_the_backend_says_that_django_6_is_needed(monkeypatch):
    monkeypatch.delitem(sys.modules, "vellum_jobs.backends", raising=False)
    with pytest.raises(ImportError, match=r"needs Django 6\.0 or later.*this is Django 5\.2"):
        importlib.import_module("vellum_jobs.backends")


# -- the backend -----------------------------------------------------------------


@needs_django_6
def test_the_backend_supports_defer_priority_get_result_and_async_tasks():
    backend = task_backends["default"]
    assert type(backend).__module__ == "vellum_jobs.backends.backend"
    assert (
        backend.supports_defer,
        backend.supports_priority,
        backend.supports_get_result,
        backend.supports_async_task,
    ) == (True, True, True, True)


@needs_django_6
@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"MAX_ATTEMPT": 3}, "unknown key 'MAX_ATTEMPT'"),
        ({"MAX_ATTEMPTS": 0}, "MAX_ATTEMPTS is 0; it must be an integer >= 1"),
        ({"MAX_ATTEMPTS": True}, "MAX_ATTEMPTS is True"),
        ({"BACKOFF_BASE": "soon"}, "BACKOFF_BASE is invalid: 'soon' is not a duration"),
    ],
)
def test_invalid_options_are_refused_with_the_key_and_the_problem(options, message):
    settings = {"default": {"BACKEND": BACKEND, "OPTIONS": options}}
    with override_settings(TASKS=settings), pytest.raises(InvalidTaskBackend, match=message):
        task_backends["default"]


@needs_django_6
def test_check_e008_when_vellum_jobs_is_not_installed(monkeypatch):
    assert default_task_backend.check() == []
    monkeypatch.setattr("vellum_jobs.backends.backend.apps.is_installed", lambda name: False)
    assert [message.id for message in default_task_backend.check()] == ["vellum_jobs.E008"]


# -- enqueue -------------------------------------------------------------------


@needs_django_6
def test_enqueue_stores_a_job_named_after_the_task_s_module_path():
    result = tasks.add.enqueue(2, b=3)
    job = Job.objects.get()
    assert result.id == str(job.pk)
    assert (job.name, job.state, job.task_backend) == ("tests.testapp.tasks.add", Job.State.QUEUED, "default")
    assert (job.args, job.kwargs, job.queue, job.priority, job.max_attempts) == (
        [2],
        {"b": 3},
        "default",
        0,
        3,
    )
    assert result.status == TaskResultStatus.READY
    assert result.task == tasks.add
    assert (result.args, result.kwargs, result.backend) == ([2], {"b": 3}, "default")
    assert result.enqueued_at == job.created_at
    assert (result.started_at, result.last_attempted_at, result.finished_at) == (None, None, None)
    assert (result.errors, result.worker_ids, result.attempts, result.is_finished) == ([], [], 0, False)
    with pytest.raises(ValueError, match="Task has not finished yet"):
        _ = result.return_value


@needs_django_6
def test_the_task_s_queue_and_priority_become_the_job_s():
    tasks.send_mail.enqueue("ann@example.com")
    tasks.add.using(priority=-7, queue_name="emails").enqueue(1, 1)
    assert list(Job.objects.order_by("id").values_list("queue", "priority")) == [
        ("emails", 10),
        ("emails", -7),
    ]


@needs_django_6
def test_a_queue_outside_queues_is_refused_by_django():
    with pytest.raises(InvalidTask, match="Queue 'elsewhere' is not valid"):
        tasks.add.using(queue_name="elsewhere")


@needs_django_6
def test_max_attempts_defaults_to_vellum_jobs_setting_without_the_option():
    with override_settings(TASKS={"default": {"BACKEND": BACKEND}}):
        tasks.add.enqueue(1, 1)
    assert Job.objects.get().max_attempts == 5


@needs_django_6
def test_an_argument_that_is_not_json_is_refused_and_nothing_is_written():
    # The words of Django's own backends, so code that matches them keeps working.
    with pytest.raises(TypeError, match=r"args\[0\] is a builtins.set, which is not JSON serializable"):
        tasks.add.enqueue({1}, 2)
    assert not Job.objects.exists()


@needs_django_6
def test_a_task_a_worker_could_not_find_by_its_module_path_is_refused():
    with pytest.raises(InvalidTask, match="_not_under_its_own_name' is not this task"):
        tasks.renamed.enqueue()
    assert not Job.objects.exists()


@needs_django_6
def test_a_task_defined_in_main_is_refused():
    def script_task() -> None: ...

    script_task.__module__, script_task.__qualname__ = "__main__", "script_task"
    with pytest.raises(InvalidTask, match="defined in __main__"):
        django_task(script_task).enqueue()
    assert not Job.objects.exists()


@needs_django_6
def test_a_task_enqueued_receiver_that_raises_is_logged_and_the_task_stays_enqueued(caplog):
    def broken(sender, task_result, **kwargs):
        raise RuntimeError("receiver bug")

    task_enqueued.connect(broken)
    try:
        result = tasks.add.enqueue(1, 2)
    finally:
        task_enqueued.disconnect(broken)
    assert Job.objects.filter(pk=result.id).exists()
    assert "task signal receiver raised" in caplog.text


@needs_django_6
def test_a_task_whose_path_is_also_a_job_name_is_refused():
    registry.register("tests.testapp.tasks.add", lambda a, b: a - b)
    try:
        with pytest.raises(InvalidTask, match="also the name of a @job"):
            tasks.add.enqueue(1, 2)
    finally:
        registry.unregister("tests.testapp.tasks.add")
    assert not Job.objects.exists()


@needs_django_6
def test_the_task_s_job_is_in_the_admin_under_its_module_path(admin_client):
    result = tasks.add.enqueue(1, 2)
    page = admin_client.get("/admin/vellum_jobs/job/")
    assert page.status_code == 200
    assert "tests.testapp.tasks.add" in page.content.decode()
    detail = admin_client.get(f"/admin/vellum_jobs/job/{result.id}/change/")
    assert detail.status_code == 200


# -- transactions ----------------------------------------------------------------


@needs_django_6
@pytest.mark.django_db(transaction=True)
def test_a_task_enqueued_in_a_rolled_back_transaction_does_not_exist():
    with pytest.raises(RuntimeError), transaction.atomic():
        result = tasks.add.enqueue(1, 2)
        assert Job.objects.filter(pk=result.id).exists()
        raise RuntimeError("roll back")
    assert not Job.objects.exists()
    with pytest.raises(TaskResultDoesNotExist):
        tasks.add.get_result(result.id)


@needs_django_6
@pytest.mark.django_db(transaction=True)
def test_enqueue_on_commit_stores_the_task_only_when_the_transaction_commits():
    with transaction.atomic():
        transaction.on_commit(partial(tasks.add.enqueue, 1, 2))
        assert not Job.objects.exists()
    assert Job.objects.get().args == [1, 2]
    with pytest.raises(RuntimeError), transaction.atomic():
        transaction.on_commit(partial(tasks.add.enqueue, 3, 4))
        raise RuntimeError("roll back")
    assert Job.objects.count() == 1


# -- get_result ------------------------------------------------------------------


@needs_django_6
@pytest.mark.parametrize(
    "result_id", ["987654321", "abc", "", "-1", "0", "1.0", " 1", "99999999999999999999"]
)
def test_get_result_of_an_unknown_id_raises_task_result_does_not_exist(result_id):
    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result(result_id)
    with pytest.raises(TaskResultDoesNotExist):
        tasks.add.get_result(result_id)


@needs_django_6
def test_get_result_of_a_job_that_is_not_a_task_raises_task_result_does_not_exist():
    from tests.testapp import jobs

    job = jobs.add.enqueue(1, 2)
    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result(str(job.pk))


@needs_django_6
def test_get_result_through_another_task_raises_task_result_mismatch():
    result = tasks.send_mail.enqueue("ann@example.com")
    with pytest.raises(TaskResultMismatch, match=r"tests\.testapp\.tasks\.send_mail"):
        tasks.add.get_result(result.id)
    assert tasks.send_mail.get_result(result.id).id == result.id


@needs_django_6
def test_get_result_of_a_task_whose_module_is_gone_raises_import_error_naming_it():
    job = Job.objects.create(name="vanished_module.gone", task_backend="default")
    with pytest.raises(ImportError, match=rf"result {job.pk} \('vanished_module.gone'\) cannot be imported"):
        default_task_backend.get_result(str(job.pk))


@needs_django_6
@pytest.mark.django_db(transaction=True)
def test_aenqueue_and_aget_result_work_from_async_code():
    async def enqueue_and_fetch():
        result = await tasks.add.aenqueue(2, 2)
        again = await tasks.add.aget_result(result.id)
        await sync_to_async(connections.close_all)()
        return result, again

    result, again = asyncio.run(enqueue_and_fetch())
    assert again.id == result.id
    assert again.status == TaskResultStatus.READY


# -- running: every status ---------------------------------------------------------


@needs_django_6
@pytest.mark.django_db(transaction=True)
def test_a_finished_task_reports_successful_with_its_return_value_times_and_worker():
    result = tasks.add.enqueue(2, 3)
    worker = drain()
    result.refresh()
    job = Job.objects.get(pk=result.id)
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.is_finished
    assert result.return_value == 5
    assert (result.errors, result.worker_ids, result.attempts) == ([], [str(worker.id)], 1)
    assert result.started_at == result.last_attempted_at == job.started_at
    assert result.enqueued_at <= result.started_at <= result.finished_at == job.finished_at
    fetched = tasks.add.get_result(result.id)
    assert (fetched.status, fetched.return_value, fetched.worker_ids) == (
        TaskResultStatus.SUCCESSFUL,
        5,
        [str(worker.id)],
    )


@needs_django_6
@pytest.mark.django_db(transaction=True)
def test_a_running_task_reports_running_with_its_worker_and_attempt(tmp_path):
    release = tmp_path / "release"
    result = tasks.wait_for_file.enqueue(str(release))
    background = Background(threads=1)
    try:
        wait_for(lambda: Execution.objects.filter(job_id=int(result.id)).exists(), what="task start")
        result.refresh()
        assert result.status == TaskResultStatus.RUNNING
        assert result.worker_ids == [str(background.worker.id)]
        assert result.attempts == 1
        assert result.started_at is not None and result.finished_at is None
        execution = Execution.objects.get(job_id=int(result.id))
        assert (execution.attempt, execution.note) == (1, str(background.worker.id))
        release.touch()
        wait_for(lambda: tasks.wait_for_file.get_result(result.id).is_finished, what="task end")
    finally:
        background.stop()
    result.refresh()
    assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, "released")


@needs_django_6
@pytest.mark.django_db(transaction=True)
def test_a_task_that_raises_is_ready_again_then_failed_after_its_attempts_with_every_error():
    result = tasks.always_fails.enqueue()
    drain(max_jobs=1, burst=False)
    result.refresh()
    assert result.status == TaskResultStatus.READY
    assert result.attempts == 1
    assert [error.exception_class_path for error in result.errors] == ["tests.testapp.tasks.TaskBoom"]
    drain()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.is_finished and result.finished_at is not None
    assert result.attempts == 3 == Job.objects.get(pk=result.id).attempts
    assert [error.exception_class for error in result.errors] == [tasks.TaskBoom] * 3
    assert all("TaskBoom: always" in error.traceback for error in result.errors)
    assert result.started_at < result.last_attempted_at
    with pytest.raises(ValueError, match="Task failed"):
        _ = result.return_value
    job = Job.objects.get(pk=result.id)
    assert job.state == Job.State.FAILED and "TaskBoom: always" in job.error


@needs_django_6
@pytest.mark.django_db(transaction=True)
def test_max_attempts_option_1_fails_a_raising_task_at_once():
    with override_settings(TASKS={"default": {"BACKEND": BACKEND, "OPTIONS": {"MAX_ATTEMPTS": 1}}}):
        result = tasks.always_fails.enqueue()
        drain()
        result.refresh()
    assert (result.status, result.attempts, len(result.errors)) == (TaskResultStatus.FAILED, 1, 1)


@needs_django_6
@pytest.mark.django_db(transaction=True)
def test_a_retried_task_gets_its_attempt_number_in_the_context_and_succeeds():
    result = tasks.flaky.enqueue(succeed_on=2)
    worker = drain()
    executions = Execution.objects.filter(job_id=int(result.id)).order_by("id")
    assert [e.attempt for e in executions] == [1, 2]
    # The context's worker_ids include the run in progress.
    assert [e.note for e in executions] == [str(worker.id), f"{worker.id},{worker.id}"]
    result.refresh()
    assert (result.status, result.return_value, result.attempts) == (TaskResultStatus.SUCCESSFUL, 2, 2)
    assert [error.exception_class_path for error in result.errors] == ["tests.testapp.tasks.TaskBoom"]
    assert "attempt 1 fails" in result.errors[0].traceback


@needs_django_6
@pytest.mark.django_db(transaction=True)
def test_a_run_that_raised_retry_is_not_an_attempt_and_not_in_worker_ids():
    result = tasks.retries_once.enqueue()
    first = drain(max_jobs=1, burst=False)
    result.refresh()
    assert (result.status, result.attempts, result.worker_ids) == (TaskResultStatus.READY, 0, [])
    second = drain()
    assert first.id != second.id
    assert [e.attempt for e in Execution.objects.filter(job_id=int(result.id)).order_by("id")] == [1, 1]
    result.refresh()
    assert (result.status, result.return_value, result.errors) == (TaskResultStatus.SUCCESSFUL, 1, [])
    assert result.worker_ids == [str(second.id)]


@needs_django_6
def test_a_cancelled_task_is_failed_without_errors():
    result = tasks.add.enqueue(1, 2)
    assert Job.objects.get(pk=result.id).cancel()
    result.refresh()
    assert (result.status, result.is_finished, result.errors) == (TaskResultStatus.FAILED, True, [])


@needs_django_6
@pytest.mark.django_db(transaction=True)
def test_retry_from_the_admin_makes_a_failed_task_ready_with_attempts_starting_over():
    with override_settings(TASKS={"default": {"BACKEND": BACKEND, "OPTIONS": {"MAX_ATTEMPTS": 1}}}):
        result = tasks.always_fails.enqueue()
        drain()
    assert Job.objects.get(pk=result.id).retry()
    result.refresh()
    assert (result.status, result.attempts, result.worker_ids, result.errors) == (
        TaskResultStatus.READY,
        0,
        [],
        [],
    )


# -- running: what else a task can be ------------------------------------------------


@needs_django_6
@pytest.mark.django_db(transaction=True)
def test_an_async_task_runs_and_returns_its_value():
    result = tasks.async_add.enqueue(20, 22)
    drain()
    result.refresh()
    assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, 42)


@needs_django_6
@pytest.mark.django_db(transaction=True)
def test_async_tasks_run_at_once_on_the_workers_event_loop():
    results = [tasks.async_where.enqueue(0.5) for _ in range(20)]
    assert set(Job.objects.values_list("is_async", flat=True)) == {True}
    began = timezone.now()
    drain()
    for result in results:
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL, result.errors
        assert result.return_value == {"thread": "vellum-loop", "attempt": 1}
    # 20 half-second tasks one after another would take 10 s; at once, about half a second.
    spans = Job.objects.aggregate(first=Min("started_at"), last=Max("finished_at"))
    assert spans["last"] - spans["first"] < timedelta(seconds=5), (began, spans)
    assert Execution.objects.count() == 20


@needs_django_6
@pytest.mark.django_db(transaction=True)
def test_higher_priority_tasks_run_first():
    tasks.record.using(priority=-5).enqueue("low")
    tasks.record.enqueue("middle")
    tasks.record.using(priority=50).enqueue("high")
    drain()
    assert list(Execution.objects.order_by("id").values_list("note", flat=True)) == ["high", "middle", "low"]


@needs_django_6
@pytest.mark.django_db(transaction=True)
def test_run_after_keeps_the_task_ready_until_then():
    run_after = timezone.now() + timedelta(hours=1)
    result = tasks.add.using(run_after=run_after).enqueue(1, 2)
    drain()
    result.refresh()
    assert result.status == TaskResultStatus.READY
    assert Job.objects.get(pk=result.id).run_after == run_after
    assert tasks.add.get_result(result.id).task.run_after == run_after


@needs_django_6
@pytest.mark.django_db(transaction=True)
def test_a_worker_serves_a_task_s_queue_by_its_queue_name():
    result = tasks.send_mail.enqueue("ann@example.com")
    drain(queues=["default"])
    assert tasks.send_mail.get_result(result.id).status == TaskResultStatus.READY
    drain(queues=["emails"])
    assert tasks.send_mail.get_result(result.id).return_value == "sent to ann@example.com"


@needs_django_6
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("enqueue", "exception_class_path", "message"),
    [
        (
            lambda: tasks.add.enqueue(1),  # type: ignore[call-arg]
            "builtins.TypeError",
            "missing a required argument: 'b'",
        ),
        (
            lambda: tasks.returns_a_set.enqueue(),
            "builtins.TypeError",
            "the return value is a builtins.set, which is not JSON serializable",
        ),
    ],
    ids=["arguments that do not fit", "a return value that is not JSON"],
)
def test_a_task_that_cannot_be_called_or_returns_no_json_fails_at_once(
    enqueue, exception_class_path, message
):
    result = enqueue()
    drain()
    result.refresh()
    assert (result.status, result.attempts) == (TaskResultStatus.FAILED, 1)
    assert [error.exception_class_path for error in result.errors] == [exception_class_path]
    assert message in result.errors[0].traceback


@needs_django_6
@pytest.mark.django_db(transaction=True)
def test_set_progress_records_a_sync_task_s_progress():
    result = tasks.reports_progress.enqueue(3)
    drain()
    job = Job.objects.get(pk=result.id)
    assert (job.progress_done, job.progress_total, job.progress_message) == (3, 3, "step 3")


@needs_django_6
@pytest.mark.django_db(transaction=True)
def test_task_signals_fire_at_enqueue_before_each_run_and_once_at_the_end():
    seen = []

    def receiver(signal_name):
        def receive(sender, task_result, **kwargs):
            seen.append((signal_name, sender.__name__, task_result.status, task_result.attempts))

        return receive

    receivers = {
        task_enqueued: receiver("enqueued"),
        task_started: receiver("started"),
        task_finished: receiver("finished"),
    }
    for signal, receive in receivers.items():
        signal.connect(receive)
    try:
        tasks.flaky.enqueue(succeed_on=2)
        drain()
    finally:
        for signal, receive in receivers.items():
            signal.disconnect(receive)
    assert seen == [
        ("enqueued", "VellumTaskBackend", TaskResultStatus.READY, 0),
        ("started", "VellumTaskBackend", TaskResultStatus.RUNNING, 1),
        ("started", "VellumTaskBackend", TaskResultStatus.RUNNING, 2),
        ("finished", "VellumTaskBackend", TaskResultStatus.SUCCESSFUL, 2),
    ]


@needs_django_6
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("failing", "exception", "text"),
    [
        ("always_fails", "TaskBoom", "TaskBoom: always"),
        ("async_always_fails", "TaskBoom", "TaskBoom: always"),
        ("returns_a_set", "Fail", "the return value is a builtins.set, which is not JSON serializable"),
    ],
    ids=["sync", "async", "a return value that is not JSON"],
)
def test_django_s_log_line_for_a_failed_task_carries_its_traceback(caplog, failing, exception, text):
    with override_settings(TASKS={"default": {"BACKEND": BACKEND, "OPTIONS": {"MAX_ATTEMPTS": 1}}}):
        failed = getattr(tasks, failing).enqueue()
        succeeded = tasks.add.enqueue(1, 2)
        with caplog.at_level(logging.INFO, logger="django.tasks"):
            drain()
    # Django's receivers log "Task id=%s path=%s state=%s" when a task starts and when it finishes.
    finished = {
        record.args[0]: record
        for record in caplog.records
        if record.name == "django.tasks" and record.args[2] != TaskResultStatus.RUNNING
    }
    record = finished[failed.id]
    assert record.levelno == logging.ERROR and record.exc_info is not None
    assert record.exc_info[0].__name__ == exception
    logged = logging.Formatter().format(record)
    assert "Traceback (most recent call last)" in logged and text in logged
    assert finished[succeeded.id].exc_info is None


@needs_django_6
@pytest.mark.django_db(transaction=True)
def test_a_task_failed_because_its_worker_was_lost_sends_task_finished():
    result = tasks.add.enqueue(1, 2)
    lost = uuid.uuid4()
    start = timezone.now() - timedelta(minutes=5)
    Job.objects.filter(pk=result.id).update(
        state=Job.State.RUNNING,
        worker_id=lost,
        attempts=1,
        max_attempts=1,
        started_at=start,
        lease_expires_at=start,
        task_runs=[{"worker_id": str(lost), "started_at": start.isoformat()}],
    )
    finished = []

    def receive(sender, task_result, **kwargs):
        finished.append((task_result.id, task_result.status, task_result.worker_ids))

    task_finished.connect(receive)
    try:
        # Its heartbeat recovers the lapsed lease.
        beat_past_a_lease(WorkerProcess(WorkerOptions(threads=1)).heartbeat)
    finally:
        task_finished.disconnect(receive)
        connections.close_all()
    assert finished == [(result.id, TaskResultStatus.FAILED, [str(lost)])]
    # The lost run is one of the task's errors, though it raised nothing.
    (error,) = tasks.add.get_result(result.id).errors
    assert error.exception_class_path == "vellum_jobs.exceptions.WorkerLost"
    assert "worker lost: its lease expired during attempt 1 of 1" in error.traceback


# -- a real runjobs process --------------------------------------------------------


@needs_django_6
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_runjobs_imports_tasks_itself_sends_their_signals_and_hands_back_a_task_whose_module_it_lacks(
    tmp_path, monkeypatch
):
    # The module exists for this process only: the worker's sys.path lacks tmp_path.
    (tmp_path / "vanished_tasks.py").write_text(
        textwrap.dedent(
            """
            from django.tasks import task

            @task
            def gone():
                return "never"
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "vanished_tasks", raising=False)
    vanished = importlib.import_module("vanished_tasks")
    try:
        lost = vanished.gone.enqueue()
        fine = tasks.add.enqueue(2, 2)
        worker = Runjobs("--burst", "-v", "2", env={"VELLUM_TEST_RECORD_TASK_SIGNALS": "1"})
        assert worker.wait() == 0
    finally:
        sys.modules.pop("vanished_tasks", None)
    out, _ = worker.output()
    assert f"tests.testapp.tasks.add #{fine.id} done" in out
    # Code this worker does not have (an older deploy): the job waits for a
    # worker that has it, its attempt not counted (see test_rolling_deploy).
    assert f"vanished_tasks.gone #{lost.id} handed back" in out
    job = Job.objects.get(pk=lost.id)
    assert (job.state, job.attempts) == (Job.State.QUEUED, 0)
    assert "cannot run 'vanished_tasks.gone'" in job.error
    assert "No module named 'vanished_tasks'" in job.error
    lost.refresh()
    assert (lost.status, lost.errors) == (TaskResultStatus.READY, [])
    assert tasks.add.get_result(fine.id).return_value == 4
    signals_sent = Execution.objects.filter(job_id=int(fine.id)).order_by("id")
    assert [(e.note, e.attempt, e.pid) for e in signals_sent] == [
        ("started:RUNNING", 1, worker.pid),
        ("finished:SUCCESSFUL", 1, worker.pid),
    ]
