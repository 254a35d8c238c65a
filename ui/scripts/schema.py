"""Print the JSON schema of the event envelope union, the single source of the UI's types.

The root definition msgspec names after the whole generic union is renamed `Envelope` so the
TypeScript it becomes has a name a person can read; nothing else is changed.
"""

import json
import sys

import msgspec

from fleet_events.catalog import AnyEnvelope


def envelope_schema() -> dict[str, object]:
    schema = msgspec.json.schema(AnyEnvelope)
    defs = schema["$defs"]
    root = schema["$ref"].removeprefix("#/$defs/")
    text = json.dumps(defs, sort_keys=True).replace(f"#/$defs/{root}", "#/$defs/Envelope")
    defs = json.loads(text)
    envelope = defs.pop(root)
    return {**envelope, "title": "Envelope", "$defs": defs}


def schema_text() -> str:
    """The exact text the generator hashes: tests/unit/repo/test_ui_types.py recomputes it."""
    return json.dumps(envelope_schema(), sort_keys=True, indent=1) + "\n"


if __name__ == "__main__":
    sys.stdout.write(schema_text())
