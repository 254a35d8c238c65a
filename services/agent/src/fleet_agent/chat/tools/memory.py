"""The memory tools: the session's core memory blocks (decided by the session fold's rules,
`memory.core_changed` on the log) and memory files on the session's volume."""

import hashlib
import re
from typing import Any

from fleet_agent.chat.tools.kit import ToolError, ToolKit, read_sandbox_file, write_sandbox_file
from fleet_events.session import CoreMemory, CoreMemoryChanged, MemoryFile, MemoryFileWritten
from fleet_events.session_fold import append_core_memory, replace_core_memory

MEMORY_DIR = "memory"
MEMORY_PATH = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_./-]{0,199}")


class Memory:
    def __init__(self, kit: ToolKit) -> None:
        self.kit = kit

    def _decided(self, event: Any) -> str:
        """Log the fold's decision; the state mirrors the fact that stands (the one stored
        before, when this call runs again after its holder died: the block's whole value, so
        the change is made once)."""
        event = self.kit.log(event).event
        if isinstance(event, CoreMemoryChanged):
            memory = self.kit.state.memory
            values = {b: getattr(memory, b) for b in ("persona", "human", "scratchpad")}
            values[event.block] = event.value
            self.kit.state.memory = CoreMemory(**values)
            return f"core memory {event.block!r} now holds {len(event.value)} characters"
        raise ToolError(event.message)

    def core_memory_append(self, block: str, text: str) -> str:
        """Append a line to a core-memory block: persona (2,000 characters), human (2,000)
        or scratchpad (1,000)."""
        return self._decided(append_core_memory(self.kit.state.memory, block, text))

    def core_memory_replace(self, block: str, old: str, new: str) -> str:
        """Replace the one occurrence of `old` in a core-memory block with `new` (empty
        `new` deletes it); quote `old` exactly."""
        return self._decided(replace_core_memory(self.kit.state.memory, block, old, new))

    def _path(self, path: str) -> str:
        if MEMORY_PATH.fullmatch(path) is None or ".." in path.split("/"):
            raise ToolError(
                f"memory path {path[:80]!r} is not usable: use a relative path of letters, "
                "digits, '_', '-', '.' and '/', without '..'"
            )
        return f"{MEMORY_DIR}/{path}"

    def memory_write(self, path: str, content: str) -> str:
        """Write a memory file on the session's volume (kept across turns and restores)."""
        data = content.encode()
        write_sandbox_file(self.kit, self._path(path), data)
        file = MemoryFile(path=path, sha256=hashlib.sha256(data).hexdigest(), size=len(data))
        file = self.kit.log(MemoryFileWritten(file=file)).event.file
        self.kit.state.memory_files[path] = file
        return f"wrote memory file {path!r} ({len(data)} bytes)"

    def memory_read(self, path: str) -> str:
        """Read a memory file the agent wrote earlier."""
        if path not in self.kit.state.memory_files:
            known = ", ".join(self.kit.state.memory_files) or "none"
            raise ToolError(f"no memory file {path!r} (written so far: {known})")
        data = read_sandbox_file(self.kit, self._path(path))
        return data.decode("utf-8", errors="replace")

    def memory_list(self) -> list[str]:
        """The memory files of this session."""
        return sorted(self.kit.state.memory_files)


__all__ = ["MEMORY_DIR", "Memory"]
