"""An invalid id's error: which kind, which value (shortened when long), and what is allowed."""

import pytest

from fleet_events.ids import InvalidId, check_id

RULE = (
    "use 1-64 characters from A-Z, a-z, 0-9, '_' and '-' "
    "(no '.', '*', '>', spaces or other characters)"
)


def test_the_error_names_kind_value_and_rule_and_keeps_both_for_callers() -> None:
    with pytest.raises(InvalidId) as caught:
        check_id("tree", "a b")
    assert str(caught.value) == f"invalid tree id 'a b': {RULE}"
    assert (caught.value.kind, caught.value.value) == ("tree", "a b")


def test_a_value_shown_in_full_up_to_80_characters_of_its_repr() -> None:
    fits = "." * 78  # repr adds two quotes: 80
    assert str(InvalidId("run", fits)) == f"invalid run id {fits!r}: {RULE}"


def test_a_longer_value_is_cut_to_77_characters_and_an_ellipsis() -> None:
    long = "." * 79  # repr is 81 characters
    assert str(InvalidId("run", long)) == f"invalid run id {repr(long)[:77]}...: {RULE}"
