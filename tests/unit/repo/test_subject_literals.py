"""Subjects are spelled and parsed only by the vocabulary (`fleet_events.subjects`, the bus
catalog and the contexts' builders): a subject written as a string elsewhere drifts from the
catalog the docs are generated from, and a subject split on "." by hand reads tokens by a
position the next shape moves."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
TREES = ("libs", "apps", "services")
VOCABULARY = Path("libs/events/src/fleet_events")

SPACES = "session|sandbox|budget|quality|work|rpc|callback|live"
LITERAL = re.compile(rf"""(?<![\w.])[rbfuRBFU]{{0,2}}(["'])fleet\.(?:{SPACES})(?:[.'"{{]|\1)""")
LOGGER = re.compile(r"getLogger\(")
HAND_PARSE = re.compile(r"""subject[\w.\[\]]*\.r?split\(\s*(["'])\.\1""")

STILL_TO_CONVERT: dict[str, str] = {
    # path (from the repository root): why it still spells or splits a subject by hand.
    "services/gateway/src/fleet_gateway/projections/fold.py": "gateway refit in flight",
    "services/gateway/src/fleet_gateway/projections/projector.py": "gateway refit in flight",
    "services/gateway/src/fleet_gateway/routes/transfer.py": "gateway refit in flight",
    "services/gateway/src/fleet_gateway/traces/export.py": "gateway refit in flight",
    "services/gateway/src/fleet_gateway/traces/reading.py": "gateway refit in flight",
}
"""Files waiting for their owner's refit; each entry is a debt with its reason. Empty: none."""


def _sources() -> list[Path]:
    found = []
    for tree in TREES:
        for path in sorted((ROOT / tree).rglob("*.py")):
            relative = path.relative_to(ROOT)
            if "tests" in relative.parts or relative.is_relative_to(VOCABULARY):
                continue
            found.append(relative)
    return found


def offenders(pattern: re.Pattern[str], *, skip: re.Pattern[str] | None = None) -> list[str]:
    lines = []
    for relative in _sources():
        if str(relative) in STILL_TO_CONVERT:
            continue
        for number, line in enumerate((ROOT / relative).read_text().splitlines(), 1):
            if pattern.search(line) and not (skip and skip.search(line)):
                lines.append(f"{relative}:{number}: {line.strip()}")
    return lines


def test_no_subject_is_spelled_outside_the_vocabulary() -> None:
    found = offenders(LITERAL, skip=LOGGER)
    assert not found, (
        "subjects spelled as string literals outside fleet_events (build them with "
        "fleet_events.subjects / the contexts' builders / fleet_events.bus):\n" + "\n".join(found)
    )


def test_no_subject_is_split_by_hand() -> None:
    found = offenders(HAND_PARSE)
    assert not found, (
        "subjects split on '.' outside fleet_events (parse them with "
        "fleet_events.subjects.parse_session / Pattern.parse):\n" + "\n".join(found)
    )


def test_the_checks_catch_what_they_are_for() -> None:
    # the shapes the tree had before the catalog parsed subjects both ways
    assert LITERAL.search('SESSIONS_FILTER = "fleet.session.>"')
    assert LITERAL.search("subject = f\"fleet.session.{check_id('tenant', t)}.*.run.{r}\"")
    assert LITERAL.search('    "fleet.rpc.budget.open (the agent opens one tree per turn)"')
    assert not LITERAL.search('log = logging.getLogger("fleet.gateway")')
    assert not LITERAL.search('span.attributes["fleet.run.id"] = run')
    assert HAND_PARSE.search('first = bundle.events[0].subject.split(".")[:4]')
    assert HAND_PARSE.search('parts = subject.split(".")')
    assert not HAND_PARSE.search('stem = path.name.rsplit(".", 1)[0]')


def test_every_allowed_file_still_exists() -> None:
    gone = [path for path in STILL_TO_CONVERT if not (ROOT / path).exists()]
    assert not gone, f"remove these from STILL_TO_CONVERT: {gone}"
