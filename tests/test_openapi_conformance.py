"""The OpenAPI document equals the server: Schemathesis (pinned in tests/requirements.txt)
generates requests from docs/api/openapi.yaml, sends them to a running `oml serve`, and checks
every response against the document with every check it has: a documented status (ST103), the
response schema (ST108), a documented content type (ST104, ST105), the required response headers
(ST107), no 5xx (ST101), schema-valid requests accepted (ST202) and schema-violating ones refused
(ST201), a missing required header refused (ST203), an undocumented method answered 405 with a
matching Allow (ST204, ST205), authentication enforced (ST401), and the stateful checks (ST301,
ST302, ST402) on the workflows the document's `links` describe.

Each role (writer, then reviewer) has its runs (PLAN): the examples, coverage and fuzzing phases
over every operation of the API listener, and stateful runs over its workflows. A fixed seed and
a bounded number of examples make a CI run repeatable and about a minute long;
`bench/openapi-fuzz` runs the same with more examples and a random seed. /metrics is served by
the metrics listener (`metrics_listen`), not the API listener: the document says so with a
path-level `servers`, and it is checked there, by a run of its own.

Excluded from the generated cases, on purpose (and said so in the document):
  * `cursor` (GET /v1/claims, GET /v1/search): an opaque, HMAC-authenticated cursor that only
    the server can mint; any generated value is rightly `400 invalid-cursor`. It is sent empty
    (the first page, as the document allows). tests/test_recall.py covers real cursors.
  * `Upload-Metadata` (POST /v1/uploads): what the server reads is base64 inside the value
    (the SHA-256 of the file, a UTF-8 file name, a media type), which JSON Schema cannot
    constrain; a generated value is almost never a valid one. It is sent as a fixed valid value
    (the SHA-256 of the empty file). tests/test_uploads.py covers the parsing.

Failures that are not disagreements are dropped by `filter_failure` below, each for one exact
kind of response: the documented refusals (_is_documented_refusal) and one Schemathesis quirk
(_tool_quirk). A server bug it finds goes in _KNOWN_SERVER_BUGS (none is open), dropped only for its
exact request and response, with a TODO: fix the server, then delete the entry. Every run writes
what it dropped (and the test prints it).

This module is also the Schemathesis hooks file of those runs (config `hooks`): Schemathesis
executes it in its own process, without the tests' sys.path, so its module level imports only
the standard library, schemathesis and pytest (jsonschema and PyYAML where they are used).
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import schemathesis

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "api" / "openapi.yaml"
HOOKS = Path(__file__).resolve()

# The CI run: fixed, so a failure found in CI is found again by the same command.
SEED = 20261202
MAX_EXAMPLES = 25  # per operation and phase
STATEFUL_STEPS = 20


# A fixed, valid Upload-Metadata: the SHA-256 of the empty file (see the module docstring).
EMPTY_FILE_SHA256_B64 = base64.b64encode(hashlib.sha256(b"").digest()).decode()
UPLOAD_METADATA = f"sha256 {EMPTY_FILE_SHA256_B64}"


# --- Hooks (run inside the Schemathesis process) ------------------------------------------------

# A tus PATCH body is raw bytes sent as application/offset+octet-stream.
schemathesis.serializer.alias("application/offset+octet-stream", "application/octet-stream")


def _problem_type(response) -> str | None:
    """The problem slug of a problem+json answer ("urn:oml:problem:<slug>"), else None."""
    try:
        doc = json.loads(response.content)
    except (ValueError, TypeError):
        return None
    t = doc.get("type") if isinstance(doc, dict) else None
    return t.rsplit(":", 1)[-1] if isinstance(t, str) and t.startswith("urn:oml:problem:") else None


def _header(headers, name: str) -> str | None:
    """One header of a response (a mapping of lists) or of a prepared request (a mapping of
    strings), case-insensitively."""
    for k, v in headers.items():
        if k.lower() == name.lower():
            return v[0] if isinstance(v, list) else v
    return None


# Refusals the document gives for schema-valid requests: the request is well formed, and the answer
# depends on state the schema cannot see. Schemathesis's ST202 expects 2xx, 401, 403, 404 or 409 for
# them. Keyed by (status, problem slug); nothing else with these statuses is dropped.
_DOCUMENTED_REFUSALS = {
    # The claim was erased (GET and every write on a claim).
    (410, "erased"),
    # The same Idempotency-Key with another request: generated cases reuse keys across requests.
    (422, "idempotency-key-reused"),
    # tus: the file's bytes are not the declared SHA-256 (a zero-length upload completes at once).
    (422, "digest-mismatch"),
    # tus: Upload-Length above upload_max_bytes, a setting of the deployment (default 8 GiB).
    (413, "upload-too-large"),
    # tus: a chunk past Upload-Length; a chunk whose Upload-Checksum does not match it.
    (413, "upload-length-exceeded"),
    (460, "checksum-mismatch"),
    # GET /v1/claims/{id}/attachments/{n}: a Range of the documented syntax past the end of the
    # file, or with its last byte before its first (the Range parameter's description).
    (416, "range-not-satisfiable"),
    # tus: an expired or failed session.
    (410, "upload-expired"),
    (410, "upload-failed"),
}


def _is_documented_refusal(failure, case, response) -> bool:
    if failure.code == "ST202" and (response.status_code, _problem_type(response)) in _DOCUMENTED_REFUSALS:
        return True
    # GET /v1/search: `q` is 1..1000 bytes of UTF-8 (its description); `maxLength` can only count
    # code points, so non-ASCII text within maxLength can still be too long.
    if failure.code == "ST202" and case.operation.label == "GET /v1/search" and response.status_code == 400:
        q = (case.query or {}).get("q")
        return isinstance(q, str) and len(q.encode()) > 1000 and _problem_type(response) == "invalid-parameter"
    # GET /v1/proofs/consistency: `from` past `to` (a relation between two parameters, which the
    # schema cannot state; the 400's description does).
    if failure.code == "ST202" and case.operation.label == "GET /v1/proofs/consistency" and response.status_code == 400:
        q = case.query or {}
        try:
            past = int(q["from"]) > int(q["to"])
        except (KeyError, TypeError, ValueError):
            return False
        return past and _problem_type(response) == "invalid-parameter"
    # A schema-violating request refused by the transport before the route sees it (the document's
    # UriTooLong, HeadersTooLarge and BodyTooLarge responses): refused, not accepted, whatever ST201
    # expects (400, 401, 403, 404, 405, 406, 409, 415, 422, 428, 429 or 5xx). Seen: a generated query
    # of several kilobytes, 414.
    if failure.code == "ST201" and (response.status_code, _problem_type(response)) in \
            ((414, "uri-too-long"), (431, "headers-too-large"), (413, "body-too-large")):
        return True
    # tus 1.0: a /v1/uploads request without `Tus-Resumable: 1.0.0` is 412 tus-version-unsupported
    # with Tus-Version (the document's TusResumable parameter and the 412 responses), not the 400
    # Schemathesis expects for a missing or invalid header (ST201, ST203). A HEAD answer has no
    # body: Tus-Version identifies it.
    if failure.code in ("ST201", "ST203") and case.path.startswith("/v1/uploads") and response.status_code == 412:
        sent = _header(response.request.headers, "Tus-Resumable")
        return sent != "1.0.0" and _header(response.headers, "Tus-Version") == "1.0.0"
    return False


def _parameter_schemas(operation) -> dict:
    """{(location, lower-cased name): schema} of the operation's header and query parameters, from
    the document under test ($refs to components/parameters resolved)."""
    doc = operation.schema.raw_schema
    out = {}
    path_item = doc["paths"][operation.path]
    for p in list(path_item.get("parameters", [])) + list(operation.definition.raw.get("parameters", [])):
        if "$ref" in p:
            p = doc["components"]["parameters"][p["$ref"].rsplit("/", 1)[-1]]
        if p["in"] in ("header", "query"):
            out[(p["in"], p["name"].lower())] = p.get("schema", {})
    return out


def _sent_invalid_parameter(case) -> str | None:
    """The first header or query parameter the case sent that breaks its own documented string
    schema (pattern, lengths, enum, const), e.g. "header Idempotency-Key"; None if none."""
    from jsonschema import Draft202012Validator
    schemas = _parameter_schemas(case.operation)
    for location, values in (("header", case.headers or {}), ("query", case.query or {})):
        for name, value in values.items():
            schema = schemas.get((location, name.lower()))
            if schema is None or schema.get("type") != "string" or "$ref" in schema or not isinstance(value, str):
                continue
            if not Draft202012Validator(schema).is_valid(value):
                return f"{location} {name}"
    return None


def _tool_quirk(failure, case, response) -> str | None:
    # Schemathesis 4.32.5, coverage phase: the optional parameters a scenario is not about are
    # filled with a placeholder `0` whatever their schema (seen: `Idempotency-Key: 0`,
    # `Upload-Checksum: 0`, outside their documented patterns), and the case may still be
    # labelled positive. The server rightly answers 400 for them. Such a case is dropped from
    # ST202 (schema-valid request rejected) only when a parameter it sent breaks its documented
    # schema, i.e. when it was not schema-valid at all.
    if failure.code == "ST202" and response.status_code == 400:
        return _sent_invalid_parameter(case)
    return None


# Server bugs this test found, each fixed (with a test of its own) and removed from here:
# - GET /v1/claims with a UTC offset beyond +-15:59 was 500 (PostgreSQL's timestamptz input
#   stops there): Rfc3339 now hands PostgreSQL the instant in UTC
#   (tests/test_recall.py::test_time_filters_take_any_rfc3339_offset).
# - An unknown query parameter name cut inside a UTF-8 sequence (or not UTF-8) was 500 when its
#   problem detail was serialised: the name is shown %XX-escaped
#   (tests/test_recall.py::test_an_unknown_parameter_name_of_any_bytes_is_400).
_KNOWN_SERVER_BUGS: list = []


# The reviewer's stateful run lists the held claims the writer's run left (state=held and no other
# filter): with the generated filters (a random workarea, state, time range) a page is almost always
# empty, and the links from a page (GetFirstListedClaim, VerdictFirstListedClaim, ...) would never
# have a claim to follow; held, the first claim of each page is a new one to give a verdict on.
# Set by run_schemathesis(unfiltered_lists=True); the stateful phase generates positive data only,
# and `state=held` and no filter are valid queries, so a case stays what it was.
UNFILTERED_LISTS = "OML_OPENAPI_UNFILTERED_LISTS"


@schemathesis.hook
def map_query(context, query):
    if os.environ.get(UNFILTERED_LISTS) == "1" and context.operation is not None and \
            context.operation.label == "GET /v1/claims" and isinstance(query, dict):
        return {**{k: v for k, v in query.items() if k in ("limit", "cursor")}, "state": "held"}
    return query


# Every dropped failure is written to this file (run_schemathesis sets it): reason, code, operation,
# status, one per line, so a run can say what it dropped and how often.
DROPPED = "OML_OPENAPI_DROPPED"


def _drop(reason: str, failure, case, response) -> bool:
    path = os.environ.get(DROPPED)
    if path:
        with open(path, "a") as f:
            f.write(f"{reason}\t{failure.code}\t{case.operation.label}\t{response.status_code}\n")
    return False


@schemathesis.hook
def filter_failure(context, failure, case, response) -> bool:
    """Keeps a failure unless it is one of the exact, explained cases above."""
    if _is_documented_refusal(failure, case, response):
        return _drop("documented refusal", failure, case, response)
    quirk = _tool_quirk(failure, case, response)
    if quirk:
        return _drop(f"schemathesis quirk: sent an invalid {quirk}", failure, case, response)
    for matches, _log, name in _KNOWN_SERVER_BUGS:
        if matches(failure, case, response):
            return _drop(f"known server bug: {name}", failure, case, response)
    return True


# --- The run ------------------------------------------------------------------------------------

CONFIG = """\
base-url = "{base_url}"
seed = {seed}
workers = 1
hooks = "{hooks}"
request-timeout = 30
color = false

