"""The UI's event types are generated from libs/events; a stale file fails here, without Node.

`scripts/ui-types` writes the sha256 of the schema text it compiled into the file's header, so
this test recomputes the schema from the live catalog and compares digests. `scripts/test` also
regenerates the whole file with Node (`scripts/ui-types --check`) where `ui/node_modules` exists.
"""

import hashlib
import importlib.util
import re
from pathlib import Path
from types import ModuleType

from fleet_events.catalog import BY_TAG

ROOT = Path(__file__).resolve().parents[3]
GENERATED = ROOT / "ui" / "src" / "generated" / "events.ts"
SCHEMA_SCRIPT = ROOT / "ui" / "scripts" / "schema.py"
HEADER = re.compile(r"^// schema-sha256: ([0-9a-f]{64})$", re.MULTILINE)


def _schema_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("ui_schema", SCHEMA_SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_types_match_the_catalog_schema() -> None:
    text: str = _schema_module().schema_text()
    found = HEADER.search(GENERATED.read_text(encoding="utf-8"))
    assert found, f"{GENERATED} has no schema-sha256 header: regenerate it with ./scripts/ui-types"
    assert found.group(1) == hashlib.sha256(text.encode()).hexdigest(), (
        f"{GENERATED} was generated from another event schema: run ./scripts/ui-types and commit it"
    )


def test_every_event_tag_has_a_typescript_literal() -> None:
    generated = GENERATED.read_text(encoding="utf-8")
    missing = [tag for tag in BY_TAG if f'type: "{tag}";' not in generated]
    assert not missing, f"tags without a generated type: {missing}; run ./scripts/ui-types"
