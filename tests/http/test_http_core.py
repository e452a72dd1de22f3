"""The HTTP-neutral core: header parsing, the request fingerprint, what is stored and replayed, problems."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections.abc import Callable

import pytest
import rfc8785

from idem_dialects import ConfigurationError, LeaseLost, RequestInFlight, RequestMismatch, RetriesExhausted
from idem_dialects.http import HttpRequest, HttpResponse, IdempotencyPolicy, KeyHeaderError, parse_key_header, prepare
from idem_dialects.http.core import Call, decode_stored, encode_stored
from idem_dialects.http.identity import body_digest, canonical_json
from idem_dialects.http.problems import error_problem

POLICY = IdempotencyPolicy(scope=lambda r: r.header("x-account"))


@pytest.mark.parametrize(("value", "key"), [
    ('"8e03978e-40d5-43e8-bc93-6894a57f9324"', "8e03978e-40d5-43e8-bc93-6894a57f9324"),
    ('  "a b"  ', "a b"),
    (r'"quote \" and backslash \\"', 'quote " and backslash \\'),
    ('"k";v=1;flag', "k"),  # RFC 8941 parameters are ignored
])
def test_structured_field_strings_parse(value: str, key: str) -> None:
    assert parse_key_header([value]) == key


@pytest.mark.parametrize("value", ['"open', '"a", "b"', r'"bad \n escape"', '"tab\there"', '"é"',
                                   "", '"k" trailing', "two words", 'half"quoted', "é", '" "', '""', '"  ";p=1',
                                   ",", ",,", "k,", ",k", "a,,b"])
def test_malformed_keys_are_refused(value: str) -> None:
    with pytest.raises(KeyHeaderError):
        parse_key_header([value])


@pytest.mark.parametrize("bare", ["8e03978e-40d5-43e8-bc93-6894a57f9324", "1e4a0c5e-0000-4000-8000-000000000000",
                                  "abc-123:x/y", "key_with;semicolon,comma", "42"])
def test_bare_keys_are_the_same_key_as_their_quoted_form(bare: str) -> None:
    assert parse_key_header([bare]) == parse_key_header([f'"{bare}"']) == bare


def test_strict_parsing_refuses_bare_keys_and_two_field_lines_are_refused() -> None:
    with pytest.raises(KeyHeaderError, match="double quotes"):
        parse_key_header(["8e03978e-40d5"], allow_token=False)
    assert parse_key_header(['"8e03978e-40d5"'], allow_token=False) == "8e03978e-40d5"
    assert parse_key_header([]) is None
    with pytest.raises(KeyHeaderError, match="more than once"):
        parse_key_header(['"a"', '"b"'])


def test_json_bodies_compare_canonically_and_others_by_bytes() -> None:
    assert body_digest("application/json", b'{"a": 1, "b": [1.0, "x"]}') == \
        body_digest("application/json; charset=utf-8", b'{"b":[1,"x"],"a":1}')
    assert body_digest("application/merge-patch+json", b'{"a":1}') == body_digest("application/json", b'{ "a" : 1 }')
    assert body_digest("text/plain", b'{"a":1}') != body_digest("text/plain", b'{ "a":1}')
    assert "bytes" in body_digest("application/json", b"[" * 100_000)  # too deep to parse: compared as bytes
    # Beyond what JCS represents: compared as bytes rather than refused.
    assert body_digest("application/json", b'{"n": 18446744073709551617}') == {
        "bytes": body_digest("text/plain", b'{"n": 18446744073709551617}')["bytes"]}


def test_forms_compare_by_their_fields_not_their_encoding() -> None:
    form = "application/x-www-form-urlencoded"
    assert body_digest(form, b"note=caf%C3%A9+ok&n=5") == body_digest(form, b"note=caf%c3%a9%20ok&n=5") \
        == body_digest(form, "note=café ok&n=5".encode())
    assert body_digest(form, b"n=5&note=x") != body_digest(form, b"note=x&n=5")  # field order is the client's
    assert body_digest(form, b"n=5") != body_digest(form, b"n=6")

    def multipart(boundary: str, amount: bytes) -> tuple[str, bytes]:
        body = (f"--{boundary}\r\nContent-Disposition: form-data; name=amount\r\n\r\n".encode() + amount
                + f"\r\n--{boundary}\r\nContent-Disposition: form-data; name=f; filename=r.txt\r\n"
                  f"Content-Type: text/plain\r\n\r\n--x\r\n\r\n--{boundary}--\r\n".encode())
        return f"multipart/form-data; boundary={boundary}", body

    assert body_digest(*multipart("a1", b"5")) == body_digest(*multipart("zz9", b"5"))
    assert "multipart" in body_digest(*multipart("a1", b"5"))
    assert body_digest(*multipart("a1", b"5")) != body_digest(*multipart("a1", b"6"))
    truncated = multipart("a1", b"5")[1][:-12]
    assert "bytes" in body_digest("multipart/form-data; boundary=a1", truncated)  # does not parse: its bytes


@pytest.mark.parametrize("body", [
    b'{"b":1,"a":[1,2,{"\\u00e9":"x","e":null,"E":true}]}', b'{"\\ud83d\\ude00":1,"\\uffff":2,"\\ue000":3}',
    '{"😀":1,"\uffff":2}'.encode(), b'{"n": 18446744073709551617}', b'{"n": 9007199254740991}', b'{"x": -0}',
    b'[NaN]', b'[Infinity]', b'{"a": "\\udc00"}', b' "x\\u2028\\u001f\\t/" ', b'{"a":1,"a":2}', b"1e400",
    b"[1.0, 0.1, 1e21, -0.0]", b'{"a": 1', b"", b"\xef\xbb\xbf{}", b'{"k":"\x00"}', b"[" * 100_000])
def test_json_bodies_canonicalize_as_rfc8785_does(body: bytes) -> None:
    """The standard library's fast form of a JSON body is byte for byte RFC 8785's, or the body goes through rfc8785."""
    assert _canonical_or_error(canonical_json, body) == _canonical_or_error(_jcs, body)


def test_random_json_bodies_canonicalize_as_rfc8785_does() -> None:
    rnd = random.Random(8785)
    chars = ["a", "Z", "0", " ", '"', "\\", "\n", "\x01", "\x7f", "é", "中", "\ue000", "\uffff", "😀", "\ud800", "/"]

    def value(depth: int = 0) -> object:
        kind = rnd.randint(0, 9 if depth < 4 else 5)
        if kind < 2:
            return [None, True, False][rnd.randint(0, 2)]
        if kind == 2:
            return rnd.choice([0, -1, 7, 2**53 - 1, -(2**53 - 1), 2**53, 10**20, 10**15])
        if kind == 3:
            return rnd.choice([0.0, -0.0, 1.5, 1e21, 1e-7, 3.0])
        if kind < 6:
            return "".join(rnd.choice(chars) for _ in range(rnd.randint(0, 4)))
        if kind < 8:
            return [value(depth + 1) for _ in range(rnd.randint(0, 3))]
        return {"".join(rnd.choice(chars) for _ in range(rnd.randint(0, 3))): value(depth + 1)
                for _ in range(rnd.randint(0, 4))}

    for _ in range(3000):
        text = json.dumps(value(), ensure_ascii=rnd.random() < 0.5, indent=rnd.choice([None, 1]))
        body = text.encode("utf-8", "surrogatepass")
        assert _canonical_or_error(canonical_json, body) == _canonical_or_error(_jcs, body), body


def _jcs(body: bytes) -> bytes:
    return rfc8785.dumps(json.loads(body))


def _canonical_or_error(canonical: Callable[[bytes], bytes], body: bytes) -> bytes | None:
    try:
        return canonical(body)
    except (ValueError, RecursionError):
        return None


def test_content_encoding_is_stored_whatever_the_allow_list() -> None:
    policy = IdempotencyPolicy(global_scope=True, replay_headers=("content-type",))
    stored = encode_stored(policy, HttpResponse(201, [("Content-Encoding", "gzip"), ("X-Other", "1")], b"\x1f\x8b"))
    replay = decode_stored(policy, stored, 201)
    assert replay.header("content-encoding") == "gzip" and replay.header("x-other") is None


def test_the_fingerprint_covers_method_path_and_chosen_headers() -> None:
    policy = IdempotencyPolicy(scope=lambda r: "s", fingerprint_headers=("X-Currency",))

    def call(method: str, path: str, currency: str) -> Call:
        req = HttpRequest(method, path, [("idempotency-key", '"k"'), ("x-currency", currency),
                                          ("content-type", "application/json")], body=b"{}")
        out = prepare(policy, req)
        assert isinstance(out, Call)
        return out

    base = call("POST", "/pay", "EUR")
    assert base.request == {"method": "POST", "path": "/pay", "headers": {"x-currency": "EUR"},
                            "body": body_digest("application/json", b"{}")}
    assert call("PATCH", "/pay", "EUR").request != base.request
    assert call("POST", "/pay/2", "EUR").request != base.request
    assert call("POST", "/pay", "USD").request != base.request
    with_query = prepare(policy, HttpRequest("POST", "/pay", [("idempotency-key", '"k"'), ("x-currency", "EUR"),
                                                              ("content-type", "application/json")], body=b"{}",
                                             query="dry_run=1"))
    assert isinstance(with_query, Call) and with_query.request["path"] == "/pay?dry_run=1"


def test_scope_is_required_unless_global() -> None:
    with pytest.raises(ConfigurationError, match="scope="):
        IdempotencyPolicy()
    glob = prepare(IdempotencyPolicy(global_scope=True), HttpRequest("POST", "/", [("idempotency-key", '"k"')]))
    assert isinstance(glob, Call) and glob.scope == "global"
    numeric = prepare(IdempotencyPolicy(scope=lambda r: 42), HttpRequest("POST", "/", [("idempotency-key", '"k"')]))
    assert isinstance(numeric, Call) and numeric.scope == "42"
    anonymous = prepare(POLICY, HttpRequest("POST", "/", [("idempotency-key", '"k"')]))
    assert isinstance(anonymous, HttpResponse) and anonymous.status == 401


def test_missing_key_and_oversized_body_are_problems() -> None:
    missing = prepare(POLICY, HttpRequest("POST", "/pay", [("x-account", "1")]))
    assert isinstance(missing, HttpResponse) and missing.status == 400
    doc = json.loads(missing.body)
    assert doc["type"] == "https://idem-dialects.readthedocs.io/en/latest/http.html#missing-key"
    assert missing.header("content-type") == "application/problem+json"
    optional = IdempotencyPolicy(scope=lambda r: "s", require_key=False)
    assert prepare(optional, HttpRequest("POST", "/pay", [])) is None
    big = prepare(POLICY, HttpRequest("POST", "/", [("idempotency-key", '"k"'), ("x-account", "1")],
                                      body_too_large=True))
    assert isinstance(big, HttpResponse) and big.status == 413


def test_stored_response_keeps_body_bytes_and_only_allowed_headers() -> None:
    body = b"\x00\xffnot json\n\nlines"
    resp = HttpResponse(201, [("Location", "/p/1"), ("Set-Cookie", "secret=1"), ("Content-Type", "x/y")], body)
    replay = decode_stored(POLICY, encode_stored(POLICY, resp), 201)
    assert replay.body == body and replay.status == 201
    assert replay.headers == [("location", "/p/1"), ("content-type", "x/y"), ("Idempotent-Replayed", "true")]


def test_library_errors_map_to_their_problems() -> None:
    cases = [
        (RequestMismatch("s", "o", "k", "a", "b"), 422, "request-mismatch"),
        (RequestInFlight("s", "o", "k", 2.2), 409, "request-in-flight"),
        (LeaseLost("s", "o", "k", "token-xyz"), 409, "lease-lost"),
        (RetriesExhausted(3, 1.0, {"busy": 3}, RuntimeError("x")), 503, "retries-exhausted"),
    ]
    for exc, status, slug in cases:
        resp = error_problem(exc, base="urn:t:")
        doc = json.loads(resp.body)
        assert (resp.status, doc["type"], doc["status"]) == (status, "urn:t:" + slug, status)
        assert exc.http_status == status
        assert b"token-xyz" not in resp.body
    assert error_problem(RequestInFlight("s", "o", "k", 2.2), base="").header("retry-after") == "3"


def test_importing_the_http_package_imports_no_framework() -> None:
    code = ("import sys, idem_dialects.http, idem_dialects.http.asgi, idem_dialects.http.wsgi;"
            "print(sorted(m for m in ('flask', 'fastapi', 'starlette', 'werkzeug', 'uvicorn') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_default_stored_statuses() -> None:
    from idem_dialects.http.policy import default_framework_status, default_store_status

    assert [s for s in (200, 201, 204, 303, 400, 404, 409, 422) if default_store_status(s)] == \
        [200, 201, 204, 303, 400, 404, 409, 422]
    assert not any(default_store_status(s) for s in (408, 425, 429, 500, 502, 503, 504, 599))
    assert [s for s in (201, 301, 307, 308, 400, 404, 405, 409, 422) if default_framework_status(s)] == \
        [301, 307, 308, 400, 404, 405, 422]


def test_every_problem_type_has_its_section_in_the_http_docs() -> None:
    from pathlib import Path

    from idem_dialects.http.problems import PROBLEM_BASE, SLUGS

    page = (Path(__file__).resolve().parents[2] / "docs" / "http.md").read_text()
    assert PROBLEM_BASE.endswith("/http.html#")
    for slug in SLUGS:
        doc = json.loads(POLICY.problem(slug, 400, "d").body)
        assert doc["type"] == PROBLEM_BASE + slug
        assert f"({slug})=\n#" in page, f"docs/http.md has no section anchored {slug!r}"


def test_header_and_marker_names_are_configurable() -> None:
    policy = IdempotencyPolicy(global_scope=True, header="X-Request-Key", allow_token=True,
                               replay_marker=("X-Replayed", "1"))
    call = prepare(policy, HttpRequest("POST", "/", [("x-request-key", "tok-1"), ("idempotency-key", '"other"')]))
    assert isinstance(call, Call) and call.key == "tok-1"
    replay = decode_stored(policy, encode_stored(policy, HttpResponse(200, [], b"ok")), 200)
    assert replay.header("x-replayed") == "1" and replay.header("idempotent-replayed") is None