[headers]
Authorization = "Bearer {token}"

[generation]
mode = "all"
max-examples = {max_examples}
database = "none"

[cache]
enabled = false

# The tokens are throwaway keys of a fresh deployment: keep the curl lines replayable.
[output.sanitization]
enabled = false

[phases.stateful]
max-steps = {stateful_steps}
# Workflows of valid requests; the coverage and fuzzing phases send the invalid ones.
[phases.stateful.generation]
mode = "positive"

# Excluded from generation (module docstring): the opaque cursor and the tus metadata.
[parameters]
"query.cursor" = ""
"header.Upload-Metadata" = "{upload_metadata}"
"""


class Run:
    """One `schemathesis run`: its exit code, console output, JSON report, and the links the
    stateful phase followed (transition ids such as "POST /v1/claims -> [201] GetClaim -> GET
    /v1/claims/{id}"). A plain class: Schemathesis executes this file without registering it as
    a module, which dataclasses need."""
    def __init__(self, returncode: int, output: str, report: dict, links: set, dropped: dict):
        self.returncode, self.output, self.report, self.links = returncode, output, report, links
        # {(reason, code, operation, status): count} of the failures filter_failure dropped
        self.dropped = dropped

    def summary(self) -> str:
        return self.output[-30000:]


# The links from POST /v1/uploads to its session, which the document cannot state (see its
# components/links): the id is the last segment of the relative Location. Schemathesis infers links
# from a Location only to a path with a GET, which /v1/uploads/{id} has not.
_NEW_UPLOAD = "$response.header.Location#regex:^/v1/uploads/([^/?#]+)$"
UPLOAD_LINKS = {
    "HeadNewUpload": {"operationId": "headUpload", "parameters": {"id": _NEW_UPLOAD}},
    "FirstChunk": {"operationId": "patchUpload",
                   "parameters": {"id": _NEW_UPLOAD, "header.Upload-Offset": "$response.header.Upload-Offset"}},
    "DeleteNewUpload": {"operationId": "deleteUpload", "parameters": {"id": _NEW_UPLOAD}},
}


def document_with_upload_links(out: Path) -> Path:
    """docs/api/openapi.yaml plus UPLOAD_LINKS, as JSON in `out`."""
    import yaml
    doc = yaml.safe_load(DOC.read_text())
    doc["paths"]["/v1/uploads"]["post"]["responses"]["201"]["links"] = UPLOAD_LINKS
    path = out / "openapi.json"
    path.write_text(json.dumps(doc))
    return path


def run_schemathesis(out: Path, *, base_url: str, token: str, seed: int, max_examples: int, phases: str,
                     stateful_steps: int = STATEFUL_STEPS, doc: Path | None = None, filters: tuple = (),
                     unfiltered_lists: bool = False, timeout: float = 1800) -> Run:
    """Runs the pinned Schemathesis CLI (the venv's, beside sys.executable) against base_url with
    every check; `phases` as its --phases, `filters` extra CLI options (operation filters). `doc`:
    docs/api/openapi.yaml with UPLOAD_LINKS unless given."""
    out.mkdir(parents=True, exist_ok=True)
    doc = doc or document_with_upload_links(out)
    config = out / "schemathesis.toml"
    config.write_text(CONFIG.format(base_url=base_url, seed=seed, hooks=HOOKS, token=token, max_examples=max_examples,
                                    stateful_steps=stateful_steps, upload_metadata=UPLOAD_METADATA))
    cmd = [str(Path(sys.executable).with_name("schemathesis")), "--config-file", str(config), "--no-color", "run",
           str(doc), "--checks", "all", "--phases", phases, "--report", "json,ndjson",
           "--report-json-path", str(out / "report.json"), "--report-ndjson-path", str(out / "events.ndjson"),
           *filters]
    env = dict(os.environ, COLUMNS="200", NO_COLOR="1")
    env.pop("SCHEMATHESIS_HOOKS", None)
    env[UNFILTERED_LISTS] = "1" if unfiltered_lists else "0"
    env[DROPPED] = str(out / "dropped.tsv")
    p = subprocess.run(cmd, cwd=out, env=env, capture_output=True, text=True, timeout=timeout)
    report_path = out / "report.json"
    report = json.loads(report_path.read_text()) if report_path.exists() else {}
    dropped: dict = {}
    if (out / "dropped.tsv").exists():
        for line in (out / "dropped.tsv").read_text().splitlines():
            key = tuple(line.split("\t"))
            dropped[key] = dropped.get(key, 0) + 1
    return Run(p.returncode, p.stdout + p.stderr, report, _followed_links(out / "events.ndjson"), dropped)


def _followed_links(ndjson: Path) -> set:
    """The transitions (links) the stateful phase applied, from the NDJSON event stream."""
    links = set()
    if not ndjson.exists():
        return links
    for line in ndjson.read_text().splitlines():
        finished = json.loads(line).get("ScenarioFinished")
        if not finished or finished.get("phase") != "stateful":
            continue
        for node in finished["recorder"].get("cases", {}).values():  # empty for a scenario with no call
            if node.get("transition") and node.get("is_transition_applied"):
                links.add(node["transition"]["id"])
    return links


ALL_PHASES = ("examples", "coverage", "fuzzing", "stateful")


def assert_clean(run: Run, operations: int, phases: str):
    """Nothing found: exit 0, no failure, no error, the phases asked for passed (the others
    skipped), and `operations` selected, each of them tested unless only the stateful phase ran
    (it reaches what its links and roots reach; the links asserted by the caller). The console
    output, with a curl line per failure, is the message otherwise."""
    r = run.report
    assert r, f"no JSON report; exit {run.returncode}\n{run.summary()}"
    assert (run.returncode, r["exit_code"], r["failures"], r["errors"]) == (0, 0, [], []), run.summary()
    assert r["complete"] is True and r["stop_reason"] == "completed", run.summary()
    assert (r["operations"]["selected"], r["operations"]["errored"]) == (operations, 0), run.summary()
    if phases != "stateful":
        assert r["operations"]["tested"] == operations, run.summary()
    wanted = phases.split(",")
    assert {name: phase["status"] for name, phase in r["phases"].items()} == \
        {name: "success" if name in wanted else "skip" for name in ALL_PHASES}, run.summary()


# Each role's runs: (phases, operation filters as Schemathesis CLI options, how many of the
# document's 21 operations they select, unfiltered lists). /metrics is on the metrics listener,
# tested by a run of its own.
#
# The stateful phase gets runs of its own, each over one workflow, because of how Schemathesis
# starts a scenario: from its "reliable" roots only, when there are any (a POST, or a GET without
# path parameters, that takes no reference to a resource no operation creates). It reads
# `workarea_id` as such a reference, so POST /v1/claims is no reliable root while POST
# /v1/uploads, POST /v1/simulations, GET /v1/claims and GET /v1/search are: with any of those
# selected, a writer's scenarios would never submit a claim. So the writer's claims and uploads
# workflows are two runs. The reviewer (who may neither submit nor upload) follows links from the
# writer's claims, through GET /v1/claims (its lists unfiltered: UNFILTERED_LISTS), and from
# simulations.
GENERATED = "examples,coverage,fuzzing"
API_LISTENER = ("--exclude-path", "/metrics")
METRICS_PHASES = "coverage,fuzzing"  # GET /metrics has no examples to send
PLAN = {
    "writer": [
        ("stateful", ("--include-name-regex", r"^(POST /v1/claims|[A-Z]+ /v1/claims/\{id\}.*)$"), 7, False),
        ("stateful", ("--include-path-regex", "^/v1/uploads"), 5, False),
        (GENERATED, API_LISTENER, 22, False),
    ],
    "reviewer": [
        (GENERATED, API_LISTENER, 22, False),
        ("stateful", API_LISTENER, 22, True),
    ],
}
# Links each role's stateful runs must have followed, at least: the document's (and UPLOAD_LINKS),
# from the writes each role may make. Schemathesis adds links of its own (inferred from `Location`
# and from parameter names); those are followed too, and not asserted.
EXPECTED_LINKS = {
    "writer": {
        "POST /v1/claims -> [201] GetClaim -> GET /v1/claims/{id}",
        "POST /v1/claims -> [201] EraseClaim -> POST /v1/claims/{id}/erase",
        "POST /v1/claims -> [201] ReassignClaim -> POST /v1/claims/{id}/reassign",
        "POST /v1/uploads -> [201] HeadNewUpload -> HEAD /v1/uploads/{id}",
        "POST /v1/uploads -> [201] FirstChunk -> PATCH /v1/uploads/{id}",
        "POST /v1/uploads -> [201] DeleteNewUpload -> DELETE /v1/uploads/{id}",
    },
    "reviewer": {
        "GET /v1/claims -> [200] GetFirstListedClaim -> GET /v1/claims/{id}",
        "GET /v1/claims -> [200] VerdictFirstListedClaim -> POST /v1/claims/{id}/verdict",
        "POST /v1/claims/{id}/verdict -> [200] DemoteClaim -> POST /v1/claims/{id}/demote",
        "POST /v1/simulations -> [201] GetSimulation -> GET /v1/simulations/{sim}",
        "POST /v1/simulations -> [201] EndSimulation -> POST /v1/simulations/{sim}/end",
    },
}


# --- Tests --------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def api():
    """One deployment for the module: `oml serve`, tenant acme, a writer and a reviewer key."""
    from conftest import new_deployment
    with new_deployment("oml-openapi-") as d:
        d.tenant("acme")
        d.keys = {"writer": d.api_key("acme", "writer", "alice"), "reviewer": d.api_key("acme", "reviewer", "rita")}
        d.serve()
        yield d


# In this order: the reviewer's scenarios start from the claims the writer's left.
@pytest.mark.parametrize("role", ["writer", "reviewer"])
def test_api_listener_conforms_to_the_document(api, role, tmp_path):
    t0 = time.monotonic()
    links, cases, dropped = set(), 0, {}
    for n, (phases, filters, operations, unfiltered_lists) in enumerate(PLAN[role]):
        run = run_schemathesis(tmp_path / str(n), base_url=api.base, token=api.keys[role], seed=SEED,
                               max_examples=MAX_EXAMPLES, phases=phases, filters=filters,
                               unfiltered_lists=unfiltered_lists)
        assert_clean(run, operations, phases)
        links |= run.links
        cases += run.report["test_cases"]["generated"]
        for key, count in run.dropped.items():
            dropped[key] = dropped.get(key, 0) + count
    assert EXPECTED_LINKS[role] <= links, (sorted(EXPECTED_LINKS[role] - links), sorted(links))
    # Every 5xx also fails a check above; the log shows what a handler logged as an error, whatever
    # it answered. The known server bugs' errors aside.
    errors = [line for line in api.log_text().splitlines() if '"level":"error"' in line
              and not any(log.search(line) for _matches, log, _name in _KNOWN_SERVER_BUGS)]
    assert errors == [], errors[:20]
    print(f"{role}: {cases} cases, {len(links)} links followed, {time.monotonic() - t0:.1f} s; dropped:")
    for (reason, code, operation, status), count in sorted(dropped.items()):
        print(f"  {count:5d}  {code} {status} {operation}: {reason}")


def test_metrics_listener_conforms_to_the_document(api, tmp_path):
    """GET /metrics is documented on the metrics listener (its path-level `servers`) and served
    there; the API listener answers 404 for it."""
    run = run_schemathesis(tmp_path, base_url=api.metrics_base, token=api.keys["writer"], seed=SEED,
                           max_examples=MAX_EXAMPLES, phases=METRICS_PHASES, filters=("--include-path", "/metrics"))
    assert_clean(run, 1, METRICS_PHASES)
    assert api.get("/metrics").status_code == 404


def test_a_disagreement_fails_the_run(api, tmp_path):
    """The harness can fail: with 404 taken out of GET /v1/claims/{id}'s responses, the run reports
    exactly that (ST103, undocumented status code) and exits 1."""
    import yaml
    doc = yaml.safe_load(DOC.read_text())
    del doc["paths"]["/v1/claims/{id}"]["get"]["responses"]["404"]
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(doc))
    run = run_schemathesis(tmp_path / "run", base_url=api.base, token=api.keys["writer"], seed=SEED, max_examples=5,
                           phases=GENERATED, doc=broken,
                           filters=("--include-name", "GET /v1/claims/{id}"))
    assert run.returncode == 1, run.summary()
    assert [(f["code"], f["operations"]) for f in run.report["failures"]] == [("ST103", ["GET /v1/claims/{id}"])], \
        run.summary()
