"""A FAKE of Daytona (control API, toolbox API, interpreter socket) for the pinned SDK.

Named a fake everywhere it appears: it stands in for a service that cannot run here, and is
held to the SDK's generated clients so it cannot drift into answering what Daytona would not.
"""

from fleet_harness.daytona_fake.contract import ContractError, check_body, check_route, sdk_routes
from fleet_harness.daytona_fake.server import DaytonaFake
from fleet_harness.daytona_fake.thread import fake_in_thread

__all__ = [
    "ContractError",
    "DaytonaFake",
    "check_body",
    "check_route",
    "fake_in_thread",
    "sdk_routes",
]
