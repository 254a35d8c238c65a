"""The Daytona contract FAKE on loopback and a `daytona` provider pointed at it (the real SDK).

Every test ends by checking that the fake saw nothing the SDK's generated models do not know.
"""

from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from fleet_harness.daytona_fake import DaytonaFake
from fleet_sandbox_broker.providers.daytona.provider import DaytonaProvider, DaytonaSettings


@pytest.fixture
async def fake(tmp_path: Path) -> AsyncIterator[DaytonaFake]:
    made = await DaytonaFake(tmp_path / "fake").start()
    try:
        yield made
    finally:
        await made.close()
    assert made.violations == [], made.violations


def settings(fake: DaytonaFake, **overrides: Any) -> DaytonaSettings:
    base = DaytonaSettings(
        api_key="fake-key",
        api_url=fake.url,
        target="fake",
        replica="r1",
        snapshot="fleet-vm",
        deadline_s=10.0,
        circuit_cool_s=30.0,
    )
    return replace(base, **overrides)


@pytest.fixture
async def daytona(fake: DaytonaFake) -> AsyncIterator[DaytonaProvider]:
    made = DaytonaProvider(settings(fake))
    try:
        yield made
    finally:
        await made.close()
