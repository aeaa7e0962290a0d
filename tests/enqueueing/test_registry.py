from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from asgiref.sync import async_to_sync
from django.core.exceptions import ImproperlyConfigured

from vellum_jobs import UnknownJob
from vellum_jobs.core import registry
from vellum_jobs.core.models import Job
from vellum_jobs.core.options import Options
from vellum_jobs.enqueueing import job_function
from vellum_jobs.enqueueing.job_function import JobFunction, job
from vellum_jobs.testing import run_jobs


@pytest.fixture
def scratch_names():
    before = set(registry.names())
    yield
    for name in set(registry.names()) - before:
        job_function.unregister(name)


def test_decorator_registers_a_callable_wrapper(scratch_names):
    @job("scratch.double", queue="media", priority=5, max_attempts=2)
    def double(x: int) -> int:
        """Twice x."""
        return 2 * x

    assert isinstance(double, JobFunction)
    assert double.name == "scratch.double"
    assert double(21) == 42
    assert double.__doc__ == "Twice x."
    assert registry.get("scratch.double") is double
    assert double.options.queue == "media"
    assert double.options.priority == 5
    assert double.options.max_attempts == 2


def test_register_returns_the_same_kind_of_wrapper(scratch_names):
    def triple(x: int) -> int:
        return 3 * x

    wrapper = job_function.register("scratch.triple", triple, queue="q")
    assert registry.get("scratch.triple") is wrapper
    assert wrapper(2) == 6


def test_names_are_sorted_and_include_autodiscovered_jobs():
    names = registry.names()
    assert names == sorted(names)
    # tests/testapp/jobs.py is imported by the app's ready(), not by this test.
    assert "test.record" in names and "test.sleep" in names


def test_unknown_name_raises_unknown_job_a_lookup_error():
    with pytest.raises(UnknownJob, match="no job registered under the name 'nope'") as info:
        registry.get("nope")
    assert isinstance(info.value, LookupError)


def test_a_second_function_under_a_taken_name_is_refused_naming_both(scratch_names):
    @job("scratch.taken")
    def first() -> None: ...

    def second() -> None: ...

    with pytest.raises(ImproperlyConfigured) as info:
        job_function.register("scratch.taken", second)
    message = str(info.value)
    assert "test_registry" in message and "first" in message and "second" in message


def test_registering_the_same_function_again_is_harmless(scratch_names):
    def same() -> None: ...

    job_function.register("scratch.same", same)
    job_function.register("scratch.same", same)
    assert registry.get("scratch.same").func is same


@pytest.mark.parametrize("priority", [-101, 101, 1.5, "1"])
def test_priority_out_of_range_is_refused_at_registration(priority, scratch_names):
    with pytest.raises(ValueError, match="priority"):
        job_function.register("scratch.prio", lambda: None, priority=priority)


@pytest.mark.parametrize(
    ("option", "value", "problem"),
    [
        ("timeout", math.nan, "timeout: nan is not a duration: it is not a number"),
        ("timeout", math.inf, "timeout: inf is not a duration: it is longer than 100 years"),
        ("backoff", math.nan, "backoff: nan is not a duration: it is not a number"),
        ("backoff", math.inf, "backoff: inf is not a duration: it is longer than 100 years"),
        ("backoff", 1e12, "backoff: 1000000000000.0 is not a duration: it is longer than 100 years"),
        (
            "backoff",
            timedelta.max,
            f"backoff: {timedelta.max!r} is not a duration: it is longer than 100 years",
        ),
        ("backoff", -1, "backoff: -1 is not a duration: it is negative"),
    ],
)
def test_a_timeout_or_backoff_that_is_not_a_number_or_too_long_is_refused_when_decorated(
    option, value, problem, scratch_names
):
    with pytest.raises(ValueError, match=f"^{re.escape(problem)}"):

        @job("scratch.bounded", **{option: value})
        def bounded() -> None: ...

    assert "scratch.bounded" not in registry.names()


def test_using_returns_a_bound_copy(scratch_names):
    @job("scratch.bound", queue="a", priority=1)
    def bound() -> None: ...

    copy = bound.using(queue="b", priority=9)
    assert copy.name == "scratch.bound"
    assert (copy.options.queue, copy.options.priority) == ("b", 9)
    assert (bound.options.queue, bound.options.priority) == ("a", 1)


