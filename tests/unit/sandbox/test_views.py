"""What the log says about sandboxes (list, reaping), folded without I/O."""

from fleet_events import sandbox as sb
from fleet_sandbox_broker import domain


def fold(*events: object) -> dict[str, domain.SandboxView]:
    views: dict[str, domain.SandboxView] = {}
    for event in events:
        domain.evolve(views, "t1", event)  # type: ignore[arg-type]
    return views


CREATED = sb.SandboxCreated(
    sandbox="p", provider="local", replica="r1", workspace="/w/p", volume="v",
    volume_subpath="s1", labels={"session": "s1", "role": "session"},
)  # fmt: skip
FORKED = sb.SandboxForked(
    sandbox="c", parent="p", provider="local", replica="r1", workspace="/w/c",
    labels={"session": "s1", "role": "child", "parent": "p"},
)  # fmt: skip


def test_a_fold_tracks_contexts_stops_revivals_and_deletes() -> None:
    views = fold(
        CREATED,
        sb.ContextOpened(sandbox="p", context="a"),
        sb.ContextOpened(sandbox="p", context="b"),
        sb.ContextClosed(sandbox="p", context="a"),
        FORKED,
    )
    assert views["p"].contexts == ("b",)
    assert views["p"].spec.volume_subpath == "s1"
    assert views["c"].parent == "p"
    views = fold(CREATED, sb.LimitExceeded(sandbox="p", limit="wall_time", detail="too long"))
    assert (views["p"].status, views["p"].stopped_reason) == ("stopped", "too long")
    views = fold(
        CREATED,
        sb.LimitExceeded(sandbox="p", limit="exited", detail="broker stopped"),
        sb.SandboxReplaced(sandbox="p", replaced="p", reason="revived"),
    )
    assert views["p"].status == "running"
    assert fold(CREATED, sb.SandboxDeleted(sandbox="p"))["p"].status == "deleted"


def test_reaping_after_a_restart_spares_session_sandboxes() -> None:
    views = fold(CREATED, FORKED)
    assert domain.to_reap(views["c"])
    assert not domain.to_reap(views["p"])
    assert not domain.to_reap(views["p"], run_finished=True)
    task = fold(
        sb.SandboxCreated(
            sandbox="t", provider="local", replica="r1", workspace="/w/t",
            labels={"session": "s1", "run": "r", "role": "task"},
        )
    )["t"]  # fmt: skip
    assert not domain.to_reap(task)
    assert domain.to_reap(task, run_finished=True)
