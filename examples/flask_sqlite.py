"""Flask on SQLite (or any engine: DATABASE_URL): POST /payments runs once per Idempotency-Key; every retry gets the
stored answer.

    python examples/flask_sqlite.py            # http://127.0.0.1:5000
    gunicorn -w 4 --chdir examples 'flask_sqlite:create_app()'   # DATABASE_URL=sqlite:///payments.db by default
    curl -X POST localhost:5000/payments -H 'X-Account: 1' -H 'Idempotency-Key: "pay-42"' \\
         -H 'Content-Type: application/json' -d '{"amount": 100}'

The payment row and the idempotency record commit in one transaction (`current_connection()`).
X-Account stands in for your authentication: the scope must come from who the caller is, never from the body.
"""

from __future__ import annotations

import os

from flask import Flask, request
from sqlalchemy import Column, Integer, MetaData, String, Table, insert
from sqlalchemy.schema import CreateTable

from idem_dialects import IdempotencyStore
from idem_dialects.http import IdempotencyPolicy, current_connection
from idem_dialects.http.flask import idempotent_view

# Declared with SQLAlchemy, so the same code creates it on SQLite, PostgreSQL or MariaDB (the id numbered by each).
payments = Table("payments", MetaData(),
                 Column("id", Integer, primary_key=True),
                 Column("account", String(64), nullable=False),
                 Column("amount", Integer, nullable=False))


def create_app(url: str | None = None) -> Flask:
    store = IdempotencyStore.from_url(url or os.environ.get("DATABASE_URL", "sqlite:///payments.db"))
    store.create_tables()
    with store.engine.begin() as conn:  # workers start together: IF NOT EXISTS lets each of them run this
        conn.execute(CreateTable(payments, if_not_exists=True))
    idempotent = idempotent_view(store, IdempotencyPolicy(scope=lambda r: r.header("x-account")))
    app = Flask(__name__)

    @app.post("/payments")
    @idempotent
    def pay() -> tuple[dict[str, int], int, dict[str, str]]:
        amount = int(request.get_json()["amount"])
        row = current_connection().execute(insert(payments).values(account=request.headers["X-Account"],
                                                                    amount=amount))
        payment_id = int(row.inserted_primary_key[0])
        return {"id": payment_id, "amount": amount}, 201, {"Location": f"/payments/{payment_id}"}

    return app


if __name__ == "__main__":
    create_app().run()
