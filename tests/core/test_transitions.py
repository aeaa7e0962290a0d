"""The state machine: the fence token, and the one module that writes states."""

from __future__ import annotations

import ast
import uuid
from pathlib import Path

import pytest

from tests.support.leases import claim_for
from tests.testapp import jobs
from vellum_jobs.core import transitions
from vellum_jobs.core.attempts import Attempt
from vellum_jobs.core.models import Job
from vellum_jobs.execution import handler_run, outcome_writes, retry_policy
from vellum_jobs.store import claim

pytestmark = pytest.mark.django_db
ROOT = Path(__file__).resolve().parents[2]


def test_a_late_outcome_after_retry_and_a_new_claim_by_the_same_worker_changes_nothing():
    # The same worker times out attempt 1, an admin retries the job (attempts
    # start over), and the worker claims it again as attempt 1. The first
    # handler then returns: its token is stale although worker and attempt
    # number match the row again.
    job = jobs.exit_.using(timeout=5).enqueue()  # max_attempts=1
    worker = uuid.uuid4()
    (first,) = claim_for(worker)
    late = Attempt(first, worker)
    late_outcome = handler_run.run(late)
    outcome_writes.record_many("default", [(late, retry_policy.timed_out(first))])
    assert Job.objects.get(pk=job.pk).state == Job.State.FAILED
    assert Job.objects.get(pk=job.pk).retry()
    (second,) = claim_for(worker)
    assert (second.worker_id, second.attempts, second.claims) == (worker, 1, 2)
    outcome_writes.record_many("default", [(late, late_outcome)])
    assert late_outcome.applied is False
    row = Job.objects.get(pk=job.pk)
    assert (row.state, row.result, row.claims, row.attempts) == (Job.State.RUNNING, None, 2, 1)


def test_the_claim_counter_never_goes_back():
    job = jobs.scan.enqueue(1)
    worker = uuid.uuid4()
    counts = []
    for _ in range(3):
        (claimed,) = claim_for(worker)
        counts.append(claimed.claims)
        claim._unclaim([claimed])  # handed back by the claim: the attempt is refunded, the token is not
    row = Job.objects.get(pk=job.pk)
    assert counts == [1, 2, 3]
    assert (row.state, row.attempts, row.claims) == (Job.State.QUEUED, 0, 3)


def test_a_unique_job_the_claim_hands_back_yields_to_a_newer_one_of_its_key():
    first = jobs.scan.enqueue(1)
    (claimed,) = claim_for(uuid.uuid4())
    # Claimed, it no longer holds its "queued" key: a newer job takes it.
    newer = jobs.scan.enqueue(1, note="newer")
    assert newer.pk != first.pk
    claim._unclaim([claimed])  # PostgreSQL and MySQL do this for a key over its limit
    states = dict(Job.objects.values_list("pk", "state"))
    assert states == {first.pk: Job.State.CANCELLED, newer.pk: Job.State.QUEUED}


def test_the_states_reference_page_is_drawn_from_the_transitions_module():
    from docs._ext.reference.states import states_markdown

    assert "```{vellum-states}" in (ROOT / "docs" / "reference" / "states.md").read_text()
    assert transitions.table() in states_markdown()


def test_every_transition_is_in_the_diagram_with_each_source_and_target():
    from docs._ext.reference.states import diagram

    arrows, source = set(), ""
    for line in diagram().splitlines():
        left, rest = line.split("──", 1)
        source = left.strip() or source  # a state's later arrows leave its name out
        label, target = (part.strip(" ─") for part in rest.split("▶"))
        arrows.add((source, label, target))
    for t in transitions.TRANSITIONS:
        label = t.name + (" (fenced)" if t.fenced else "")
        for source in t.sources:
            assert (source, label, " | ".join(t.targets) or "[*]") in arrows


def test_no_module_but_transitions_writes_a_state_or_the_counters_through_the_orm():
    # A write of these columns elsewhere would be a second, forgettable copy
    # of a rule; transitions renders them (transitions.orm) for every writer.
    written = {"state", "attempts", "claims", "worker_id", "lease_expires_at"}
    offenders = []
    for path in sorted((ROOT / "vellum_jobs").rglob("*.py")):
        if path.name == "transitions.py" or "migrations" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "update":
                names = {keyword.arg for keyword in node.keywords} & written
                if names:
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} {sorted(names)}")
    assert offenders == []
