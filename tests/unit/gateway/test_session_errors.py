"""Every refusal of a session command has its own HTTP status (none falls through to a
default), and the body says the command's code, message and details unchanged."""

import pytest

from fleet_gateway.routes.session_errors import RETRY_AFTER, STATUS, http_error
from fleet_gateway.sessions import errors
from fleet_gateway.sessions.keys import check_key, key_event_id, key_turn_id


def _all(kind: type[errors.SessionError]) -> list[type[errors.SessionError]]:
    found = []
    for sub in kind.__subclasses__():
        found += [sub, *_all(sub)]
    return found


def test_every_domain_error_has_a_status() -> None:
    kinds = _all(errors.SessionError)
    assert len(kinds) >= 15
    assert set(kinds) == set(STATUS)
    assert set(RETRY_AFTER) <= set(STATUS)


def test_the_http_error_keeps_code_message_and_details() -> None:
    refused = http_error(errors.KeyReused("k-1", "t-1"))
    assert (refused.status, refused.code) == (422, "idempotency_key_reused")
    assert "'k-1'" in refused.message
    assert refused.details == {"idempotency_key": "k-1", "turn": "t-1"}
    assert refused.headers == {}
    busy = http_error(errors.LogBusy("s", 20))
    assert (busy.status, busy.headers) == (503, {"Retry-After": "1"})


def test_keys_are_checked_at_both_edges_of_their_length_and_alphabet() -> None:
    assert check_key("a", "h") == "a"
    assert check_key("~" * 255, "h") == "~" * 255
    assert check_key(" x ", "h") == " x "


@pytest.mark.parametrize(
    ("bad", "why"),
    [("", "is empty"), ("a" * 256, "256 characters"), ("é", "'é'"), ("\x7f", "'\\x7f'"),
     ("\x1f", "'\\x1f'")],
)  # fmt: skip
def test_a_bad_key_is_refused_naming_where_it_came_and_why(bad: str, why: str) -> None:
    with pytest.raises(errors.InvalidKey) as refused:
        check_key(bad, "Idempotency-Key header")
    assert refused.value.message.startswith("the Idempotency-Key header ")
    assert why in refused.value.message
    assert refused.value.details == {"field": "Idempotency-Key header"}


def test_the_event_and_turn_ids_are_scoped_hashes_never_the_key() -> None:
    ids = {key_event_id(t, s, k) for t in ("a", "b") for s in ("s1", "s2") for k in ("k", "k2")}
    assert len(ids) == 8
    assert all(len(i) == 64 for i in ids)
    assert key_event_id("a", "s1", "k") == key_event_id("a", "s1", "k")
    assert key_turn_id("a", "s1", "k") != key_event_id("a", "s1", "k")[:32]
    assert len(key_turn_id("a", "s1", "k")) == 32
    assert "my-key" not in key_event_id("a", "s1", "my-key")
