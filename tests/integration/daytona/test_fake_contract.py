"""The fake is held to the pinned SDK: routes and fields it does not know are failures."""

import aiohttp
import pytest

from fleet_harness.daytona_fake import (
    ContractError,
    DaytonaFake,
    check_body,
    check_route,
    sdk_routes,
)


def test_the_route_table_is_read_from_the_sdk() -> None:
    assert ("POST", "/sandbox/{sandboxIdOrName}/fork") in sdk_routes("control")
    assert ("GET", "/process/interpreter/execute") in sdk_routes("toolbox")
    with pytest.raises(ContractError, match="not a route"):
        check_route("control", "POST", "/sandbox/{sandboxIdOrName}/teleport")


def test_a_field_the_sdk_models_lack_is_refused() -> None:
    check_body("control", "CreateSandbox", {"labels": {"a": "b"}, "autoStopInterval": 5})
    with pytest.raises(ContractError, match=r"\['teleport'\]"):
        check_body("control", "CreateSandbox", {"labels": {}, "teleport": True})
    with pytest.raises(ContractError, match="does not parse"):
        check_body("control", "SandboxVolume", {"mountPath": "/x"})  # volumeId is required


async def test_the_fake_records_a_request_outside_the_contract(fake: DaytonaFake) -> None:
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{fake.url}/sandbox", json={"teleport": True}) as resp,
    ):
        assert resp.status == 500
    assert fake.violations == ["POST /sandbox: CreateSandbox has no field(s) ['teleport']"]
    fake.violations.clear()


async def test_the_fake_records_an_answer_outside_the_contract(fake: DaytonaFake) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{fake.url}/sandbox", json={"name": "n1"}) as resp:
            sandbox_id = (await resp.json())["id"]
        fake.sandboxes[sandbox_id].dto["invented"] = 1  # an answer Daytona would never give
        async with http.get(f"{fake.url}/sandbox/{sandbox_id}") as resp:
            assert resp.status == 500
    assert len(fake.violations) == 1
    assert "Sandbox has no field(s) ['invented']" in fake.violations[0]
    fake.violations.clear()


async def test_state_is_kept_like_the_service(fake: DaytonaFake) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{fake.url}/sandbox", json={"name": "n2"}) as resp:
            sandbox_id = (await resp.json())["id"]
        async with http.delete(f"{fake.url}/sandbox/{sandbox_id}") as resp:
            assert resp.status == 200
        async with http.get(f"{fake.url}/sandbox/{sandbox_id}") as resp:
            assert resp.status == 404
