"""Settings live in the config KV; environment variables only seed it."""

import pytest
from nats.js import JetStreamContext

from fleet_events import new_id, streams
from fleet_events.config import InvalidSetting, global_key
from fleet_mesh import kvscan
from fleet_mesh.bootstrap import bootstrap
from fleet_mesh.runtime_config import RuntimeConfig


async def _clear(js: JetStreamContext, key: str) -> None:
    kv = await js.key_value(streams.CONFIG.bucket)
    await kv.purge(global_key(key))


async def test_env_seeds_only_an_empty_bucket_and_tenants_override(js: JetStreamContext) -> None:
    await _clear(js, "rlm_child_fork_fallback")
    config = await RuntimeConfig.open(js)
    assert await config.get("rlm_child_fork_fallback") == "clean"  # built-in default

    report = await bootstrap(js, env={"RLM_CHILD_FORK_FALLBACK": "none"})
    assert "rlm_child_fork_fallback" in report.seeded
    assert await config.get("rlm_child_fork_fallback") == "none"

    again = await bootstrap(js, env={"RLM_CHILD_FORK_FALLBACK": "clean"})
    assert "rlm_child_fork_fallback" not in again.seeded  # a stored value is never clobbered
    assert await config.get("rlm_child_fork_fallback") == "none"

    tenant = new_id()
    await config.set("rlm_child_fork_fallback", "clean", tenant=tenant)
    assert await config.get("rlm_child_fork_fallback", tenant=tenant) == "clean"
    assert await config.get("rlm_child_fork_fallback", tenant="someone-else") == "none"
    await _clear(js, "rlm_child_fork_fallback")


async def test_bad_values_are_refused_with_the_allowed_ones(js: JetStreamContext) -> None:
    config = await RuntimeConfig.open(js)
    with pytest.raises(InvalidSetting, match="cannot be 'sometimes': use one of auto, context"):
        await config.set("rlm_child_isolation_mode", "sometimes")
    with pytest.raises(InvalidSetting, match="must be a non-negative integer, got '-3'"):
        await config.set("sandbox_warm_pool_size", "-3")
    with pytest.raises(InvalidSetting, match="unknown setting 'colour'"):
        await config.get("colour")
    with pytest.raises(InvalidSetting, match="RLM_CHILD_ISOLATION_MODE"):
        await bootstrap(js, env={"RLM_CHILD_ISOLATION_MODE": "fork-always"})


async def test_every_change_is_kept_in_history(js: JetStreamContext) -> None:
    config = await RuntimeConfig.open(js)
    tenant = new_id()
    for size in ("1", "4", "8"):
        await config.set("sandbox_warm_pool_size", size, tenant=tenant)
    history = await kvscan.history(
        js, streams.CONFIG.bucket, f"tenant.{tenant}.sandbox_warm_pool_size"
    )
    assert [entry.value for entry in history] == [b"1", b"4", b"8"]
    assert await config.get_int("sandbox_warm_pool_size", tenant=tenant) == 8
