"""What TLS costs a mesh's NATS traffic: one node in the clear beside one node with TLS (the
mesh's own CA, `fleet_mesh.tls`), both with the per-role users, side by side in one run.

    .venv/bin/python bench/tls.py [--appends 400] [--connects 40]

Prints, baseline = clear, project = TLS: a connection's set-up (TCP, TLS handshake, the
NKey's signed nonce), one writer's acknowledged append, and a request/reply round trip. The
figures decide whether a one-node `fleet up` (loopback only) should use TLS: docs/deployment.md
records them beside the choice.
"""

import argparse
import asyncio
import tempfile
from pathlib import Path

from nats.aio.client import Client
from nats.aio.msg import Msg

from fleet_harness.bench import report, side_by_side
from fleet_mesh.connection import connect
from fleet_mesh.credentials import ensure_credentials
from fleet_mesh.natsserver import NatsServer
from fleet_mesh.tls import ensure_tls


async def bench(appends: int, connects: int) -> None:
    root = Path(tempfile.mkdtemp(prefix="bench-tls-"))
    credentials = ensure_credentials(root / "credentials")
    admin = credentials.seed_path("admin")
    tls = ensure_tls(root / "tls")
    clear = NatsServer(store_dir=root / "clear", credentials=credentials).start()
    secure = NatsServer(store_dir=root / "tls-node", credentials=credentials, tls=tls).start()
    clients: list[Client] = []
    try:

        async def dial(server: NatsServer) -> Client:
            ca = tls.ca if server is secure else None
            return await connect(server.url, name="bench-tls", credentials=admin, ca=ca)

        async def connect_clear() -> None:
            await (await dial(clear)).close()

        async def connect_secure() -> None:
            await (await dial(secure)).close()

        print(f"one node each, sync_interval always, {appends} appends, {connects} connections")
        base, proj = await side_by_side(
            connect_clear, connect_secure, samples=connects, warmup=4, block=5
        )
        report("connection set-up", base, proj, goal="report it", unit="connect")

        pair = []
        for server in (clear, secure):
            nc = await dial(server)
            clients.append(nc)
            js = nc.jetstream()
            await js.add_stream(name="BENCH", subjects=["bench.>"])

            async def echo(msg: Msg) -> None:
                await msg.respond(msg.data)

            await nc.subscribe("bench.rpc", cb=echo)
            pair.append((nc, js))
        (clear_nc, clear_js), (tls_nc, tls_js) = pair
        payload = b"x" * 512

        async def append_clear() -> None:
            await clear_js.publish("bench.append", payload)

        async def append_tls() -> None:
            await tls_js.publish("bench.append", payload)

        base, proj = await side_by_side(append_clear, append_tls, samples=appends)
        report("acknowledged append, one writer (512 B)", base, proj, goal="report it")

        async def rpc_clear() -> None:
            await clear_nc.request("bench.rpc", payload, timeout=5)

        async def rpc_tls() -> None:
            await tls_nc.request("bench.rpc", payload, timeout=5)

        base, proj = await side_by_side(rpc_clear, rpc_tls, samples=appends)
        report("request/reply round trip (512 B)", base, proj, goal="report it")
    finally:
        for nc in clients:
            await nc.close()
        clear.stop()
        secure.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--appends", type=int, default=400)
    parser.add_argument("--connects", type=int, default=40)
    args = parser.parse_args()
    asyncio.run(bench(args.appends, args.connects))


if __name__ == "__main__":
    main()
