"""Composition root of the quality service."""

from fleet_mesh import service


async def setup(ctx: service.ServiceContext) -> None:
    """Nothing beyond ping yet; the service's own issue fills this in."""


def main() -> None:
    service.run("quality", setup)
