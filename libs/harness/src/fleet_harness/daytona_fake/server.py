"""A FAKE of Daytona for the pinned SDK (0.226.1): control API, toolbox API, interpreter socket.

No Daytona server can run here, so the provider is tested against this: the real SDK is
pointed at it with `api_url`. It keeps state the way the service does (a deleted sandbox is
gone; a parent with live forks cannot be deleted; a container-class sandbox cannot fork; a fork
copies files and no process), runs sandbox code in real processes, and injects 404/409/422/429/
5xx on any call. Every route it serves and every body it reads or writes is checked against the
SDK's generated clients (`contract.py`); a mismatch is recorded in `violations` and answered
500, so a test that looks at `violations` (every test does, through the fixture) fails.

Simplifications, on purpose: a sandbox is started the moment it is created (no `creating`
phase, so the SDK never waits on events); `archive` is accepted from `started` as well as
`stopped`; volumes are directories linked into the sandbox's tree (`subpath` honoured). The
event-dispatcher socket (`/socket.io/`) is answered 404, which the SDK handles by polling.
"""

import asyncio
import io
import json
import shutil
import subprocess
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import unquote

from aiohttp import BodyPartReader, MultipartWriter, WSMsgType, web

from fleet_harness.daytona_fake.contract import ContractError, check_body, check_route
from fleet_harness.daytona_fake.repl import Context

HOME = PurePosixPath("/home/daytona")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class Injection:
    status: int
    method: str | None
    route: str | None
    times: int
    retry_after: float | None


@dataclass
class FakeSandbox:
    dto: dict[str, Any]
    root: Path
    parent: str | None = None
    contexts: dict[str, Context] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return str(self.dto["id"])

    def resolve(self, path: str) -> Path:
        """A sandbox path on the host; `..` and absolute escapes are refused like the daemon."""
        p = PurePosixPath(path)
        full = p if p.is_absolute() else HOME / p
        if ".." in full.parts:
            raise web.HTTPBadRequest(text=json.dumps({"message": f"invalid path {path!r}"}))
        return self.root / str(full).lstrip("/")


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def _part(name: str, filename: str, content_type: str) -> dict[str, str]:
    """Headers of one download part: the daemon names the file by its path, unquoted."""
    quoted = filename.replace("\\", "\\\\").replace('"', '\\"')
    return {
        "Content-Type": content_type,
        "Content-Disposition": f'form-data; name="{name}"; filename="{quoted}"',
    }


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    body = {"statusCode": status, "message": message, "error": message}
    return web.json_response(body, status=status, headers=headers)


