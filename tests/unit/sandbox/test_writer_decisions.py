"""The broker writer's decisions on a sandbox's own subject, and the events that were built
outside domain.py before the decider kernel (refused creates, archives)."""

import pytest

from fleet_events import sandbox as sb
from fleet_sandbox_broker import domain

EVENT = domain.deleted("s", "done")


def test_a_record_is_stored_after_whatever_the_subject_holds() -> None:
    for seq in (0, 7):
        decided = domain.decide(domain.SandboxLog(seq), domain.Record(EVENT))
        assert decided.events == (EVENT,)
        assert decided.recorded


@pytest.mark.parametrize(
    ("at", "seen", "recorded"),
    [
        (7, 7, True),  # still where the view saw it: this replica takes it over
        (8, 7, False),  # moved since: another replica claimed it first
        (6, 7, False),
        (7, None, True),  # the view has no head for it: nothing to compare with
    ],
)
def test_a_claim_is_stored_only_where_the_view_saw_the_subject(
    at: int, seen: int | None, recorded: bool
) -> None:
    decided = domain.decide(domain.SandboxLog(at), domain.Claim(seen, EVENT))
    assert decided.recorded is recorded
    assert decided.events == ((EVENT,) if recorded else ())


def test_the_log_fold_keeps_where_the_subject_ends() -> None:
    log = domain.SandboxLog()
    assert domain.evolve_log(log, 12) is log
    assert log.seq == 12


def test_refusals_and_archives_are_built_field_by_field() -> None:
    refused = domain.create_refused("s", "daytona", "not configured", {"k": "v"}, 3)
    assert refused == sb.CreateRefused(
        sandbox="s", provider="daytona", reason="not configured", labels={"k": "v"}, unrecorded=3
    )
    assert domain.archive_refused("s", "local", "cannot") == sb.ArchiveRefused(
        sandbox="s", provider="local", reason="cannot"
    )
    assert domain.archived("s", "daytona", "idle") == sb.SandboxArchived(
        sandbox="s", provider="daytona", reason="idle"
    )
