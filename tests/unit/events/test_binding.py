"""Subject binding: an event is stored only on the one subject its names point to."""

from dataclasses import dataclass

import pytest

from fleet_events.binding import binding_problem, subject_tenant


@dataclass(frozen=True)
class Names:
    id: str = "e1"
    tenant: str = "acme"
    session: str | None = None
    run: str | None = None


LOG = "fleet.session.acme.s1.log"
RUN = "fleet.session.acme.s1.run.r1"


def test_events_naming_their_own_log_or_run_belong_there() -> None:
    assert binding_problem(LOG, Names(session="s1")) is None
    assert binding_problem(LOG, Names(session="s1", run="r1")) is None  # a run's session fact
    assert binding_problem(RUN, Names(session="s1", run="r1")) is None


def test_an_event_naming_no_session_is_refused_on_a_session_log() -> None:
    # the attack: an event without a session could be stored on, or moved to, any session's log
    problem = binding_problem(LOG, Names(session=None))
    assert problem == (
        "event e1 names no session but fleet.session.acme.s1.log belongs to session 's1': "
        "set the envelope's session to 's1'"
    )


def test_an_event_naming_no_run_is_refused_on_a_run_subject() -> None:
    problem = binding_problem(RUN, Names(session="s1", run=None))
    assert problem == (
        "event e1 names no run but fleet.session.acme.s1.run.r1 is run 'r1''s: "
        "set the envelope's run to 'r1'"
    )


@pytest.mark.parametrize(
    "subject",
    [
        "fleet.session.acme.s1.run.r1.extra",  # the attack: the run check was skipped
        "fleet.session.acme.s1.run.r2.r1",
        "fleet.session.acme.s1.log.extra",
        "fleet.session.acme.s1.logs",
        "fleet.session.acme.s1.run",
        "fleet.session.acme.s1",
        "fleet.session.acme",
    ],
)
def test_a_session_subject_is_exactly_a_log_or_a_run(subject: str) -> None:
    problem = binding_problem(subject, Names(session="s1", run="r1"))
    assert problem is not None
    assert problem.startswith(f"event e1 cannot be stored on {subject}: a session subject is ")
    assert "fleet.session.<tenant>.<session>.log or " in problem


def test_another_tenant_session_or_run_is_named_in_the_refusal() -> None:
    assert binding_problem(LOG, Names(tenant="evil", session="s1")) == (
        "event e1 names tenant 'evil' but fleet.session.acme.s1.log is 'acme''s"
    )
    assert binding_problem(LOG, Names(session="s2")) == (
        "event e1 names session 's2' but fleet.session.acme.s1.log belongs to session 's1'"
    )
    assert binding_problem(RUN, Names(session="s1", run="r2")) == (
        "event e1 names run 'r2' but fleet.session.acme.s1.run.r1 is run 'r1''s"
    )


def test_sandbox_subjects_bind_the_tenant_only() -> None:
    assert binding_problem("fleet.sandbox.acme.sb1", Names()) is None
    assert binding_problem("fleet.sandbox.acme.sb1", Names(tenant="evil")) is not None


@pytest.mark.parametrize("subject", ["fleet.sandbox.acme.sb1.extra", "fleet.sandbox.acme"])
def test_a_sandbox_subject_is_exactly_tenant_and_sandbox(subject: str) -> None:
    assert binding_problem(subject, Names()) == (
        f"event e1 cannot be stored on {subject}: a sandbox subject is "
        "fleet.sandbox.<tenant>.<sandbox>"
    )


def test_subjects_outside_tenant_spaces_bind_nothing() -> None:
    assert binding_problem("fleet.budget.tree1", Names(tenant="anyone")) is None
    assert subject_tenant("fleet.budget.tenant.acme.2026-01-01") is None


@pytest.mark.parametrize(
    ("subject", "tenant"),
    [
        ("fleet.session.acme.s1.log", "acme"),
        ("fleet.sandbox.acme.sb1", "acme"),
        ("fleet.session.acme", None),
        ("fleet.budget.acme.x", None),
        ("other.session.acme.s1", None),
    ],
)
def test_the_tenant_of_a_subject(subject: str, tenant: str | None) -> None:
    assert subject_tenant(subject) == tenant
