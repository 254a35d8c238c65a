"""The reply cache is bounded by bytes (issue 8: bounded by count, 2,000 `list` answers took a
broker from 62 MB to 3 GB)."""

from fleet_mesh.rpc import ReplyCache


def test_two_thousand_large_answers_stay_within_the_byte_bound() -> None:
    cache = ReplyCache(max_bytes=8 * 1024 * 1024)
    page = b"p" * (100 * 1024)
    for n in range(2000):
        assert cache.put(f"list|t|{n}", "digest", page)
    assert cache.size <= 8 * 1024 * 1024
    assert len(cache) == cache.size // len(page)  # as many as fit, no more
    assert cache.get("list|t|1999") is not None  # the newest are kept
    assert cache.get("list|t|0") is None


def test_an_answer_too_big_to_keep_is_not_kept_and_evicts_nothing() -> None:
    cache = ReplyCache(max_bytes=1024, max_entry_bytes=512)
    assert cache.put("small", "d", b"s" * 100)
    assert not cache.put("huge", "d", b"h" * 600)
    assert cache.get("huge") is None
    assert cache.get("small") is not None


def test_a_replaced_answer_is_weighed_once() -> None:
    cache = ReplyCache(max_bytes=1024)
    for _ in range(10):
        cache.put("same", "d", b"x" * 100)
    assert cache.size == len("same") + len("d") + 100