def test_for_job_takes_a_registered_name_first_then_asks_the_resolvers(scratch_names, monkeypatch):
    monkeypatch.setattr(registry, "_resolvers", [])
    asked = []

    def resolver(row: Job) -> JobFunction | None:
        asked.append(row.name)
        return JobFunction(row.name, lambda: "resolved", Options()) if row.name == "scratch.mine" else None

    @job("scratch.known")
    def known() -> None: ...

    registry.add_resolver(resolver)
    registry.add_resolver(resolver)  # installing twice asks once
    assert registry.for_job(Job(name="scratch.known")) is known
    assert registry.for_job(Job(name="scratch.mine")).func() == "resolved"
    with pytest.raises(UnknownJob):
        registry.for_job(Job(name="scratch.nobody"))
    assert asked == ["scratch.mine", "scratch.nobody"]


def test_a_concurrency_key_function_gets_the_arguments_it_names_with_defaults(scratch_names):
    @job("scratch.sync", concurrency_key=lambda account_id, full: f"acct:{account_id}:{full}", concurrency=3)
    def sync(account_id: int, full: bool = False, note: str = "") -> None:
        pass

    assert sync.concurrency_for([7], {}) == ("acct:7:False", 3)
    assert sync.concurrency_for([], {"account_id": 8, "full": True, "note": "x"}) == ("acct:8:True", 3)


def test_concurrency_defaults_a_key_to_the_job_name_and_a_limit_to_one(scratch_names):
    @job("scratch.report", concurrency=2)
    def report() -> None:
        pass

    @job("scratch.fixed", concurrency_key="exports")
    def fixed() -> None:
        pass

    @job("scratch.free")
    def free() -> None:
        pass

    assert report.concurrency_for([], {}) == ("scratch.report", 2)
    assert fixed.concurrency_for([], {}) == ("exports", 1)
    assert free.concurrency_for([], {}) == ("", 0)


@pytest.mark.django_db
def test_a_bad_concurrency_key_is_refused_at_enqueue_and_nothing_is_written(scratch_names):
    @job("scratch.bad_key", concurrency_key=lambda n: n)
    def bad_key(n: object) -> None:
        pass

    with pytest.raises(ValueError, match="must return a non-empty string"):
        bad_key.enqueue(5)
    with pytest.raises(ValueError, match="must return a non-empty string"):
        bad_key.enqueue("x" * 256)
    assert not Job.objects.exists()


@pytest.mark.parametrize("concurrency", [0, -1, 1.5, True, "2"])
def test_concurrency_must_be_a_positive_integer(concurrency):
    with pytest.raises(ValueError, match="concurrency must be an integer >= 1"):
        Options(concurrency=concurrency)


def test_registering_a_job_needs_neither_settings_nor_models():
    """A fresh interpreter, no settings: as early as a ``jobs.py`` module can be imported."""
    code = (
        "import sys\n"
        "from vellum_jobs import job, registry\n"
        "@job('early.bird', queue='dawn')\n"
        "def bird() -> None: ...\n"
        "assert registry.get('early.bird') is bird\n"
        "print(sorted(name for name in sys.modules if name.startswith('vellum_jobs.core.models')))\n"
    )
    env = {key: value for key, value in os.environ.items() if key != "DJANGO_SETTINGS_MODULE"}
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, check=False
    )
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.strip() == "[]"


async def fetch(url: str) -> str:
    return f"fetched {url}"


async def stream(url: str):
    yield url


def test_an_async_function_registers_as_a_coroutine_job(scratch_names):
    fetching = job("scratch.async")(fetch)
    assert fetching.is_async and registry.get("scratch.async") is fetching
    assert registry.has_coroutine_handlers()


def test_an_async_generator_is_refused_when_decorated_or_registered(scratch_names):
    refused = r"is an async generator function; a job handler is a function or an async def"
    with pytest.raises(TypeError, match=refused):
        job("scratch.async")(stream)
    with pytest.raises(TypeError, match=refused):
        job_function.register("scratch.async", stream)
    assert "scratch.async" not in registry.names()


@pytest.mark.django_db
def test_an_async_function_wrapped_in_a_sync_one_runs_in_a_worker(scratch_names):
    @job("scratch.fetch")
    def fetch_now(url: str) -> str:
        return async_to_sync(fetch)(url)

    assert fetch_now("a") == "fetched a"
    fetch_now.enqueue("b")
    [ran] = run_jobs()
    assert (ran.state, ran.result) == ("done", "fetched b")
