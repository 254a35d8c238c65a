"""A persistent Python context of the FAKE Daytona interpreter: one real process per context.

Daytona keeps a context's variables between `run_code` calls; the fake does the same with a
long-lived interpreter process per context, so REPL persistence (and its loss on a fork, which
copies files and starts no process) is real behaviour, not a dictionary in the test process.
"""

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

_LOOP = r"""
import contextlib, io, json, sys, traceback
ns = {"__name__": "__main__"}
out = sys.stdout
for line in sys.stdin:
    req = json.loads(line)
    o, e, err = io.StringIO(), io.StringIO(), None
    try:
        with contextlib.redirect_stdout(o), contextlib.redirect_stderr(e):
            exec(compile(req["code"], "<cell>", "exec"), ns)
    except BaseException as x:
        err = {"name": type(x).__name__, "value": str(x), "traceback": traceback.format_exc()}
    out.write(json.dumps({"stdout": o.getvalue(), "stderr": e.getvalue(), "error": err}) + "\n")
    out.flush()
"""


class Context:
    def __init__(self, context_id: str, cwd: Path, env: dict[str, str]) -> None:
        self.id = context_id
        self.cwd = cwd
        self.env = env
        self.proc: asyncio.subprocess.Process | None = None
        self.lock = asyncio.Lock()

    async def run(self, code: str, timeout: float | None) -> dict[str, Any]:
        async with self.lock:
            if self.proc is None or self.proc.returncode is not None:
                self.proc = await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-I",
                    "-u",
                    "-c",
                    _LOOP,
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.DEVNULL,
                    cwd=self.cwd,
                    env=self.env,
                    limit=64 * 1024 * 1024,
                )
            assert self.proc.stdin is not None
            assert self.proc.stdout is not None
            self.proc.stdin.write((json.dumps({"code": code}) + "\n").encode())
            await self.proc.stdin.drain()
            try:
                line = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
            except TimeoutError:
                await self.close()
                raise
            if not line:
                await self.close()
                return {
                    "stdout": "",
                    "stderr": "",
                    "error": {
                        "name": "Exit",
                        "value": "the interpreter process exited",
                        "traceback": "",
                    },
                }
            reply: dict[str, Any] = json.loads(line)
            return reply

    async def close(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.returncode is None:
            proc.kill()
            await proc.wait()
