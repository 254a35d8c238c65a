"""The session commands' domain errors in HTTP terms: a status (and a `Retry-After` where a
retry will do) for each, the body the same `ErrorBody` every route answers with."""

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from fleet_gateway.errors import ApiError, respond
from fleet_gateway.sessions import errors as e

STATUS: dict[type[e.SessionError], int] = {
    e.SessionNotFound: 404,
    e.SessionPurged: 404,
    e.TurnNotFound: 404,
    e.SessionExists: 409,
    e.SessionIsDeleted: 409,
    e.NoActiveTurn: 409,
    e.KeyInFlight: 409,
    e.SessionNotDeleted: 409,
    e.PurgeRefused: 409,
    e.InvalidKey: 400,
    e.AdminRequired: 403,
    e.DocumentsMissing: 422,
    e.KeyReused: 422,
    e.RepositoryNotPublic: 422,
    e.TurnsOverQuota: 429,
    e.LogBusy: 503,
    e.PurgeUnavailable: 503,
    e.PurgeTimeout: 504,
}
RETRY_AFTER: dict[type[e.SessionError], str] = {
    e.LogBusy: "1",
    e.TurnsOverQuota: "2",
    e.KeyInFlight: "1",
    e.PurgeUnavailable: "5",
}


def http_error(exc: e.SessionError) -> ApiError:
    kind = type(exc)
    retry = RETRY_AFTER.get(kind)
    return ApiError(
        STATUS.get(kind, 400), exc.code, exc.message, details=exc.details,
        headers={"Retry-After": retry} if retry else None,
    )  # fmt: skip


def install(app: FastAPI) -> None:
    async def refused(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, e.SessionError)
        return respond(http_error(exc))

    app.add_exception_handler(e.SessionError, refused)