class DaytonaFake:
    """Start with `await DaytonaFake(state_dir).start()`; `url` is the `api_url` to give the SDK."""

    def __init__(self, state: Path, *, vm_snapshots: frozenset[str] = frozenset({"fleet-vm"})):
        self.state = state
        self.vm_snapshots = vm_snapshots
        self.sandboxes: dict[str, FakeSandbox] = {}
        self.volumes: dict[str, dict[str, Any]] = {}
        self.injections: list[Injection] = []
        self.calls: list[tuple[str, str]] = []
        self.violations: list[str] = []
        self.volume_ready_after = 0  # polls of a new volume before it is `ready`
        self._volume_polls: dict[str, int] = {}
        self._runner: web.AppRunner | None = None
        self.url = ""

    # -- test controls ------------------------------------------------------------------------

    def inject(
        self,
        status: int,
        *,
        method: str | None = None,
        route: str | None = None,
        times: int = 1,
        retry_after: float | None = None,
    ) -> None:
        """The next `times` calls matching (method, route template) answer `status`."""
        self.injections.append(Injection(status, method, route, times, retry_after))

    def count(self, method: str, route: str) -> int:
        return self.calls.count((method, route))

    def volume_dir(self, name: str) -> Path:
        """Where the volume called `name` keeps its files (tests read what sandboxes wrote)."""
        for volume in self.volumes.values():
            if volume["name"] == name:
                return self.state / "volumes" / str(volume["id"])
        raise KeyError(f"the fake has no volume named {name!r}")

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> "DaytonaFake":
        app = web.Application(client_max_size=64 * 1024 * 1024)
        control: list[tuple[str, str, Handler]] = [
            ("POST", "/sandbox", self._create),
            ("GET", "/sandbox", self._list),
            ("GET", "/sandbox/{sandboxIdOrName}", self._get),
            ("DELETE", "/sandbox/{sandboxIdOrName}", self._delete),
            ("POST", "/sandbox/{sandboxIdOrName}/fork", self._fork),
            ("POST", "/sandbox/{sandboxIdOrName}/archive", self._archive),
            ("POST", "/sandbox/{sandboxIdOrName}/stop", self._stop),
            ("PUT", "/sandbox/{sandboxIdOrName}/labels", self._labels),
            ("GET", "/sandbox/{sandboxId}/toolbox-proxy-url", self._proxy_url),
            ("POST", "/volumes", self._create_volume),
            ("GET", "/volumes/by-name/{name}", self._volume_by_name),
            ("GET", "/volumes/{volumeId}", self._get_volume),
            ("DELETE", "/volumes/{volumeId}", self._delete_volume),
        ]
        toolbox: list[tuple[str, str, Handler]] = [
            ("POST", "/files/bulk-upload", self._upload),
            ("POST", "/files/bulk-download", self._download),
            ("GET", "/files", self._list_files),
            ("POST", "/process/execute", self._execute),
            ("POST", "/git/clone", self._git_clone),
            ("POST", "/process/interpreter/context", self._create_context),
            ("GET", "/process/interpreter/context", self._list_contexts),
            ("DELETE", "/process/interpreter/context/{id}", self._delete_context),
            ("GET", "/process/interpreter/execute", self._interpret),
        ]
        for api, prefix, table in (
            ("control", "", control),
            ("toolbox", "/toolbox/{tbx}", toolbox),
        ):
            for method, template, handler in table:
                # the contract, at build time: a route the SDK does not call is never served
                check_route(api, method, template)
                app.router.add_route(
                    method, prefix + template, self._wrap(method, template, handler)
                )
        app.router.add_route("*", "/socket.io/", self._no_events)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def close(self) -> None:
        for box in self.sandboxes.values():
            for ctx in box.contexts.values():
                await ctx.close()
        if self._runner is not None:
            await self._runner.cleanup()

    def _wrap(self, method: str, template: str, handler: Handler) -> Handler:
        async def serve(request: web.Request) -> web.StreamResponse:
            self.calls.append((method, template))
            for rule in self.injections:
                if (
                    rule.times > 0
                    and rule.method in (None, method)
                    and rule.route in (None, template)
                ):
                    rule.times -= 1
                    headers = (
                        {} if rule.retry_after is None else {"Retry-After": f"{rule.retry_after:g}"}
                    )
                    return _error(rule.status, f"injected {rule.status}", headers)
            try:
                return await handler(request)
            except ContractError as exc:
                self.violations.append(f"{method} {template}: {exc}")
                return _error(500, f"contract violation: {exc}")

        return serve

    async def _no_events(self, request: web.Request) -> web.StreamResponse:
        return _error(404, "the fake serves no event socket; poll instead")

    # -- helpers ------------------------------------------------------------------------------

    async def _json(self, request: web.Request, model: str, api: str = "control") -> dict[str, Any]:
        body = await request.json() if request.can_read_body else {}
        check_body(api, model, body)
        return dict(body)

    def _reply(
        self, model: str, body: Any, api: str = "control", status: int = 200
    ) -> web.Response:
        check_body(api, model, body)
        return web.json_response(body, status=status)

    def _find(self, key: str) -> FakeSandbox:
        for box in self.sandboxes.values():
            if key in (box.id, box.dto["name"]) and box.dto["state"] != "destroyed":
                return box
        raise web.HTTPNotFound(
            text=json.dumps({"message": f"Sandbox with ID or name {key} not found"}),
            content_type="application/json",
        )

    def _box(self, request: web.Request) -> FakeSandbox:
        key = (
            request.match_info.get("tbx")
            or request.match_info.get("sandboxIdOrName")
            or request.match_info["sandboxId"]
        )
        box = self._find(key)
        if "tbx" in request.match_info and box.dto["state"] != "started":
            raise web.HTTPConflict(
                text=json.dumps({"message": f"sandbox {key} is {box.dto['state']}, not started"}),
                content_type="application/json",
            )
        return box

    def _new_dto(self, req: dict[str, Any], sandbox_id: str, vm: bool) -> dict[str, Any]:
        return {
            "id": sandbox_id,
            "organizationId": "fake-org",
            "name": req.get("name") or sandbox_id,
            "snapshot": req.get("snapshot"),
            "user": req.get("user") or "daytona",
            "env": dict(req.get("env") or {}),
            "labels": dict(req.get("labels") or {}),
            "public": bool(req.get("public", False)),
            "networkBlockAll": bool(req.get("networkBlockAll", False)),
            "kvm": bool(req.get("kvm", False)),
            "target": req.get("target") or "fake",
            "cpu": req.get("cpu") or 1,
            "gpu": req.get("gpu") or 0,
            "memory": req.get("memory") or 1,
            "disk": req.get("disk") or 3,
            "state": "started",
            "desiredState": "started",
            "autoStopInterval": req.get("autoStopInterval", 15),
            "autoArchiveInterval": req.get("autoArchiveInterval", 7 * 24 * 60),
            "autoDeleteInterval": req.get("autoDeleteInterval", -1),
            "volumes": list(req.get("volumes") or []),
            "createdAt": _now(),
            "updatedAt": _now(),
            "sandboxClass": "linux-vm" if vm else "container",
            "toolboxProxyUrl": f"{self.url}/toolbox",
        }

    def _mount(self, box: FakeSandbox) -> None:
        for mount in box.dto["volumes"]:
            volume = self.volumes.get(mount["volumeId"])
            if volume is None or volume["state"] != "ready":
                raise web.HTTPBadRequest(
                    text=json.dumps({"message": f"volume {mount['volumeId']} is not ready"}),
                    content_type="application/json",
                )
            source = self.state / "volumes" / volume["id"] / (mount.get("subpath") or "")
            source.mkdir(parents=True, exist_ok=True)
            target = box.resolve(mount["mountPath"])
            target.parent.mkdir(parents=True, exist_ok=True)
            if not target.is_symlink():
                target.symlink_to(source, target_is_directory=True)

    # -- control API --------------------------------------------------------------------------

    async def _create(self, request: web.Request) -> web.StreamResponse:
        req = await self._json(request, "CreateSandbox")
        if any(
            box.dto["name"] == req.get("name") and box.dto["state"] != "destroyed"
            for box in self.sandboxes.values()
        ):
            return _error(409, f"sandbox with name {req.get('name')} already exists")
        sandbox_id = str(uuid.uuid4())
        dto = self._new_dto(req, sandbox_id, req.get("snapshot") in self.vm_snapshots)
        box = FakeSandbox(dto, self.state / "sandboxes" / sandbox_id)
        (box.root / str(HOME).lstrip("/")).mkdir(parents=True)
        self._mount(box)
        self.sandboxes[sandbox_id] = box
        return self._reply("Sandbox", dto)

    async def _get(self, request: web.Request) -> web.StreamResponse:
        return self._reply("Sandbox", self._box(request).dto)

    async def _list(self, request: web.Request) -> web.StreamResponse:
        wanted = json.loads(request.query.get("labels") or "{}")
        items = [
            {k: v for k, v in box.dto.items() if k not in ("env", "kvm", "volumes")}
            for box in self.sandboxes.values()
            if box.dto["state"] != "destroyed" and wanted.items() <= box.dto["labels"].items()
        ]
        return self._reply("ListSandboxesResponse", {"items": items, "nextCursor": None})

    async def _delete(self, request: web.Request) -> web.StreamResponse:
        box = self._box(request)
        live = [
            b.id
            for b in self.sandboxes.values()
            if b.parent == box.id and b.dto["state"] != "destroyed"
        ]
        if live:
            return _error(409, f"sandbox {box.id} has {len(live)} live fork(s); delete them first")
        for ctx in box.contexts.values():
            await ctx.close()
        box.contexts.clear()
        box.dto["state"] = "destroyed"
        await asyncio.to_thread(shutil.rmtree, box.root, True)
        return self._reply("Sandbox", box.dto)

    async def _fork(self, request: web.Request) -> web.StreamResponse:
        box = self._box(request)
        req = await self._json(request, "ForkSandbox")
        if box.dto["sandboxClass"] != "linux-vm":
            return _error(422, "fork is only supported for linux-vm sandboxes")
        sandbox_id = str(uuid.uuid4())
        dto = {
            **json.loads(json.dumps(box.dto)),
            "id": sandbox_id,
            "name": req.get("name") or sandbox_id,
            "createdAt": _now(),
            "state": "started",
        }
        child = FakeSandbox(dto, self.state / "sandboxes" / sandbox_id, parent=box.id)
        # files, copy-on-write in the service; a copy here; links (volumes) stay links
        await asyncio.to_thread(shutil.copytree, box.root, child.root, symlinks=True)
        self.sandboxes[sandbox_id] = child
        return self._reply("Sandbox", dto)

    async def _labels(self, request: web.Request) -> web.StreamResponse:
        box = self._box(request)
        req = await self._json(request, "SandboxLabels")
        box.dto["labels"] = dict(req["labels"])
        return self._reply("SandboxLabels", {"labels": box.dto["labels"]})

    async def _stop(self, request: web.Request) -> web.StreamResponse:
        box = self._box(request)
        for ctx in box.contexts.values():
            await ctx.close()
        box.dto["state"] = "stopped"
        return web.Response(status=200)

    async def _archive(self, request: web.Request) -> web.StreamResponse:
        box = self._box(request)
        for ctx in box.contexts.values():
            await ctx.close()
        box.contexts.clear()
        box.dto["state"] = "archived"
        return self._reply("Sandbox", box.dto)

    async def _proxy_url(self, request: web.Request) -> web.StreamResponse:
        self._box(request)
        return self._reply("ToolboxProxyUrl", {"url": f"{self.url}/toolbox"})

    def _volume_dto(self, volume: dict[str, Any]) -> dict[str, Any]:
        polls = self._volume_polls.get(volume["id"], 0)
        if volume["state"] == "pending_create" and polls >= self.volume_ready_after:
            volume["state"] = "ready"
        self._volume_polls[volume["id"]] = polls + 1
        return volume

    async def _create_volume(self, request: web.Request) -> web.StreamResponse:
        req = await self._json(request, "CreateVolume")
        if any(v["name"] == req["name"] for v in self.volumes.values()):
            return _error(409, f"volume {req['name']} already exists")
        volume_id = str(uuid.uuid4())
        self.volumes[volume_id] = {
            "id": volume_id,
            "name": req["name"],
            "organizationId": "fake-org",
            "state": "pending_create",
            "createdAt": _now(),
            "updatedAt": _now(),
            "errorReason": None,
        }
        return self._reply("VolumeDto", self._volume_dto(self.volumes[volume_id]))

    async def _volume_by_name(self, request: web.Request) -> web.StreamResponse:
        for volume in self.volumes.values():
            if volume["name"] == request.match_info["name"]:
                return self._reply("VolumeDto", self._volume_dto(volume))
        return _error(404, f"volume {request.match_info['name']} not found")

    async def _get_volume(self, request: web.Request) -> web.StreamResponse:
        volume = self.volumes.get(request.match_info["volumeId"])
        if volume is None:
            return _error(404, f"volume {request.match_info['volumeId']} not found")
        return self._reply("VolumeDto", self._volume_dto(volume))

    async def _delete_volume(self, request: web.Request) -> web.StreamResponse:
        if self.volumes.pop(request.match_info["volumeId"], None) is None:
            return _error(404, f"volume {request.match_info['volumeId']} not found")
        return web.Response(status=200)

    # -- toolbox API --------------------------------------------------------------------------

    async def _upload(self, request: web.Request) -> web.StreamResponse:
        box = self._box(request)
        reader = await request.multipart()
        while (part := await reader.next()) is not None:
            if not isinstance(part, BodyPartReader):
                raise ContractError("bulk-upload is a flat multipart form, not a nested one")
            name = part.name or ""
            if name.endswith(".file"):
                # the SDK puts the destination in the part's filename (form-encoded by aiohttp)
                target = box.resolve(unquote(part.filename or ""))
                data = await part.read()
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(bytes(data))
            elif not name.endswith(".path"):
                raise ContractError(
                    f"bulk-upload part {name!r} is not files[i].path or files[i].file"
                )
        return web.Response(status=200)

    async def _download(self, request: web.Request) -> web.StreamResponse:
        box = self._box(request)
        req = await self._json(request, "FilesDownloadRequest", "toolbox")
        with_parts = MultipartWriter("form-data")
        for path in req["paths"]:
            target = box.resolve(path)
            if target.is_file():
                # a stream, not bytes: aiohttp warns (an error under the tests' filters) on a
                # large body given as bytes
                with_parts.append(
                    io.BytesIO(target.read_bytes()),
                    _part("file", path, "application/octet-stream"),
                )
            else:
                body = json.dumps({"message": f"file not found: {path}", "statusCode": 404})
                with_parts.append(body, _part("error", path, "application/json"))
        response = web.Response(body=with_parts)
        response.headers["Content-Type"] = f"multipart/form-data; boundary={with_parts.boundary}"
        return response

    async def _list_files(self, request: web.Request) -> web.StreamResponse:
        box = self._box(request)
        folder = box.resolve(request.query.get("path") or str(HOME))
        if not folder.is_dir():
            return _error(404, f"directory not found: {request.query.get('path')}")
        entries = []
        for entry in sorted(folder.iterdir()):
            st = entry.lstat()
            stamp = datetime.fromtimestamp(st.st_mtime, UTC).isoformat()
            entries.append(
                {
                    "group": "daytona",
                    "isDir": entry.is_dir(),
                    "modTime": stamp,
                    "mode": oct(st.st_mode),
                    "modifiedAt": stamp,
                    "name": entry.name,
                    "owner": "daytona",
                    "permissions": oct(st.st_mode & 0o777),
                    "size": st.st_size,
                }
            )
        return self._reply("FileInfo", entries, "toolbox")

    def _env(self, box: FakeSandbox, extra: dict[str, str] | None = None) -> dict[str, str]:
        """What a process in the sandbox sees: the sandbox's env only, never the test host's."""
        return {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": str(box.resolve(str(HOME))),
            **box.dto["env"],
            **(extra or {}),
        }

    async def _execute(self, request: web.Request) -> web.StreamResponse:
        box = self._box(request)
        req = await self._json(request, "ExecuteRequest", "toolbox")
        cwd = box.resolve(req.get("cwd") or str(HOME))
        try:
            done = await asyncio.to_thread(
                subprocess.run,
                ["sh", "-c", req["command"]],
                cwd=cwd,
                env=self._env(box, req.get("envs")),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                timeout=req.get("timeout") or None,
            )
        except subprocess.TimeoutExpired:
            return _error(408, "command timed out")
        return self._reply(
            "ExecuteResponse",
            {"exitCode": done.returncode, "result": done.stdout.decode(errors="replace")},
            "toolbox",
        )

    async def _git_clone(self, request: web.Request) -> web.StreamResponse:
        box = self._box(request)
        req = await self._json(request, "GitCloneRequest", "toolbox")
        target = box.resolve(req["path"])
        argv = ["git", "clone", "--quiet"] + (
            ["--branch", req["branch"]] if req.get("branch") else []
        )
        done = await asyncio.to_thread(
            subprocess.run, [*argv, "--", req["url"], str(target)], capture_output=True
        )
        if done.returncode == 0 and req.get("commit_id"):  # the toolbox model says snake_case
            done = await asyncio.to_thread(
                subprocess.run,
                ["git", "-C", str(target), "checkout", "--quiet", req["commit_id"]],
                capture_output=True,
            )
        if done.returncode != 0:
            return _error(404, "repository or ref not found")
        return web.Response(status=200)

    def _context_dto(self, ctx: Context) -> dict[str, Any]:
        return {
            "active": ctx.proc is not None,
            "createdAt": _now(),
            "cwd": str(HOME),
            "id": ctx.id,
            "language": "python",
        }

    async def _create_context(self, request: web.Request) -> web.StreamResponse:
        box = self._box(request)
        req = await self._json(request, "CreateContextRequest", "toolbox")
        ctx = Context(str(uuid.uuid4()), box.resolve(req.get("cwd") or str(HOME)), self._env(box))
        box.contexts[ctx.id] = ctx
        return self._reply("InterpreterContext", self._context_dto(ctx), "toolbox")

    async def _list_contexts(self, request: web.Request) -> web.StreamResponse:
        box = self._box(request)
        contexts = [self._context_dto(c) for c in box.contexts.values() if c.id != "default"]
        return self._reply("ListContextsResponse", {"contexts": contexts}, "toolbox")

    async def _delete_context(self, request: web.Request) -> web.StreamResponse:
        box = self._box(request)
        ctx = box.contexts.pop(request.match_info["id"], None)
        if ctx is None:
            return _error(404, f"context {request.match_info['id']} not found")
        await ctx.close()
        # the SDK reads the answer as Dict[str, str]: an empty body failed its decoding, so no
        # context could ever be deleted on the fake
        return web.json_response({"message": f"context {ctx.id} deleted"})

    async def _interpret(self, request: web.Request) -> web.StreamResponse:
        box = self._box(request)
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        msg = await ws.receive()
        if msg.type != WSMsgType.TEXT:
            await ws.close(code=1002, message=b"expected one text frame")
            return ws
        req = json.loads(msg.data)
        unknown = set(req) - {"code", "contextId", "envs", "timeout"}
        if unknown:
            self.violations.append(
                f"interpreter request has fields the SDK never sends: {sorted(unknown)}"
            )
        key = req.get("contextId") or "default"
        ctx = box.contexts.get(key)
        if ctx is None and key == "default":
            ctx = box.contexts["default"] = Context(
                "default", box.resolve(str(HOME)), self._env(box)
            )
        if ctx is None:
            await ws.close(code=4004, message=f"context {key} not found".encode())
            return ws
        try:
            reply = await ctx.run(req["code"], req.get("timeout") or None)
        except TimeoutError:
            await ws.close(code=4008, message=b"execution timed out")
            return ws
        for kind in ("stdout", "stderr"):
            if reply[kind]:
                await ws.send_str(json.dumps({"type": kind, "text": reply[kind]}))
        if reply["error"]:
            await ws.send_str(json.dumps({"type": "error", **reply["error"]}))
        await ws.close(code=1000)
        return ws
