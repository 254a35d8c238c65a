"""What the runtime-surface routes share: the gateway's version and its bus connection."""

from importlib import metadata
from typing import Any

from fastapi import Request

from fleet_gateway.errors import ApiError


def version() -> str:
    try:
        return metadata.version("fleet-gateway")
    except metadata.PackageNotFoundError:  # run from a tree without its metadata
        return "0+unknown"


def nats(request: Request) -> Any:
    nc = request.app.state.gateway.nc
    if nc is None or not nc.is_connected:
        raise ApiError(503, "nats_unavailable", "the gateway has no bus connection; retry shortly")
    return nc
