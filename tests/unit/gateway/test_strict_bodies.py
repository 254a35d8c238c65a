"""Every JSON request body refuses a field it does not know: a misspelt option
(`temprature`, `api_bsae`) must be a 422 naming it, never a silent default."""

from typing import Any

from fleet_gateway.app import create_app


def _refs(schema: dict[str, Any]) -> list[str]:
    """The component names a body schema points at (directly, or as one of `anyOf`: an
    optional body is `anyOf: [model, null]`)."""
    if "$ref" in schema:
        return [schema["$ref"].rsplit("/", 1)[-1]]
    return [name for part in schema.get("anyOf", []) for name in _refs(part)]


def _json_bodies() -> dict[str, list[str]]:
    spec = create_app().openapi()
    found: dict[str, list[str]] = {}
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            content = operation.get("requestBody", {}).get("content", {})
            if "application/json" in content:
                found[f"{method.upper()} {path}"] = _refs(content["application/json"]["schema"])
    return found


def test_every_json_body_forbids_unknown_fields() -> None:
    schemas = create_app().openapi()["components"]["schemas"]
    bodies = _json_bodies()
    assert len(bodies) >= 15  # the walk found the routes
    lax = {
        route: name
        for route, names in bodies.items()
        for name in names
        if schemas[name].get("additionalProperties") is not False
    }
    assert lax == {}
