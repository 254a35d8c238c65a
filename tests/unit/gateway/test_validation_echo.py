"""A refused body names the field and, where it is safe, the value it got: never a value that
may be a secret (a misspelt `api_key` is an unknown field; a key too long is still a key)."""

from typing import Annotated

from fastapi import Body, FastAPI
from fastapi.testclient import TestClient

from fleet_gateway import errors
from fleet_gateway.routes.llm_profiles import MAX_KEY_CHARS, ProfileIn

PLANTED = "sk-planted-" + "7a1b2c" * 6


def _client() -> TestClient:
    app = FastAPI()
    errors.install(app)

    @app.post("/profiles")
    async def create(body: Annotated[ProfileIn, Body()]) -> dict[str, str]:
        return {"name": body.name}

    return TestClient(app)


def _refused(body: dict[str, object]) -> str:
    response = _client().post("/profiles", json=body)
    assert response.status_code == 422, response.text
    return response.text


def test_an_unknown_fields_value_is_not_echoed_but_its_name_is() -> None:
    text = _refused({"name": "ok", "model": "m", "apikey": PLANTED})
    assert "'apikey'" in text
    assert PLANTED[:12] not in text


def test_a_refused_keys_value_is_not_echoed() -> None:
    text = _refused({"name": "ok", "model": "m", "api_key": PLANTED * 100})
    assert "'api_key'" in text
    assert len(PLANTED * 100) > MAX_KEY_CHARS
    assert PLANTED[:12] not in text


def test_an_ordinary_fields_value_is_still_named() -> None:
    text = _refused({"name": "ok", "model": "m", "temperature": 9})
    assert "'temperature'" in text
    assert "(got 9)" in text


def test_the_secret_rule_names_secrets_only() -> None:
    names = ("api_key", "apikey", "x-api-key", "token", "Authorization", "max_tokens", "key",
             "model", "tokens_in", "input_per_token")  # fmt: skip
    named = [name for name in names if name.lower() in errors.SECRET_FIELDS]
    assert named == ["api_key", "apikey", "x-api-key", "token", "Authorization"]
