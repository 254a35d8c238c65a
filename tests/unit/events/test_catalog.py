"""docs/architecture.md lists every event type of libs/events, exactly as the code defines it."""

import re
from pathlib import Path

from fleet_events.catalog import ALL_EVENTS, BY_TAG, catalog_markdown

DOC = Path(__file__).resolve().parents[3] / "docs" / "architecture.md"


def _section() -> str:
    match = re.search(
        r"<!-- event-catalog:start -->\n(.*?)\n<!-- event-catalog:end -->", DOC.read_text(), re.S
    )
    assert match, "docs/architecture.md lost its event-catalog markers"
    return match.group(1)


def test_every_event_type_is_in_the_documented_catalog() -> None:
    documented = set(re.findall(r"\| `([a-z_.]+)` \|", _section()))
    missing = sorted(set(BY_TAG) - documented)
    assert not missing, (
        f"event types missing from docs/architecture.md: {missing}; run scripts/catalog"
    )


def test_the_documented_catalog_is_current() -> None:
    assert _section() == catalog_markdown(), "the catalog is stale: run scripts/catalog"


def test_every_wire_tag_is_unique_and_explicit() -> None:
    assert len(BY_TAG) == len(ALL_EVENTS)
    for cls in ALL_EVENTS:
        assert cls.__struct_config__.frozen, cls
        assert isinstance(cls.__struct_config__.tag, str)
        assert cls.__struct_config__.tag != cls.__name__, cls
