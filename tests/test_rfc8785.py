"""Canonical JSON cross-checked against an independent RFC 8785 implementation.

`oml canonicalize` (src/journal/canonical_json.cc, floats allowed) must produce, byte for byte,
what the PyPI package `rfc8785` (Trail of Bits, a port of the RFC authors' reference code)
produces: on the RFC's own examples, on thousands of seeded random documents built to expose
UTF-16 vs byte ordering and escaping mistakes, and on the signed bytes of real receipts.
"""
import base64
import json
import os
import random
import struct
import subprocess
import tempfile
import uuid

import pytest
import rfc8785

from conftest import OML_BIN

TWO_53 = 2 ** 53


def canonicalize(docs):
    """Runs one `oml canonicalize` over `docs` (JSON texts, str or bytes, one per line).
    Returns (list of bytes-or-error-str, exit code)."""
    lines = [d.encode() if isinstance(d, str) else d for d in docs]
    assert all(b"\n" not in line for line in lines)
    with tempfile.TemporaryDirectory(prefix="oml-canon-") as home:
        env = dict(os.environ, OML_HOME=home, OML_LOG_LEVEL="warn")
        env.pop("OML_DATABASE_URL", None)
        p = subprocess.run([OML_BIN, "canonicalize"], input=b"\n".join(lines) + b"\n", env=env,
                           capture_output=True, timeout=300)
    out = p.stdout.split(b"\n")
    assert out[-1] == b"", p.stdout[-200:]
    out = out[:-1]
    assert len(out) == len(lines), (len(out), len(lines), p.stderr)
    results = []
    for line in out:
        if line.startswith(b"error: "):
            results.append(line.decode("utf-8", "replace"))
        else:
            results.append(bytes.fromhex(line.decode()))
    return results, p.returncode


# --- The RFC's own examples -------------------------------------------------------------------

# RFC 8785 §3.2.2 input, verbatim (its line breaks become spaces: one document per line).
RFC_3_2_2 = r'''{
  "numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
  "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
  "literals": [null, true, false]
}'''
# §3.2.4: its canonical UTF-8 bytes.
RFC_3_2_2_HEX = ("7b 22 6c 69 74 65 72 61 6c 73 22 3a 5b 6e 75 6c 6c 2c 74 72 75 65 2c 66 61 6c 73 65 5d 2c 22 6e "
                 "75 6d 62 65 72 73 22 3a 5b 33 33 33 33 33 33 33 33 33 2e 33 33 33 33 33 33 33 2c 31 65 2b 33 30 "
                 "2c 34 2e 35 2c 30 2e 30 30 32 2c 31 65 2d 32 37 5d 2c 22 73 74 72 69 6e 67 22 3a 22 e2 82 ac 24 "
                 "5c 75 30 30 30 66 5c 6e 41 27 42 5c 22 5c 5c 5c 5c 5c 22 2f 22 7d")
# §3.2.3 sorting example, all seven names.
RFC_3_2_3 = r'''{
  "\u20ac": "Euro Sign",
  "\r": "Carriage Return",
  "\ufb33": "Hebrew Letter Dalet With Dagesh",
  "1": "One",
  "\ud83d\ude00": "Emoji: Grinning Face",
  "\u0080": "Control",
  "\u00f6": "Latin Small Letter O With Diaeresis"
}'''
RFC_3_2_3_ORDER = ["Carriage Return", "One", "Control", "Latin Small Letter O With Diaeresis", "Euro Sign",
                   "Emoji: Grinning Face", "Hebrew Letter Dalet With Dagesh"]


