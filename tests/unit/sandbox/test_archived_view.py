"""An archived sandbox in the broker's fold: stopped with the reason, never taken over at a
restart, running again once revived in place."""

from fleet_events import sandbox as sb
from fleet_sandbox_broker import domain

CREATED = sb.SandboxCreated(
    sandbox="p", provider="daytona", replica="r1", workspace="/home/daytona/w",
    labels={"session": "s1", "role": "session"},
)  # fmt: skip


def fold(*events: object) -> dict[str, domain.SandboxView]:
    views: dict[str, domain.SandboxView] = {}
    for event in events:
        domain.evolve(views, "t1", event)  # type: ignore[arg-type]
    return views


def test_an_archived_sandbox_is_stopped_and_left_alone_at_a_restart() -> None:
    views = fold(CREATED, sb.ContextOpened(sandbox="p", context="a"),
                 sb.SandboxArchived(sandbox="p", provider="daytona", reason="by bob"))  # fmt: skip
    view = views["p"]
    assert (view.status, view.stopped_reason, view.archived) == (
        "stopped",
        "archived: by bob",
        True,
    )
    assert view.contexts == ()
    assert not domain.orphaned(view, "r2", lambda _: True)
    stopped = fold(CREATED, sb.LimitExceeded(sandbox="p", limit="exited", detail="gone"))["p"]
    assert domain.orphaned(stopped, "r2", lambda _: True)  # a stopped one is still taken over
    plain = fold(CREATED, sb.SandboxArchived(sandbox="p", provider="daytona"))["p"]
    assert plain.stopped_reason == "archived"


def test_a_revival_in_place_clears_the_archive() -> None:
    views = fold(
        CREATED,
        sb.SandboxArchived(sandbox="p", provider="daytona"),
        sb.SandboxReplaced(sandbox="p", replaced="p", reason="revived", replica="r2"),
    )
    assert (views["p"].status, views["p"].archived, views["p"].replica) == ("running", False, "r2")


def test_a_refused_archive_changes_nothing() -> None:
    before = fold(CREATED)["p"]
    after = fold(CREATED, sb.ArchiveRefused(sandbox="p", provider="local", reason="cannot"))["p"]
    assert after == before
