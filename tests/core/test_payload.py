from __future__ import annotations

import datetime
import decimal
import math
import re

import pytest
from django.test import override_settings

from tests.support.workers import burst
from tests.testapp import jobs
from tests.testapp.jobs import circular, nested
from tests.testapp.models import Execution
from vellum_jobs.core.models import Job
from vellum_jobs.core.payload import MAX_DEPTH, bounded_error, encode_result, normalise, normalise_call
from vellum_jobs.testing import run_jobs

LIMIT = 1000


def test_json_values_pass_unchanged():
    value = {"a": [1, 2.5, "x", True, None], "b": {"c": []}}
    assert normalise(value, "v") == value


def test_tuples_become_lists_and_keys_become_strings():
    assert normalise({"t": (1, (2, 3)), 1: "one", None: 0}, "v") == {"t": [1, [2, 3]], "1": "one", "null": 0}


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        ({1, 2}, "builtins.set"),
        (b"bytes", "builtins.bytes"),
        (datetime.datetime(2026, 1, 1), "datetime.datetime"),
        (decimal.Decimal("1.5"), "decimal.Decimal"),
        (object(), "builtins.object"),
    ],
)
def test_values_json_cannot_hold_are_refused_by_type(value, kind):
    # "is not JSON serializable", as Django's own backends say it (json.dumps' words).
    with pytest.raises(TypeError, match=rf"^v is a {kind}, which is not JSON serializable: pass str"):
        normalise(value, "v")


def test_nan_is_refused():
    with pytest.raises(TypeError, match="nan"):
        normalise(math.nan, "v")


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("text", "problem"), [("a\x00b", "a NUL character"), ("a\udc80b", "a lone surrogate")]
)
def test_text_no_database_stores_is_refused_at_enqueue_and_nothing_written(text, problem):
    with pytest.raises(TypeError, match=rf"job 'test.add': args\[1\]\['k'\] contains {problem}"):
        jobs.add.enqueue(1, {"k": text})
    with pytest.raises(TypeError, match=rf"job 'test.add': b\[0\] has a key .* contains {problem}|b\[0\]"):
        jobs.add.enqueue_many([{"a": 1, "b": [1]}, {"a": 2, "b": [{text: 1}]}])
    assert not Job.objects.exists()


def test_error_names_the_argument_and_the_job():
    with pytest.raises(
        TypeError, match=r"job 'scan': args\[1\]\['when'\] is a datetime.date, which is not JSON serializable"
    ):
        normalise_call("scan", [1, {"when": datetime.date(2026, 1, 1)}], {})
    with pytest.raises(TypeError, match=r"job 'scan': tags\[2\] is a builtins.set"):
        normalise_call("scan", [], {"tags": ["a", "b", {1}]})


def test_a_value_that_holds_itself_is_refused_naming_where():
    looped: dict[str, object] = {"a": 1}
    looped["self"] = {"again": looped}
    with pytest.raises(TypeError, match=r"^v\['self'\]\['again'\] holds itself"):
        normalise(looped, "v")
    with pytest.raises(TypeError, match=r"^v\[0\] holds itself"):
        normalise(circular(), "v")


def test_a_value_shared_by_two_places_is_not_circular():
    shared = [1, 2]
    assert normalise({"a": shared, "b": [shared, shared]}, "v") == {"a": [1, 2], "b": [[1, 2], [1, 2]]}


def test_a_value_nested_past_every_database_is_refused_naming_where():
    assert normalise(nested(MAX_DEPTH), "v") == nested(MAX_DEPTH)
    with pytest.raises(
        TypeError, match=rf"^v(\[0\]){{{MAX_DEPTH}}} is nested more than {MAX_DEPTH} levels deep"
    ):
        normalise(nested(MAX_DEPTH + 1), "v")
    with pytest.raises(TypeError, match=rf"more than {MAX_DEPTH} levels deep"):
        normalise(nested(100_000), "v")  # far past the recursion limit


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("call", "where", "problem"),
    [
        (lambda: jobs.record.enqueue(circular()), r"args\[0\]\[0\]", "holds itself"),
        (lambda: jobs.record.enqueue(value={"loop": circular()}), r"value\['loop'\]\[0\]", "holds itself"),
        (lambda: jobs.record.enqueue(nested(100_000)), r"args\[0\](\[0\])+", "is nested more than"),
        # The list of arguments is a level of its column: an argument has one fewer.
        (lambda: jobs.record.enqueue(nested(MAX_DEPTH)), r"args\[0\](\[0\])+", "is nested more than"),
        (lambda: jobs.record.enqueue(value=nested(MAX_DEPTH)), r"value(\[0\])+", "is nested more than"),
        (lambda: jobs.record.enqueue_many([(1,), (circular(),)]), r"args\[0\]\[0\]", "holds itself"),
    ],
    ids=[
        "circular",
        "circular keyword",
        "past the recursion limit",
        "past MariaDB",
        "past MariaDB keyword",
        "many",
    ],
)
def test_an_argument_json_cannot_hold_is_refused_at_enqueue_naming_it_and_nothing_written(
    call, where, problem
):
    with pytest.raises(TypeError, match=rf"^argument of job 'test.record': {where} {problem}"):
        call()
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_arguments_and_a_result_nested_as_deep_as_every_database_stores_are_kept():
    job = jobs.record.enqueue(nested(MAX_DEPTH - 1))
    keyword = jobs.record.enqueue(value=nested(MAX_DEPTH - 1))
    result = jobs.unjsonable.enqueue(str(MAX_DEPTH))
    run_jobs()
    for each in (job, keyword):
        each.refresh_from_db()
        assert (each.state, each.result, each.error) == (Job.State.DONE, nested(MAX_DEPTH - 1), "")
    result.refresh_from_db()
    assert (result.state, result.result, result.error) == (Job.State.DONE, nested(MAX_DEPTH), "")


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("how", "problem"),
    [
        ("circular", r"the return value\[0\] holds itself"),
        ("100000", rf"the return value(\[0\]){{{MAX_DEPTH}}} is nested more than {MAX_DEPTH} levels deep"),
        (str(MAX_DEPTH + 1), rf"the return value(\[0\]){{{MAX_DEPTH}}} is nested more than {MAX_DEPTH}"),
    ],
    ids=["circular", "past the recursion limit", "past MariaDB"],
)
def test_a_worker_ends_a_job_whose_result_json_cannot_hold_done_and_says_it_was_not_stored(how, problem):
    job = jobs.unjsonable.enqueue(how)
    burst(threads=1)
    job.refresh_from_db()
    assert (job.state, job.attempts, job.result) == (Job.State.DONE, 1, None)
    assert re.match(rf"result not stored: {problem}", job.error)
    assert Execution.objects.filter(job_id=job.pk).count() == 1  # run once, not again


