"""Errors at the edge: one shape for every refusal, so a client (or a person) reads what was
wrong, with which value, and what to do, and a program branches on a stable `code`.

Every route raises `ApiError` (or lets FastAPI's validation fail, which `install` turns into
the same shape); nothing else reaches the client, so an unexpected exception never leaks its
text (it may hold anything) and is answered as `internal_error` with the log line's id.
"""

import logging
import uuid
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from nats.errors import TimeoutError as NatsTimeout
from nats.js.errors import NoStreamResponseError, ServiceUnavailableError
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from fleet_mesh.blobs import BlobUnavailable
from fleet_mesh.store.errors import StoreUnavailable

log = logging.getLogger("fleet.gateway")


class ErrorBody(BaseModel):
    code: str
    message: str
    details: dict[str, Any] = {}


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        details: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.details = details or {}
        self.headers = headers or {}


def not_found(kind: str, value: str) -> ApiError:
    """Unknown and foreign ids answer alike: a 403 would confirm another tenant's id exists."""
    return ApiError(
        404,
        f"{kind}_not_found",
        f"no {kind} {value!r} in your tenant: check the id (list them with GET /api/v1/sessions)",
        details={kind: value},
    )


def respond(error: ApiError) -> JSONResponse:
    body = ErrorBody(code=error.code, message=error.message, details=error.details)
    return JSONResponse(body.model_dump(), status_code=error.status, headers=error.headers)


def _field(loc: tuple[Any, ...]) -> str:
    parts = [str(part) for part in loc if part not in ("body", "query", "path", "header")]
    return ".".join(parts) or str(loc[0] if loc else "request")


SECRET_FIELDS = frozenset({
    "api_key", "apikey", "x-api-key", "token", "access_token", "refresh_token", "secret",
    "client_secret", "password", "passwd", "credentials", "authorization",
})  # fmt: skip
"""Field names whose value is a secret (not `max_tokens`, `input_per_token` or a setting's
`key`, whose values are no one's secret)."""


def _may_be_secret(item: Mapping[str, Any]) -> bool:
    """A value the refusal must not repeat: an unknown field's text (a misspelt `api_key` is
    one; a number is no secret) or a field whose name says it holds a secret (an `api_key`
    refused as too long)."""
    if item.get("type") == "extra_forbidden" and isinstance(item.get("input"), str):
        return True
    return any(str(part).lower() in SECRET_FIELDS for part in item.get("loc", ()))


def _shown(item: Mapping[str, Any]) -> str:
    value = item.get("input")
    if _may_be_secret(item) or not (isinstance(value, str | int | float | bool) or value is None):
        return ""
    shown = repr(value)
    return shown if len(shown) <= 80 else shown[:77] + "..."


def _validation(exc: RequestValidationError) -> ApiError:
    problems = []
    for item in exc.errors():
        loc = tuple(item.get("loc", ()))
        shown = _shown(item)
        problems.append(
            {
                "field": _field(loc),
                "where": str(loc[0]) if loc else "request",
                "problem": str(item.get("msg", "invalid")),
                "value": shown,
            }
        )
    first = problems[0] if problems else {"field": "request", "problem": "invalid", "value": ""}
    value = f" (got {first['value']})" if first["value"] else ""
    message = (
        f"{first['where']} field {first['field']!r}: {first['problem']}{value}; "
        "fix it and send the request again (the OpenAPI schema at /openapi.json lists the "
        "allowed values)"
    )
    return ApiError(422, "invalid_request", message, details={"problems": problems})


def install(app: FastAPI) -> None:
    async def api_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ApiError)
        return respond(exc)

    async def invalid(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return respond(_validation(exc))

    async def http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        if exc.status_code == 404:
            error = ApiError(
                404,
                "route_not_found",
                f"no route {request.url.path!r}: the routes are listed at /openapi.json",
            )
        elif exc.status_code == 405:
            error = ApiError(
                405,
                "method_not_allowed",
                f"{request.method} is not allowed on {request.url.path!r}: see /openapi.json",
            )
        elif exc.status_code == 400 and "parsing the body" in str(exc.detail):
            # FastAPI's own answer to a body its JSON reader gave up on (malformed, or nested
            # past the reader's stack): the request's content is the problem, said as such
            error = ApiError(
                422,
                "body_unreadable",
                f"the body of {request.method} {request.url.path} is not JSON this API can "
                "read (malformed, or nested deeper than any request fleet defines); send a "
                "JSON object as /openapi.json describes",
            )
        else:
            error = ApiError(exc.status_code, "http_error", str(exc.detail))
        error.headers.update(dict(exc.headers or {}))
        return respond(error)

    async def store_unavailable(_: Request, exc: Exception) -> JSONResponse:
        log.warning("store unavailable: %s", exc)
        error = ApiError(
            503, "store_unavailable", f"the event store did not answer ({exc}); retry shortly"
        )
        error.headers["Retry-After"] = "1"
        return respond(error)

    async def too_deep(request: Request, exc: Exception) -> JSONResponse:
        # JSON nested past the reader's stack (FastAPI's body parse, an import's lines): the
        # sender's input, not the gateway's fault; nothing was stored
        log.info("request nested too deep", extra={"path": request.url.path})
        return respond(
            ApiError(
                422,
                "body_too_deep",
                f"the body of {request.method} {request.url.path} nests JSON deeper than this "
                "API accepts; send a flatter body (no request fleet defines nests more than a "
                "few levels)",
            )
        )

    async def unexpected(_: Request, exc: Exception) -> JSONResponse:
        incident = uuid.uuid4().hex
        log.exception("unhandled error", extra={"incident": incident})
        return respond(
            ApiError(
                500,
                "internal_error",
                f"the gateway failed on this request (incident {incident}); retry, and report "
                "the incident id if it persists",
                details={"incident": incident},
            )
        )

    app.add_exception_handler(ApiError, api_error)
    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(StoreUnavailable, store_unavailable)
    app.add_exception_handler(BlobUnavailable, store_unavailable)
    # JetStream unanswered (a request timed out, a publish no stream took) or saying it is
    # unavailable (503): a cluster electing a stream's leader, or NATS down. Retryable, so
    # never a 500 incident
    app.add_exception_handler(NatsTimeout, store_unavailable)
    app.add_exception_handler(NoStreamResponseError, store_unavailable)
    app.add_exception_handler(ServiceUnavailableError, store_unavailable)
    app.add_exception_handler(RecursionError, too_deep)
    app.add_exception_handler(Exception, unexpected)
