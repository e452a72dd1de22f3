"""The FastAPI route class documents what the idempotency layer adds to a route: the key header, required or optional
as the policy says, and the layer's problem responses; routes the policy leaves out are documented as they are."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the [fastapi] extra is not installed")
pytest.importorskip("aiosqlite", reason="the [aiosqlite] extra is not installed")

from fastapi import APIRouter, FastAPI

from idem_dialects import AsyncIdempotencyStore
from idem_dialects.http import IdempotencyPolicy
from idem_dialects.http.fastapi import idempotent_route


def schema(tmp_path: Path, policy: IdempotencyPolicy) -> dict[str, Any]:
    store = AsyncIdempotencyStore.from_url(f"sqlite+aiosqlite:///{tmp_path / 'o.db'}")  # never connects here
    router = APIRouter(route_class=idempotent_route(store, policy))

    async def create() -> dict[str, int]:
        return {"id": 1}

    async def read() -> dict[str, int]:
        return {"id": 1}

    router.add_api_route("/items", create, methods=["POST"], status_code=201,
                         responses={409: {"description": "the handler's own conflict"}})
    router.add_api_route("/items", read, methods=["GET"])
    app = FastAPI()
    app.include_router(router)
    paths: dict[str, Any] = app.openapi()["paths"]["/items"]
    return paths


@pytest.mark.parametrize("required", [True, False])
def test_the_key_header_is_documented_required_or_optional(tmp_path: Path, required: bool) -> None:
    paths = schema(tmp_path, IdempotencyPolicy(global_scope=True, require_key=required, header="Idempotency-Key"))
    post = paths["post"]
    assert [(p["name"], p["in"], p["required"]) for p in post["parameters"]] == \
        [("Idempotency-Key", "header", required)]
    assert post["responses"]["400"]["content"].keys() == {"application/problem+json"}
    assert post["responses"]["422"]["content"].keys() == {"application/problem+json"}
    assert post["responses"]["409"]["description"] == "the handler's own conflict"  # the route's own wins
    assert "parameters" not in paths["get"] and "400" not in paths["get"]["responses"]  # GET is not idempotent here