def test_unstorable_result_is_reported_not_raised():
    assert encode_result((1, 2)) == ([1, 2], "")
    value, problem = encode_result(object())
    assert value is None
    assert "result not stored" in problem and "builtins.object" in problem


@override_settings(VELLUM_JOBS={"MAX_PAYLOAD_BYTES": 100})
def test_a_result_over_max_payload_bytes_is_reported_not_stored():
    assert encode_result(["x" * 96]) == (["x" * 96], "")  # ["..."]: exactly 100 bytes
    value, problem = encode_result(("x" * 97,))
    assert value is None
    assert problem == (
        "result not stored: the return value is 101 bytes as JSON, "
        "over the limit of 100 bytes (VELLUM_JOBS['MAX_PAYLOAD_BYTES'])"
    )


@pytest.mark.django_db
def test_a_job_whose_result_is_over_max_payload_bytes_is_done_with_no_result_and_says_why():
    big = "x" * 300
    small = jobs.record.enqueue("fits")
    job = jobs.record.enqueue(big)
    with override_settings(VELLUM_JOBS={"MAX_PAYLOAD_BYTES": 250}):  # lowered since the enqueue
        run_jobs()
    small.refresh_from_db()
    job.refresh_from_db()
    assert (small.state, small.result, small.error) == (Job.State.DONE, "fits", "")
    assert (job.state, job.result) == (Job.State.DONE, None)
    assert job.error.startswith("result not stored: the return value is 302 bytes as JSON")


@override_settings(VELLUM_JOBS={"MAX_PAYLOAD_BYTES": LIMIT})
def test_an_error_within_max_payload_bytes_is_kept_whole():
    assert bounded_error("") == ""
    assert bounded_error("x" * LIMIT) == "x" * LIMIT


def traceback_of(lines: int) -> str:
    frames = "".join(
        f'  File "step_{i}.py", line {i}, in step_{i}\n    step_{i + 1}()\n' for i in range(lines)
    )
    return f"Traceback (most recent call last):\n{frames}ValueError: the last line says what went wrong"


@override_settings(VELLUM_JOBS={"MAX_PAYLOAD_BYTES": LIMIT})
def test_an_error_over_max_payload_bytes_keeps_its_start_and_its_end_and_says_how_much_was_cut():
    text = traceback_of(500)
    bounded = bounded_error(text)
    assert len(bounded.encode()) <= LIMIT
    head, note, tail = re.split(r"\n\[\.\.\. ([\d,]+) characters cut \.\.\.\]\n", bounded)
    assert text.startswith(head) and head.startswith("Traceback (most recent call last):")
    assert text.endswith(tail) and tail.endswith("ValueError: the last line says what went wrong")
    assert len(tail) > 2 * len(head)  # the end of a traceback is the useful part
    assert int(note.replace(",", "")) == len(text) - len(head) - len(tail)
    assert len(bounded.encode()) > LIMIT - 10  # and the room is used


@override_settings(VELLUM_JOBS={"MAX_PAYLOAD_BYTES": LIMIT})
@pytest.mark.parametrize("char", ["é", "€", "😀"])
def test_an_error_cut_inside_multibyte_characters_stays_valid_text_within_the_limit(char):
    text = char * 5000
    bounded = bounded_error(text)
    assert len(bounded.encode()) <= LIMIT
    head, note, tail = re.split(r"\n\[\.\.\. ([\d,]+) characters cut \.\.\.\]\n", bounded)
    assert set(head + tail) == {char}
    assert int(note.replace(",", "")) + len(head) + len(tail) == 5000


@override_settings(VELLUM_JOBS={"MAX_PAYLOAD_BYTES": 5})
def test_an_error_over_a_limit_smaller_than_the_note_is_the_note():
    assert bounded_error("x" * 2000) == "\n[... 2,000 characters cut ...]\n"
