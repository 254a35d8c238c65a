"""`/api/v1/optimization/*`: the earlier system's optimization surface (modules, datasets, GEPA
runs, comparisons, promotion drafts). The quality service that will own it is a stub, so every
route is in the schema and answers 503 `optimization_unavailable` saying so: a client learns
the surface exists and is not running here, which a 404 would hide."""

from typing import Any

from fastapi import APIRouter

from fleet_gateway.auth import CurrentPrincipal
from fleet_gateway.errors import ApiError, ErrorBody

router = APIRouter(prefix="/optimization", tags=["optimization"])
ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody},
    429: {"model": ErrorBody},
    503: {"model": ErrorBody, "description": "the quality service does not serve this yet"},
}
ROUTES = (
    ("GET", "/status"),
    ("GET", "/modules"),
    ("POST", "/run"),
    ("GET", "/runs"),
    ("POST", "/runs"),
    ("GET", "/runs/compare"),
    ("GET", "/runs/{run_id}"),
    ("GET", "/runs/{run_id}/details"),
    ("GET", "/runs/{run_id}/results"),
    ("POST", "/runs/{run_id}/promotion-drafts"),
    ("GET", "/datasets"),
    ("POST", "/datasets"),
    ("GET", "/datasets/{dataset_id}"),
    ("POST", "/transcript-datasets"),
)


async def unavailable(principal: CurrentPrincipal) -> None:
    raise ApiError(
        503, "optimization_unavailable",
        "optimization (modules, datasets, GEPA runs) is not available yet: the quality service "
        "that will run it is not built; nothing was stored. Evaluate through exported traces "
        "(POST /api/v1/sessions/{id}/trace-export) meanwhile",
        headers={"Retry-After": "3600"},
    )  # fmt: skip


for method, path in ROUTES:
    router.add_api_route(
        path, unavailable, methods=[method], responses=ERRORS, status_code=503,
        response_model=ErrorBody, name=f"optimization {method} {path}",
        summary="not available yet: 503 optimization_unavailable",
        operation_id=f"optimization_{method.lower()}_" + path.strip("/").replace("/", "_")
        .replace("{", "").replace("}", "").replace("-", "_"),
    )  # fmt: skip
