"""The Daytona FAKE on a loop thread of its own, for tests whose broker is another process."""

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

from fleet_harness.daytona_fake.server import DaytonaFake


@contextlib.contextmanager
def fake_in_thread(state: Path) -> Iterator[DaytonaFake]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="daytona-fake", daemon=True)
    thread.start()
    fake = asyncio.run_coroutine_threadsafe(DaytonaFake(state).start(), loop).result(timeout=30)
    try:
        yield fake
    finally:
        asyncio.run_coroutine_threadsafe(fake.close(), loop).result(timeout=30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=30)
        loop.close()
