"""A sandbox's Limits as Daytona resources, seen by the contract FAKE in the create request."""

from fleet_events.sandbox import Limits
from fleet_harness.daytona_fake import DaytonaFake
from fleet_sandbox_broker.providers.daytona.provider import DaytonaProvider

from .conftest import settings


async def test_an_image_sandbox_gets_cpu_memory_and_disk_from_its_limits(
    fake: DaytonaFake,
) -> None:
    provider = DaytonaProvider(settings(fake, image="python:3.12-slim", cpu=2, disk_gb=4))
    try:
        small = await provider.create("sb-small", Limits(memory_mb=512, file_mb=100))
        big = await provider.create("sb-big", Limits(memory_mb=3000, file_mb=9 * 1024))
        dtos = {box.dto["labels"]["fleet-rlm/sandbox"]: box.dto for box in fake.sandboxes.values()}
        # memory rounded up to whole GiB; disk at least the largest file a cell may write
        assert {k: dtos["sb-small"][k] for k in ("cpu", "memory", "disk")} == {
            "cpu": 2, "memory": 1, "disk": 4,
        }  # fmt: skip
        assert {k: dtos["sb-big"][k] for k in ("cpu", "memory", "disk")} == {
            "cpu": 2, "memory": 3, "disk": 9,
        }  # fmt: skip
        assert dtos["sb-big"]["snapshot"] is None  # built from the image, not a snapshot
        await small.destroy()
        await big.destroy()
    finally:
        await provider.close()


async def test_a_snapshot_sandbox_keeps_the_snapshots_resources(
    fake: DaytonaFake, daytona: DaytonaProvider
) -> None:
    """The SDK sends no resources with a snapshot: its sandboxes have the snapshot's."""
    box = await daytona.create("sb-snap", Limits(memory_mb=8192))
    (dto,) = [
        b.dto for b in fake.sandboxes.values() if b.dto["labels"]["fleet-rlm/sandbox"] == "sb-snap"
    ]
    assert dto["snapshot"] == "fleet-vm"
    assert dto["memory"] == 1  # the fake's default for a snapshot, not 8 GiB
    await box.destroy()
