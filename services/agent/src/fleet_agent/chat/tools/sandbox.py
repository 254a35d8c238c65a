"""The sandbox tools: run Python in the session's sandbox, list, read and write its workspace."""

from typing import Any

from fleet_agent.chat.tools.kit import ToolError, ToolKit, read_sandbox_file, write_sandbox_file

LISTING_LIMIT = 100


class Sandbox:
    def __init__(self, kit: ToolKit) -> None:
        self.kit = kit

    def execute_code(self, code: str) -> str:
        """Run Python in the session's sandbox (a fresh REPL context; files in its workspace
        persist) and answer what it printed."""
        return self._run(code)

    def list_files(self, path: str = ".") -> list[str]:
        """Files under `path` in the session's sandbox workspace (at most 100, as the earlier
        system listed), relative to the workspace."""
        code = (
            "import os\n"
            "found = []\n"
            "for root, dirs, files in os.walk(path):\n"
            "    dirs.sort()\n"
            "    for name in sorted(files):\n"
            "        found.append(os.path.relpath(os.path.join(root, name)))\n"
            "        if len(found) >= LIMIT:\n"
            "            break\n"
            "    if len(found) >= LIMIT:\n"
            "        break\n"
            "print('\\n'.join(found))"
        )
        listed = self._run(code, {"path": path, "LIMIT": LISTING_LIMIT})
        return [line for line in listed.splitlines() if line]

    def workspace_read(self, path: str) -> str:
        """Read a text file from the session's sandbox workspace."""
        data = read_sandbox_file(self.kit, path)
        return data.decode("utf-8", errors="replace")

    def workspace_write(self, path: str, content: str) -> str:
        """Write a text file in the session's sandbox workspace (it persists across turns)."""
        data = content.encode()
        write_sandbox_file(self.kit, path, data)
        return f"wrote {path!r} ({len(data)} bytes)"

    def run_cell(self, code: str, variables: dict[str, Any]) -> str:
        """`code` with `variables` bound (the code route's cell: `TurnRun.code`)."""
        return self._run(code, variables)

    def _run(self, code: str, variables: dict[str, Any] | None = None) -> str:
        """One cell in a REPL context of its own (nothing carries over between them), so a
        context lost under it (its broker started again, the sandbox revived in place) needs
        no rebuild: the cell runs again, once, in a new context (it runs at least once)."""
        from dspy.primitives.code_interpreter import CodeInterpreterError

        from fleet_agent.interpreter import RemoteInterpreter

        for attempt in range(CELL_TRIES):
            interpreter = RemoteInterpreter(self.kit.ctx.mesh.bus, self.kit.sandbox())
            try:
                output = interpreter.execute(code, variables)
            except SyntaxError as exc:
                raise ToolError(f"the code does not parse: {exc.msg} (line {exc.lineno})") from None
            except CodeInterpreterError as exc:
                if interpreter.context_lost and attempt + 1 < CELL_TRIES:
                    continue
                raise ToolError(str(exc)[:4000]) from None
            finally:
                interpreter.shutdown()
            return str(output if output is not None else "")
        raise AssertionError("unreachable: the last try returns or raises")


CELL_TRIES = 2
"""A chat cell's runs: once more when its context was lost under it."""

__all__ = ["CELL_TRIES", "LISTING_LIMIT", "Sandbox"]
