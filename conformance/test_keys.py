"""Checks: keys compare byte for byte - case, accents, normalization forms, whitespace, 4-byte characters and the
255-character limit - whatever the database's default collation; the stored identity reads back exactly."""

from __future__ import annotations

import itertools
import unicodedata
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from sqlalchemy import event, inspect, select

from idem_dialects import IdempotencyStore, InvalidKey

REQ = {"amount": 100}
Observe = Callable[[str, object], None]

CASE = ["checkout-42", "Checkout-42", "CHECKOUT-42", "straße", "strasse", "STRASSE", "i", "I",
        "\u0131", "\u0130"]  # dotless and dotted i
ACCENTS = ["resume", "résumé", "resumé", "e", "é", "è", "ê", "ë", "a", "å", "ä", "æ", "ae", "o", "ø", "œ", "oe"]
NORMALIZATION = [
    unicodedata.normalize("NFC", "café"), unicodedata.normalize("NFD", "café"),
    "\u00c5", "A\u030a", "\u212b",  # Å precomposed, decomposed, and the Angstrom sign
    "\ufb01", "fi", "\u2460", "1", "\uff4b", "k",  # fi ligature, circled 1, fullwidth k: NFKC would fold them
]
WHITESPACE = ["k", " k", "k ", "k  ", "\tk", "k\t", "k\n", "a b", "a  b", "ab", "a\u00a0b", "k\u3000", "k\u200b"]
FOUR_BYTE = ["😀", "😁", "😀😀", "\U0001d49c", "\U0002070e", "\U0001f600x", "x\U0001f600", "\ufffd", "?"]
LONG = ["x" * 255, "x" * 254, "é" * 255, "é" * 254, "😀" * 255, "😀" * 254, "😀" * 254 + "😁"]


def assert_distinct(store: IdempotencyStore, keys: Sequence[str], *, field: str = "key") -> None:
    """Each key is its own record: a first run executes, a second replays that key's own response, and the
    stored identities read back exactly as written."""
    assert len(set(keys)) == len(keys)
    runs = itertools.count()

    def call(value: str) -> Any:
        args: dict[str, Any] = dict(scope="s", operation="op", key="k", request=REQ)
        args[field] = value
        return store.run(**args, effect=lambda conn: {"value": value, "run": next(runs)})

    for value in keys:
        result = call(value)
        assert not result.replayed, f"{field} {value!r} matched an earlier, different {field}: {result.response!r}"
    for value in keys:
        again = call(value)
        assert again.replayed and again.response["value"] == value, f"{field} {value!r} replayed {again.response!r}"
    column = {"key": "idem_key"}.get(field, field)
    with store.engine.connect() as conn:
        stored = [row[0] for row in conn.execute(select(store.tables.records.c[column]))]
    assert sorted(stored) == sorted(keys), "stored identities do not read back byte for byte"


def test_keys_differing_in_case_are_distinct(idem_store: IdempotencyStore) -> None:
    """Keys that differ only in letter case (including ß/SS and dotted/dotless i) are different keys."""
    assert_distinct(idem_store, CASE)


def test_keys_differing_in_accents_are_distinct(idem_store: IdempotencyStore) -> None:
    """Keys that differ only in accents or ligatures (e/é, a/å, æ/ae) are different keys."""
    assert_distinct(idem_store, ACCENTS)


def test_keys_in_different_normalization_forms_are_distinct(idem_store: IdempotencyStore) -> None:
    """NFC and NFD spellings (and compatibility forms such as ﬁ/fi) of one text are different keys: no folding."""
    assert_distinct(idem_store, NORMALIZATION)


def test_keys_differing_in_whitespace_are_distinct(idem_store: IdempotencyStore) -> None:
    """Leading, trailing (no PAD SPACE) and inner whitespace, tabs, NBSP and zero-width spaces make different keys."""
    assert_distinct(idem_store, WHITESPACE)


def test_keys_with_four_byte_characters_are_distinct(idem_store: IdempotencyStore) -> None:
    """Characters outside the BMP (emoji, math letters, CJK Ext. B) are stored and compared exactly, never as '?'."""
    assert_distinct(idem_store, FOUR_BYTE)


def test_key_length_limit_is_255_characters(idem_store: IdempotencyStore) -> None:
    """Keys of exactly 255 characters (1-, 2- and 4-byte) are stored and distinct; 256 characters are rejected
    with InvalidKey before any SQL runs."""
    assert_distinct(idem_store, LONG)
    statements: list[str] = []
    event.listen(idem_store.engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
    for value in ["x" * 256, "😀" * 256]:
        with pytest.raises(InvalidKey) as err:
            idem_store.run(scope="s", operation="op", key=value, request=REQ, effect=lambda conn: 1)
        assert err.value.field == "key" and "255" in err.value.rule
    assert statements == []


def test_scope_and_operation_compare_byte_exact(idem_store: IdempotencyStore) -> None:
    """Scope and operation compare byte for byte too (case, trailing space, NFD, 4-byte, 255 characters)."""
    variants = ["acct:1", "Acct:1", "acct:1 ", unicodedata.normalize("NFD", "é"), "é", "😀", "😀" * 255]
    assert_distinct(idem_store, variants, field="scope")
    with idem_store.engine.begin() as conn:
        conn.execute(idem_store.tables.records.delete())
    assert_distinct(idem_store, variants, field="operation")


def test_message_ids_compare_byte_exact(idem_store: IdempotencyStore) -> None:
    """Processed-message ids and subscribers compare byte for byte: each variant is accepted once."""
    variants = ["m-1", "M-1", "m-1 ", " m-1", unicodedata.normalize("NFD", "mé"), "mé", "m😀", "m😁", "m" * 255]
    for subscriber in ["sub", "Sub"]:
        for message_id in variants:
            with idem_store.transaction() as conn:
                accepted = idem_store.accept_message(conn, subscriber=subscriber, message_id=message_id)
            assert accepted, f"{subscriber!r}/{message_id!r} was taken for an earlier message id"
    for subscriber in ["sub", "Sub"]:
        for message_id in variants:
            with idem_store.transaction() as conn:
                assert not idem_store.accept_message(conn, subscriber=subscriber, message_id=message_id)
    with idem_store.engine.connect() as conn:
        stored = {(r.subscriber, r.message_id) for r in conn.execute(select(idem_store.tables.messages))}
    assert stored == {(s, m) for s in ["sub", "Sub"] for m in variants}


def test_key_column_declares_byte_exact_type(idem_store: IdempotencyStore, idem_observe: Observe) -> None:
    """The key columns exist as the backend declares them; every variant above coexists in one table and reads
    back exactly (records the declared and reflected key column type and collation)."""
    keys = list(dict.fromkeys(CASE + ACCENTS + NORMALIZATION + WHITESPACE + FOUR_BYTE + LONG))
    assert_distinct(idem_store, keys)
    column = idem_store.tables.records.c.idem_key
    idem_observe("key column (declared DDL)", column.type.compile(dialect=idem_store.engine.dialect))
    reflected = {c["name"].lower(): c for c in inspect(idem_store.engine).get_columns(idem_store.tables.records.name)}
    found = reflected.get("idem_key")
    assert found is not None, f"no idem_key column among {sorted(reflected)}"
    kind = found["type"]
    collation = getattr(kind, "collation", None) or found.get("collation")
    idem_observe("key column (reflected)", f"{kind!r}" + (f" collate {collation}" if collation else ""))
