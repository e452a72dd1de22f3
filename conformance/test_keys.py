"""Checks: keys compare byte for byte - case, accents, normalization forms, whitespace, 4-byte characters and the
255-character limit - whatever the database's default collation; the stored identity reads back exactly."""

from __future__ import annotations

import itertools
import unicodedata
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from sqlalchemy import inspect, select

from idem_dialects import IdempotencyStore, InvalidKey

from .support import StatementLog

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


def test_key_length_limit_is_255_characters(idem_make_store: Callable[..., IdempotencyStore]) -> None:
    """Keys of exactly 255 characters (1-, 2- and 4-byte) are stored and distinct; 256 characters are rejected
    with InvalidKey before any SQL runs."""
    statements = StatementLog()
    store = idem_make_store(statement_hook=statements)
    assert_distinct(store, LONG)
    statements.sql.clear()
    for value in ["x" * 256, "😀" * 256]:
        with pytest.raises(InvalidKey) as err:
            store.run(scope="s", operation="op", key=value, request=REQ, effect=lambda conn: 1)
        assert err.value.field == "key" and "255" in err.value.rule
    assert statements.sql == []


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


def test_identity_size_limit_is_the_same_on_every_engine(idem_make_store: Callable[..., IdempotencyStore]) -> None:
    """The widest identity (scope, operation and key of 255 four-byte characters each) raises InvalidKey naming the
    1700-byte limit before any SQL, on every engine alike; an identity of exactly 1700 bytes completes and replays."""
    from idem_dialects.keys import MAX_IDENTITY_BYTES

    wide = "😀" * 255  # 1020 bytes of UTF-8
    statements = StatementLog()
    idem_store = idem_make_store(statement_hook=statements)
    statements.sql.clear()
    with pytest.raises(InvalidKey, match=str(MAX_IDENTITY_BYTES)):
        idem_store.run(scope=wide, operation=wide, key=wide, request=REQ, effect=lambda conn: "never")
    with pytest.raises(InvalidKey, match=str(MAX_IDENTITY_BYTES)), idem_store.transaction() as conn:
        statements.sql.clear()  # the transaction's own BEGIN, where the engine sends one
        idem_store.accept_message(conn, subscriber=wide, message_id=wide)
    assert statements.sql == [], "SQL ran for an identity beyond the limit"
    fill = "😀" * 169 + "abc"  # 679 bytes: 1020 + 1 + 679 = MAX_IDENTITY_BYTES
    assert len((wide + "o" + fill).encode()) == MAX_IDENTITY_BYTES
    first = idem_store.run(scope=wide, operation="o", key=fill, request=REQ, effect=lambda conn: "done")
    assert first.response == "done"
    again = idem_store.run(scope=wide, operation="o", key=fill, request=REQ, effect=lambda conn: "never")
    assert again.replayed and again.response == "done"
    with idem_store.transaction() as conn:
        assert idem_store.accept_message(conn, subscriber=wide, message_id="m" + fill)
    with idem_store.engine.connect() as conn:
        records = idem_store.tables.records
        assert conn.execute(select(records.c.scope, records.c.idem_key)).all() == [(wide, fill)]
