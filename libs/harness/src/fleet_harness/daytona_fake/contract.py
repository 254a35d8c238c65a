"""What the pinned Daytona SDK knows: its routes and its models, read from its generated clients.

The fake is only worth something while it answers what the real service answers. Reading the
route table out of the SDK's own generated API modules (rather than writing it down here) means
a route the SDK does not call, or a field its models do not declare, is a contract failure the
tests see, and an SDK upgrade that moves a route breaks the fake loudly instead of silently.
"""

import importlib
import inspect
import re
from functools import cache
from typing import Any

_ROUTE = re.compile(r"method='(?P<method>[A-Z]+)',\s*resource_path='(?P<path>[^']+)'")
_CONTROL = "daytona_api_client_async"
_TOOLBOX = "daytona_toolbox_api_client_async"
_CONTROL_APIS = ("sandbox_api", "volumes_api", "config_api")
_TOOLBOX_APIS = ("file_system_api", "process_api", "git_api", "interpreter_api")


class ContractError(AssertionError):
    """The fake (or a test) used a route or a field the pinned SDK does not know."""


@cache
def sdk_routes(api: str) -> frozenset[tuple[str, str]]:
    """(method, path template) pairs of the generated client: `api` is "control" or "toolbox"."""
    package, modules = (_CONTROL, _CONTROL_APIS) if api == "control" else (_TOOLBOX, _TOOLBOX_APIS)
    routes: set[tuple[str, str]] = set()
    for name in modules:
        source = inspect.getsource(importlib.import_module(f"{package}.api.{name}"))
        routes.update((m["method"], m["path"]) for m in _ROUTE.finditer(source))
    return frozenset(routes)


def check_route(api: str, method: str, template: str) -> None:
    if (method, template) not in sdk_routes(api):
        raise ContractError(f"{method} {template} is not a route of the SDK's {api} API")


def _model(api: str, name: str) -> Any:
    package = importlib.import_module(_CONTROL if api == "control" else _TOOLBOX)
    model = getattr(package, name, None)
    if model is None:
        raise ContractError(f"the SDK's {api} API has no model {name}")
    return model


def check_body(api: str, model_name: str, body: Any) -> None:
    """`body` (JSON, or a list of it) must parse as `model_name` and carry no field it lacks.

    The generated models keep unknown keys in `additional_properties` instead of refusing
    them, so parsing alone would let an invented field through: the keys are compared too.
    """
    items = body if isinstance(body, list) else [body]
    model = _model(api, model_name)
    known = set(getattr(model, f"_{model.__name__}__properties"))
    for item in items:
        if not isinstance(item, dict):
            raise ContractError(f"{model_name} must be a JSON object, got {type(item).__name__}")
        unknown = set(item) - known
        if unknown:
            raise ContractError(f"{model_name} has no field(s) {sorted(unknown)}")
        try:
            model.from_dict(item)
        except Exception as exc:  # the generated models raise pydantic's ValidationError
            raise ContractError(f"{model_name} does not parse: {exc}") from exc
