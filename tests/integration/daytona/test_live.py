"""Against a real Daytona: only when DAYTONA_API_KEY (with DAYTONA_API_URL, DAYTONA_TARGET) is
set; skipped with that reason otherwise, and then it has proven nothing."""

import os

import pytest

from fleet_events.sandbox import Limits, ToolCall, ToolReply
from fleet_sandbox_broker.providers.daytona.provider import DaytonaProvider, DaytonaSettings

pytestmark = pytest.mark.skipif(
    not os.environ.get("DAYTONA_API_KEY"),
    reason="DAYTONA_API_KEY is not set: no live Daytona to test against",
)


async def _no_tools(call: ToolCall) -> ToolReply:
    return ToolReply(ok=False, error="no host tools in this test")


async def test_live_create_exec_files_and_delete() -> None:
    provider = DaytonaProvider(
        DaytonaSettings(
            api_key=os.environ["DAYTONA_API_KEY"],
            api_url=os.environ.get("DAYTONA_API_URL", ""),
            target=os.environ.get("DAYTONA_TARGET", ""),
            replica="live-test",
            snapshot=os.environ.get("FLEET_SANDBOX_DAYTONA_SNAPSHOT") or None,
        )
    )
    box = await provider.create("live-1", Limits(wall_s=60))
    try:
        await box.write_file("in.txt", b"live")
        reply = await box.execute(
            context="main",
            code="x = open('in.txt').read()\nSUBMIT(x)",
            variables={},
            blobs={},
            tools=[],
            output_fields=None,
            wall_s=60,
            relay=_no_tools,
        )
        assert reply.value == {"output": "live"}
    finally:
        await box.destroy()
        await provider.close()
