"""The gateway's HTTP routers, one module per surface, mounted by `fleet_gateway.app`."""
