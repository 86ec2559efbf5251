"""Docs that must track the code: the OpenAPI description and the event catalog."""
import re
from pathlib import Path

import yaml
from openapi_spec_validator import validate

ROOT = Path(__file__).resolve().parent.parent


def test_openapi_is_valid_3_1_and_covers_every_route():
    spec = yaml.safe_load((ROOT / "docs" / "api" / "openapi.yaml").read_text())
    validate(spec)  # raises on an invalid document
    assert spec["openapi"].startswith("3.1")
    server = (ROOT / "src" / "api" / "server.cc").read_text()
    routes = set(re.findall(r'http\.(Get|Post)\([^;]*?wrap\("([^"]+)"', server, re.S))
    routes.add(("Get", "/metrics"))
    assert len(routes) == 7, routes
    documented = {(m.capitalize(), p) for p, ops in spec["paths"].items() for m in ops if m in ("get", "post")}
    assert routes == documented


def test_every_event_type_written_by_the_code_is_in_the_catalog():
    types = set()
    for f in (ROOT / "src").rglob("*.cc"):
        if f.name.endswith("_test.cc"):
            continue
        types |= set(re.findall(r'EventSpec\s+\w+\{"([a-z_.]+)"', f.read_text()))
    assert {"chain.genesis", "key.issued", "tenant.created", "claim.submitted", "artifact.erased",
            "api_key.created", "api_key.revoked"} <= types, types
    catalog = (ROOT / "docs" / "data" / "event-catalog.md").read_text()
    headings = set(re.findall(r"^### ([a-z_.]+)", catalog, re.M))
    assert types <= headings, types - headings
