"""A server older than 2.12 would ignore our concurrency headers: refuse it, clearly."""

from types import SimpleNamespace
from typing import Any, cast
from urllib.parse import urlparse

import pytest

from fleet_mesh.connection import ServerTooOld, require_server_version


def _client(major: int, minor: int, patch: int) -> Any:
    version = SimpleNamespace(major=major, minor=minor, patch=patch)
    url = urlparse("nats://user:pw@x:4222")
    return cast(Any, SimpleNamespace(connected_server_version=version, connected_url=url))


def test_old_servers_are_refused_with_the_version_found_and_needed() -> None:
    with pytest.raises(
        ServerTooOld, match=r"nats-server 2\.9\.10 at x:4222 is too old.* needs >= 2\.12\.0"
    ):
        require_server_version(_client(2, 9, 10))


@pytest.mark.parametrize("version", [(2, 12, 0), (2, 15, 1), (3, 0, 0)])
def test_current_servers_are_accepted(version: tuple[int, int, int]) -> None:
    require_server_version(_client(*version))