def test_rfc_examples_match_the_rfc_and_rfc8785():
    (got_322, got_323), rc = canonicalize([RFC_3_2_2.replace("\n", " "), RFC_3_2_3.replace("\n", " ")])
    assert rc == 0
    assert got_322 == bytes.fromhex(RFC_3_2_2_HEX)
    assert got_322 == rfc8785.dumps(json.loads(RFC_3_2_2))
    assert got_323 == rfc8785.dumps(json.loads(RFC_3_2_3))
    assert list(json.loads(got_323).values()) == RFC_3_2_3_ORDER
    assert got_323 == ('{"\\r":"Carriage Return","1":"One","\u0080":"Control","\u00f6":"Latin Small Letter O With '
                       'Diaeresis","\u20ac":"Euro Sign","\U0001F600":"Emoji: Grinning Face","\ufb33":"Hebrew Letter '
                       'Dalet With Dagesh"}').encode()
    # Plain sorted json.dumps (code point order) gets this one wrong: that is what the test is for.
    naive = json.dumps(json.loads(RFC_3_2_3), sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    assert naive != got_323


# RFC 8785 Appendix B (every finite row; NaN and Infinity have no JSON text to feed in).
APPENDIX_B = [
    ("0000000000000000", "0"), ("8000000000000000", "0"), ("0000000000000001", "5e-324"),
    ("8000000000000001", "-5e-324"), ("7fefffffffffffff", "1.7976931348623157e+308"),
    ("ffefffffffffffff", "-1.7976931348623157e+308"), ("4340000000000000", "9007199254740992"),
    ("c340000000000000", "-9007199254740992"), ("4430000000000000", "295147905179352830000"),
    ("44b52d02c7e14af5", "9.999999999999997e+22"), ("44b52d02c7e14af6", "1e+23"),
    ("44b52d02c7e14af7", "1.0000000000000001e+23"), ("444b1ae4d6e2ef4e", "999999999999999700000"),
    ("444b1ae4d6e2ef4f", "999999999999999900000"), ("444b1ae4d6e2ef50", "1e+21"),
    ("3eb0c6f7a0b5ed8c", "9.999999999999997e-7"), ("3eb0c6f7a0b5ed8d", "0.000001"),
    ("41b3de4355555553", "333333333.3333332"), ("41b3de4355555554", "333333333.33333325"),
    ("41b3de4355555555", "333333333.3333333"), ("41b3de4355555556", "333333333.3333334"),
    ("41b3de4355555557", "333333333.33333343"), ("becbf647612f3696", "-0.0000033333333333333333"),
    ("43143ff3c1cb0959", "1424953923781206.2"),
]


def test_appendix_b_numbers_and_random_doubles_match_rfc8785():
    rng = random.Random(8785)
    values = [struct.unpack(">d", bytes.fromhex(h))[0] for h, _ in APPENDIX_B]
    values += [10.0 ** e for e in range(-30, 31)] + [-(10.0 ** e) * 1.5 for e in range(-30, 31)]
    values += [1e21 * (1 - 2 ** -52), 1e21, 1e-6, 1e-6 * (1 - 2 ** -52), 1e-7, 2.0 ** 53, 2.0 ** 53 + 2, 0.1 + 0.2]
    while len(values) < 3000:
        bits = rng.getrandbits(64)
        d = struct.unpack(">d", struct.pack(">Q", bits))[0]
        if d == d and d not in (float("inf"), float("-inf")):
            values.append(d)
        values.append(round(rng.uniform(-1e6, 1e6), rng.randint(0, 9)))
    got, rc = canonicalize([json.dumps([v]) for v in values])
    assert rc == 0
    for (h, text), g in zip(APPENDIX_B, got):
        assert g == ("[" + text + "]").encode(), h
    mismatches = [(v, g, rfc8785.dumps([v])) for v, g in zip(values, got) if g != rfc8785.dumps([v])]
    assert mismatches == []


# --- Seeded random envelopes ------------------------------------------------------------------

ASCII = [chr(c) for c in range(0x20, 0x7F)]
CONTROLS = [chr(c) for c in range(0x00, 0x20)] + ["\x7f"] + [chr(c) for c in range(0x80, 0xA0)]
JSON_SPECIALS = ['"', "\\", "/", "\u2028", "\u2029", "\ufeff"]
HIGH_BMP = ["\ue000", "\uf8ff", "\ufb33", "\ufeff", "\ufffd", "\uffff"]  # sort AFTER astral in UTF-16
ASTRAL_FIXED = ["\U0001F600", "\U0001F602", "\U00010000", "\U0010FFFF", "\U0001D11E", "\U00020000"]


def rand_char(rng):
    pool = rng.random()
    if pool < 0.30:
        return rng.choice(ASCII)
    if pool < 0.40:
        return rng.choice(CONTROLS)
    if pool < 0.45:
        return rng.choice(JSON_SPECIALS)
    if pool < 0.60:
        return chr(rng.randint(0xA0, 0xD7FF))  # Latin-1 .. Hangul: below the surrogates
    if pool < 0.75:
        return rng.choice(HIGH_BMP) if rng.random() < 0.3 else chr(rng.randint(0xE000, 0xFFFF))
    if pool < 0.90:
        return chr(rng.randint(0x1F300, 0x1FAFF))  # emoji
    return rng.choice(ASTRAL_FIXED) if rng.random() < 0.3 else chr(rng.randint(0x10000, 0x10FFFF))


def rand_string(rng, lo=0, hi=10):
    return "".join(rand_char(rng) for _ in range(rng.randint(lo, hi)))


def rand_key(rng):
    # Shared prefixes, then one character from above U+FFFF or from U+E000..U+FFFF: the pairs whose
    # UTF-16 order and byte order disagree.
    prefix = rng.choice(["", "", "a", "k_", "é", "\U0001F600", "\ufb33"])
    pivot = rng.choice([rng.choice(HIGH_BMP), chr(rng.randint(0xE000, 0xFFFF)), rng.choice(ASTRAL_FIXED),
                        chr(rng.randint(0x10000, 0x10FFFF)), rand_char(rng)])
    return prefix + pivot + rand_string(rng, 0, 3)


def rand_int(rng):
    r = rng.random()
    if r < 0.2:
        return rng.choice([0, 1, -1, TWO_53 - 1, -(TWO_53 - 1), TWO_53 - 2, 2 ** 31, -(2 ** 31), 2 ** 32])
    if r < 0.6:
        return rng.randint(-(TWO_53 - 1), TWO_53 - 1)
    return rng.randint(-1000, 1000)


def rand_value(rng, depth):
    r = rng.random()
    if depth < 4 and r < 0.15:
        return rand_object(rng, depth + 1)
    if depth < 4 and r < 0.25:
        return [rand_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    if r < 0.55:
        return rand_string(rng)
    if r < 0.85:
        return rand_int(rng)
    return rng.choice([True, False, None])


def rand_object(rng, depth):
    return {rand_key(rng): rand_value(rng, depth) for _ in range(rng.randint(0, 7))}


def rand_envelope(rng):
    env = {
        "v": 1,
        "tenant": str(uuid.UUID(int=rng.getrandbits(128), version=4)),
        "seq": rng.randint(1, TWO_53 - 1),
        "prev": "%064x" % rng.getrandbits(256),
        "type": rng.choice(["claim.submitted", "artifact.erased", "api_key.created", "tenant.created"]),
        "time": "2026-11-30T02:34:00.%06dZ" % rng.randint(0, 999999),
        "key_id": "ed25519:%016x" % rng.getrandbits(64),
        "principal": rand_string(rng, 1, 12),
        "payload": rand_object(rng, 1),
        "refs": rng.choice([{}, {"provider": {"event_hash": "%064x" % rng.getrandbits(256), "seq": rng.randint(1, 999),
                                              "tenant": "00000000-0000-0000-0000-000000000000"}}]),
    }
    for _ in range(rng.randint(0, 4)):  # extra members with non-ASCII names at the top level
        env[rand_key(rng)] = rand_value(rng, 1)
    items = list(env.items())
    rng.shuffle(items)  # input member order is irrelevant
    return dict(items)


def encode_line(rng, doc):
    style = rng.randrange(3)
    if style == 0:
        return json.dumps(doc, ensure_ascii=True)  # \uXXXX escapes, surrogate pairs for astral
    if style == 1:
        return json.dumps(doc, ensure_ascii=False)  # raw UTF-8
    return json.dumps(doc, ensure_ascii=False, separators=(" , ", " :\t"))  # odd whitespace


def test_random_envelopes_match_rfc8785_byte_for_byte():
    rng = random.Random(20200601)  # RFC 8785's publication month
    docs = [rand_envelope(rng) for _ in range(3000)]
    got, rc = canonicalize([encode_line(rng, d) for d in docs])
    mismatches = [(i, g, rfc8785.dumps(d)) for i, (d, g) in enumerate(zip(docs, got)) if g != rfc8785.dumps(d)]
    assert mismatches[:3] == []
    assert rc == 0
    # The corpus has power: in many documents, sorting by code point (or UTF-8 bytes) would be wrong.
    naive_wrong = sum(1 for d, g in zip(docs, got)
                      if json.dumps(d, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode() != g)
    utf16_vs_bytes = sum(1 for d in docs if _has_order_disagreement(d))
    assert naive_wrong >= 1000, naive_wrong
    assert utf16_vs_bytes >= 500, utf16_vs_bytes


def _has_order_disagreement(value):
    if isinstance(value, dict):
        keys = list(value)
        if sorted(keys) != sorted(keys, key=lambda k: k.encode("utf-16-be")):
            return True
        return any(_has_order_disagreement(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_order_disagreement(v) for v in value)
    return False


# --- Integers ---------------------------------------------------------------------------------

def test_integers_beyond_two_to_the_53_are_errors():
    too_big = ["9007199254740993", "-9007199254740993", "9223372036854775807", "-9223372036854775808",
               "18446744073709551615", "18446744073709551616", "-9223372036854775809",
               "100000000000000000000000000000"]
    docs = [f'{{"seq":{n}}}' for n in too_big] + ['{"seq":9007199254740991}', '{"seq":-9007199254740991}']
    got, rc = canonicalize(docs)
    assert rc == 2  # some lines failed
    assert got[:len(too_big)] == [f"error: integer {n} exceeds 2^53" for n in too_big]
    for n in too_big:
        with pytest.raises(rfc8785.IntegerDomainError):
            rfc8785.dumps({"seq": int(n)})
    assert got[len(too_big):] == [b'{"seq":9007199254740991}', b'{"seq":-9007199254740991}']
    assert got[len(too_big):] == [rfc8785.dumps({"seq": TWO_53 - 1}), rfc8785.dumps({"seq": -(TWO_53 - 1)})]


def test_two_to_the_53_itself_serializes_as_the_double_it_is():
    # oml accepts |n| <= 2^53 (each is exactly one double); the package stops at I-JSON's 2^53 - 1.
    # Both agree on the bytes of the double 2^53 (RFC 8785 Appendix B: 4340000000000000).
    got, rc = canonicalize([str(TWO_53), str(-TWO_53)])
    assert rc == 0
    assert got == [rfc8785.dumps(float(TWO_53)), rfc8785.dumps(float(-TWO_53))] == [b"9007199254740992",
                                                                                   b"-9007199254740992"]
    with pytest.raises(rfc8785.IntegerDomainError):
        rfc8785.dumps(TWO_53)


def test_every_line_gets_an_answer_and_errors_say_why():
    docs = ['{"a":1}', "", "not json", '{"a":1,"a":2}', "[" * 65 + "]" * 65, "[" * 64 + "]" * 64,
            b'"\xff"', '"\\ud800"', "[1e400]", "[NaN]"]
    got, rc = canonicalize(docs)
    assert rc == 2
    assert got[0] == b'{"a":1}'
    assert got[1].startswith("error: not JSON: ")
    assert got[2].startswith("error: not JSON: ")
    assert got[3] == 'error: duplicate member name "a"'
    assert got[4] == "error: JSON nests deeper than 64 levels"
    assert got[5] == b"[" * 64 + b"]" * 64
    assert all(g.startswith("error: not JSON: ") for g in got[6:]), got[6:]
    ok, rc = canonicalize(['{"b":[],"a":{}}'])
    assert (ok, rc) == ([b'{"a":{},"b":[]}'], 0)


# --- End to end: the signed bytes of real claims ------------------------------------------------

def test_signed_bytes_of_real_claims_with_non_ascii_fields_are_rfc8785(served):
    d = served
    principal = "Zoë 😀 \u2028 \U0001F9EA \ufb33"
    token = d.api_key("acme", "writer", principal)
    claims = [
        dict(body="héllo 😀", workarea_id="wa-é-😀", path="notes/über/😀\U0001F9EA.md",
             simulation_id="sim-\ufb33-\U0001F600", media_type="text/plain; charset=utf-8"),
        # (The API refuses C0 controls and DEL in metadata; C1 controls and U+2028 pass.)
        dict(body="x", workarea_id="wa-\u0080\u0085\u009f", path='a"b\\c/d\u2028g\ue000\U00010000.md',
             simulation_id="\uffff\U0010FFFF"),
        dict(body="y", workarea_id="工作区", path="ноты/ملاحظات/😀.md", provenance="agent"),
    ]
    for fields in claims:  # their simulations run first (admission/lifecycle.h)
        if "simulation_id" in fields:
            s = d.post("/v1/simulations", d.admin, json={"simulation_id": fields["simulation_id"]})
            assert s.status_code == 201, s.text
    for fields in claims:
        r = d.submit(token, **fields)
        assert r.status_code == 201, r.text
        signed = base64.b64decode(r.json()["receipt"]["signed_bytes"])
        env = json.loads(signed)
        assert signed == rfc8785.dumps(env)
        assert env["principal"] == principal
        for name in ("workarea_id", "path", "simulation_id", "media_type"):
            if name in fields:
                assert env["payload"][name] == fields[name]
    page = d.get("/v1/events?after=0&limit=1000", d.reviewer)  # a writer sees only its own events
    assert page.status_code == 200, page.text
    events = page.json()["events"]
    # genesis, 5 api_key.created, 2 simulation.started, 3 claims
    assert [e["seq"] for e in events] == list(range(1, 12))
    signed = [base64.b64decode(e["signed_bytes"]) for e in events]
    assert json.loads(signed[5])["payload"]["principal"] == principal  # this test's api_key.created
    for sb in signed:
        assert sb == rfc8785.dumps(json.loads(sb))
    # and `oml canonicalize` reproduces each from its parsed form, too
    got, rc = canonicalize([json.dumps(json.loads(sb)) for sb in signed])
    assert (got, rc) == (signed, 0)
