"""Read models of the session log (sessions, turns, per-model stats, session state), folded by
this replica's projector into its own SQLite file with the checkpoint (docs/gateway.md)."""

from fleet_gateway.projections.projector import Projector
from fleet_gateway.projections.store import Folded, ProjectionStore

__all__ = ["Folded", "ProjectionStore", "Projector"]
