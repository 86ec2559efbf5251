"""Docs that must track the code: the OpenAPI description and the event catalog."""
import json
import re
from pathlib import Path

import yaml
from openapi_spec_validator import validate

ROOT = Path(__file__).resolve().parent.parent


def test_openapi_is_valid_3_1_and_covers_every_route():
    spec = yaml.safe_load((ROOT / "docs" / "api" / "openapi.yaml").read_text())
    validate(spec)  # raises on an invalid document
    assert spec["openapi"].startswith("3.1")
    # The tus routes (/v1/uploads) are listed in src/api/uploads_handlers.cc, reassignment and
    # simulations in src/api/lifecycle_handlers.cc.
    server = "".join((ROOT / "src" / "api" / f).read_text()
                     for f in ("server.cc", "uploads_handlers.cc", "lifecycle_handlers.cc"))
    # Routes are {"METHOD", "regex", "name", body policy, handler} (src/api/http.h Route); /metrics
    # is the metrics listener's only route.
    methods = ("get", "post", "head", "patch", "delete", "options")
    routes = {(m.capitalize(), name) for m, name in
              re.findall(r'\{"(GET|POST|HEAD|PATCH|DELETE|OPTIONS)", "[^"]*", "([^"]+)", (?:BP|http::BodyPolicy)::', server)}
    assert len(routes) == 23, routes
    documented = {(m.capitalize(), p) for p, ops in spec["paths"].items() for m in ops if m in methods}
    assert routes == documented


def test_every_event_type_written_by_the_code_is_in_the_catalog():
    types = set()
    for f in (ROOT / "src").rglob("*.cc"):
        if f.name.endswith("_test.cc"):
            continue
        types |= set(re.findall(r'EventSpec\s+\w+\{"([a-z_.]+)"', f.read_text()))
        # Events built field by field (src/lake/dead_letter.cc): `ev.type = "..."`.
        types |= set(re.findall(r'\b(?:ev|e)\.type = "([a-z_.-]+)"', f.read_text()))
    assert {"chain.genesis", "key.issued", "tenant.created", "claim.submitted", "artifact.erased",
            "api_key.created", "api_key.revoked", "claim.promoted", "claim.rejected", "claim.demoted",
            "materialize-skipped", "materialize-requeued"} <= types, types
    catalog = (ROOT / "docs" / "data" / "event-catalog.md").read_text()
    headings = set(re.findall(r"^### ([a-z_.-]+)", catalog, re.M))
    assert types <= headings, types - headings


# --- Field rules: the document and the server agree ---------------------------------------------

def _vector(v):
    """A vector of tests/data/field_vectors.json: a string, or prefix + repeat * count + suffix."""
    if isinstance(v, str):
        return v
    return v.get("prefix", "") + v["repeat"] * v["count"] + v.get("suffix", "")


def _ecma_pattern(validator, pattern, instance, schema):
    # JSON Schema's `pattern` is an ECMA-262 regex, whose `$` (without the m flag) matches only at
    # the very end; Python's `$` also matches before a final "\n", which would let "wa\n" pass
    # '^[^\x00-\x1f\x7f]*$'. The patterns here all end in `$`: check them with `\Z` instead.
    from jsonschema.exceptions import ValidationError
    if not validator.is_type(instance, "string"):
        return
    assert pattern.startswith("^") and pattern.endswith("$"), f"unanchored pattern {pattern!r} checks only part of a value"
    if not re.search(pattern[:-1] + r"\Z", instance):
        yield ValidationError(f"{instance[:60]!r} does not match {pattern!r}")


def test_openapi_field_schemas_accept_exactly_what_the_server_accepts():
    """The same vectors as src/fields/fields_test.cc: every valid one passes the field's schema
    (maxLength, pattern, enum), every invalid one fails it."""
    from jsonschema import Draft202012Validator, validators
    spec = yaml.safe_load((ROOT / "docs" / "api" / "openapi.yaml").read_text())
    fields = json.loads((ROOT / "tests" / "data" / "field_vectors.json").read_text())["fields"]
    schemas = spec["components"]["schemas"]
    where = {"workarea_id": "SubmitRequest", "path": "SubmitRequest", "provenance": "SubmitRequest",
             "simulation_id": "SubmitRequest", "media_type": "SubmitRequest", "reason": "EraseRequest"}
    assert {f for f, spec_ in fields.items() if not spec_.get("cli_only")} == set(where)
    Validator = validators.extend(Draft202012Validator, {"pattern": _ecma_pattern})
    checked = 0
    for field, obj in where.items():
        v = Validator(schemas[obj]["properties"][field])
        for x in fields[field]["valid"]:
            s = _vector(x)
            assert v.is_valid(s), (field, s[:80], [e.message for e in v.iter_errors(s)])
            checked += 1
        for x in fields[field]["invalid"]:
            s = _vector(x)
            assert not v.is_valid(s), (field, s[:80])
            checked += 1
    assert checked > 120
    # What the API adds on top of Claims: defaults for absent values.
    prop = lambda obj, name: Validator(schemas[obj]["properties"][name])  # noqa: E731
    assert prop("SubmitRequest", "media_type").is_valid("")  # means text/plain
    assert prop("SubmitRequest", "media_type").is_valid(None)
    assert prop("SubmitRequest", "simulation_id").is_valid(None)
    assert prop("EraseRequest", "reason").is_valid(None)
    # Every journalled string member of a request is bounded: a maxLength or an enum; an array
    # member (attachments) by maxItems and bounded items.
    for obj in ("SubmitRequest", "EraseRequest"):
        for name, p in schemas[obj]["properties"].items():
            if name == "body":  # bounded by max_body_bytes, never journalled
                continue
            if "array" in p.get("type", []):
                assert p.get("maxItems") == 16 and p.get("uniqueItems") is True, (obj, name)
                assert schemas["Uuid"].get("pattern") or schemas["Uuid"].get("format") == "uuid", (obj, name)
                continue
            assert "maxLength" in p or "enum" in p, (obj, name)
