"""What the gateway answers when JetStream does not answer: a retryable 503, never a 500
incident (a cluster electing a stream's leader answers nothing for seconds)."""

from fastapi import FastAPI
from fastapi.testclient import TestClient
from nats.errors import TimeoutError as NatsTimeout
from nats.js.errors import NoStreamResponseError, ServiceUnavailableError

from fleet_gateway import errors


def app_raising(exc: Exception) -> TestClient:
    app = FastAPI()
    errors.install(app)

    @app.post("/thing")
    async def thing() -> None:
        raise exc

    return TestClient(app, raise_server_exceptions=False)


def test_a_jetstream_request_unanswered_or_unavailable_is_a_503_saying_retry() -> None:
    unavailable = ServiceUnavailableError(code=503, description="unavailable")
    for exc in (NatsTimeout(), NoStreamResponseError(), unavailable):
        response = app_raising(exc).post("/thing")
        assert response.status_code == 503, response.text
        assert response.json()["code"] == "store_unavailable"
        assert "retry shortly" in response.json()["message"]
        assert response.headers["Retry-After"] == "1"


def test_anything_else_is_still_an_incident() -> None:
    response = app_raising(KeyError("x")).post("/thing")
    assert response.status_code == 500
    assert response.json()["code"] == "internal_error"
