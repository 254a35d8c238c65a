"""The built web UI (`ui/dist`), served by the gateway at `/` when it exists.

The UI is a single-page app: a path that names no file gets `index.html` so its router can
draw the screen. Everything the gateway itself answers (`/api`, the sockets, `/health`,
`/ready`, `/asyncapi.json`) keeps its own JSON 404s, so a wrong API path is never hidden
behind a 200 page.
"""

import os
from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse, Response

from fleet_gateway.errors import ApiError

RESERVED = ("api", "health", "ready", "asyncapi.json")


def default_dist() -> Path:
    """`FLEET_UI_DIST`, else the checkout's `ui/dist` beside the gateway's sources."""
    given = os.environ.get("FLEET_UI_DIST")
    return Path(given) if given else Path(__file__).resolve().parents[4] / "ui" / "dist"


def _not_found(path: str) -> ApiError:
    return ApiError(404, "not_found", f"no route or file at /{path}")


def mount_ui(app: FastAPI, dist: Path) -> bool:
    """Serve `dist` at `/` (last, after every API route); False when there is no build."""
    index = dist / "index.html"
    if not index.is_file():
        return False
    root = dist.resolve()

    @app.get("/{path:path}", include_in_schema=False)
    async def ui_file(path: str) -> Response:
        if path.split("/", 1)[0] in RESERVED:
            raise _not_found(path)
        wanted = (root / path).resolve()
        if not wanted.is_relative_to(root):
            raise _not_found(path)
        if wanted.is_file():
            return FileResponse(wanted)
        if path.startswith("assets/"):
            raise _not_found(path)
        return FileResponse(index, headers={"cache-control": "no-cache"})

    return True
