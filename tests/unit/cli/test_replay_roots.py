"""Which recorded runs `fleet replay` starts from a fresh sandbox: every run with cells that no
cell started. The chat agent's root records no cell (its RLM is a child run it started itself),
the engine's root does; a `sub_rlm` child is replayed by its parent's cell, never on its own."""

from fleet_cli.replay import RunRecord, SessionRecord
from fleet_events import journal as jr


def cell(cell_id: str) -> jr.RecordedCell:
    return jr.RecordedCell(
        cell_id=cell_id, position=1, code="x = 1", stdout="", stdout_blob=None, error="",
        final=None, value=None, outcome="result", iteration=1, context="c", sandbox="s",
    )  # fmt: skip


def run(name: str, parent: str | None, cells: int) -> RunRecord:
    journal = jr.Journal(cells=[cell(f"{name}-c{i}") for i in range(cells)])
    return RunRecord(name, "t", "s", parent, "turn", journal)


def roots(*runs: RunRecord) -> list[str]:
    return [r.run for r in SessionRecord({r.run: r for r in runs}, {}).roots]


def test_the_engines_root_is_the_only_root_its_sub_rlm_children_are_not() -> None:
    assert roots(run("root", None, 3), run("kid", "root", 2), run("grandkid", "kid", 2)) == ["root"]


def test_the_chat_agents_rlm_child_is_a_root_when_the_chat_root_ran_no_cell() -> None:
    found = roots(
        run("chat", None, 0), run("rlm", "chat", 3), run("kid", "rlm", 2),
        run("second", "chat", 1),
    )  # fmt: skip
    assert found == ["rlm", "second"]


def test_a_run_whose_parent_is_not_in_the_export_is_a_root_and_no_run_is_empty() -> None:
    assert roots(run("orphan", "gone", 1), run("idle", None, 0)) == ["orphan"]
    # a (corrupt) parent loop ends the walk: no cell started `a`
    assert roots(run("a", "b", 1), run("b", "a", 0)) == ["a"]


def test_the_replays_scratch_mounts_are_found_deepest_first() -> None:
    from pathlib import Path

    from fleet_cli.replay import mounts_under

    info = "\n".join(
        [
            "22 1 8:1 / / rw - ext4 /dev/sda1 rw",
            "90 22 7:3 / /tmp/fleet-replay-x/sandboxes/.families/f1 rw - ext4 /dev/loop3 rw",
            "91 90 7:4 / /tmp/fleet-replay-x/sandboxes/.families/f1/inner rw - ext4 /dev/loop4 rw",
            "92 22 7:5 / /tmp/fleet-replay-xy/other rw - ext4 /dev/loop5 rw",
        ]
    )
    assert mounts_under(Path("/tmp/fleet-replay-x"), info) == [
        "/tmp/fleet-replay-x/sandboxes/.families/f1/inner",
        "/tmp/fleet-replay-x/sandboxes/.families/f1",
    ]  # a sibling directory sharing the prefix is not ours
