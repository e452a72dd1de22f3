"""The views under test, one set per database alias: each writes a Payment row with the ORM on that alias."""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.views import View
from rest_framework import viewsets
from rest_framework.decorators import api_view
from rest_framework.exceptions import NotFound
from rest_framework.exceptions import PermissionDenied as DRFPermissionDenied
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from idem_dialects import django as idem_django

from .models import Payment

CALLS: Counter[str] = Counter()  # view executions by "alias:view:key" (the live server runs in this process)
_calls_lock = threading.Lock()
EXPLODED: set[str] = set()
STARTED, GATE = threading.Event(), threading.Event()  # the gated view has begun / may finish


# The library's decorator: settings.IDEMPOTENCY's POLICY confines the middleware to /mw/, and the decorated views
# below are elsewhere (a decorator applies the policy's methods, not its paths).
idempotent = idem_django.idempotent


RUNS = "default"  # the database the big views record each of their runs in (`record_run`)
BIG_LEASE = timedelta(seconds=1)  # big-external's lease


def key_of(request: Any) -> str:
    return str(request.headers.get("Idempotency-Key") or "").strip(chr(34))


def ran(request: Any, alias: str, name: str) -> None:
    with _calls_lock:
        CALLS[f"{alias}:{name}:{key_of(request)}"] += 1


def run_account(name: str, key: str) -> str:
    return f"ran:{name}:{key}"


def record_run(request: Any, name: str) -> None:
    """A run of the view `name` for the request's key, as a Payment row in the "default" database, written in its own
    autocommit: outside the transaction a view on another alias runs in, so a run whose writes rolled back is still
    counted in a database (`Site.runs`; on the "default" alias itself, an atomic view's run rolls back with it)."""
    Payment.objects.using(RUNS).create(account=run_account(name, key_of(request)), amount=0)


def pay(request: Any, alias: str, account: str | None = None) -> Payment:
    payment = Payment.objects.using(alias).create(account=account or str(request.user), amount=request.data["amount"]
                                                  if hasattr(request, "data") else 1)
    if request.headers.get("X-Slow"):  # hold the transaction open a little: the concurrent duplicates overlap it
        time.sleep(float(request.headers["X-Slow"]))
    return payment


def views_for(alias: str) -> dict[str, Any]:
    class Payments(APIView):
        @idempotent(using=alias)
        def post(self, request: Request) -> Response:
            ran(request, alias, "payments")
            payment = pay(request, alias)
            return Response({"id": payment.pk, "account": payment.account, "note": "café ✓"}, status=201,
                            headers={"Location": f"/{alias}/payments/{payment.pk}", "X-Trace": "first"})

    class Explode(APIView):
        @idempotent(using=alias)
        def post(self, request: Request) -> Response:
            ran(request, alias, "explode")
            payment = pay(request, alias)
            key = f"{alias}:{request.headers['Idempotency-Key']}"
            if key not in EXPLODED:  # the first attempt raises after its write; a retry succeeds
                EXPLODED.add(key)
                raise RuntimeError("after the ORM write")
            return Response({"id": payment.pk}, status=201)

    class External(APIView):
        @idempotent(using=alias, lease=timedelta(seconds=30))
        def post(self, request: Request) -> Response:
            ran(request, alias, "external")
            payment = pay(request, alias)
            return Response({"id": payment.pk}, status=201)

    class Gated(APIView):
        """An external call in progress until the test opens the gate."""

        @idempotent(using=alias, lease=timedelta(seconds=30))
        def post(self, request: Request) -> Response:
            ran(request, alias, "gated")
            STARTED.set()
            assert GATE.wait(60)
            return Response({"charged": 1}, status=201)

    class Crash(APIView):
        """Writes, then (once, when the test asks through a file) tells its pid and waits to be killed."""

        @idempotent(using=alias)
        def post(self, request: Request) -> Response:
            payment = pay(request, alias)
            flag = Path(os.environ.get("IDEM_CRASH_FLAG", "/nonexistent"))
            if flag.exists():
                flag.unlink()
                Path(f"{flag}.pid").write_text(str(os.getpid()))
                time.sleep(120)
            return Response({"id": payment.pk}, status=201)

    class Accounts(viewsets.ViewSet):
        @idempotent(using=alias)
        def create(self, request: Request) -> Response:
            ran(request, alias, "viewset")
            return Response({"id": pay(request, alias).pk}, status=201)

    @api_view(["POST"])
    @idempotent(using=alias)
    def api_function(request: Request) -> Response:
        ran(request, alias, "api_view")
        return Response({"id": pay(request, alias).pk}, status=201)

    @idempotent(using=alias, scope=lambda request: request.headers.get("X-Account"))
    def function(request: HttpRequest) -> JsonResponse:
        ran(request, alias, "function")
        return JsonResponse({"id": pay(request, alias, request.headers["X-Account"]).pk}, status=201)

    @idempotent(using=alias, scope=lambda request: request.headers.get("X-Account"))
    def ledger(request: HttpRequest) -> JsonResponse:
        """Serves reads too: only POST and PATCH (the policy's methods) take part."""
        ran(request, alias, f"ledger-{request.method}")
        if request.method == "POST":
            return JsonResponse({"id": pay(request, alias, request.headers["X-Account"]).pk}, status=201)
        return JsonResponse({"payments": Payment.objects.using(alias).count()})

    @idempotent(using=alias, scope=lambda request: request.headers.get("X-Account"))
    def refuse(request: HttpRequest) -> JsonResponse:
        """Answers by raising Django's HTTP exception, after a write."""
        ran(request, alias, "refuse")
        pay(request, alias, request.headers["X-Account"])
        raise PermissionDenied("over the limit")

    class Missing(APIView):
        @idempotent(using=alias)
        def post(self, request: Request) -> Response:
            """Answers by raising DRF's HTTP exception, after a write."""
            ran(request, alias, "missing")
            pay(request, alias)
            raise NotFound("no such order")

    @idempotent(using=alias, scope=lambda request: request.headers.get("X-Account"), max_response_bytes=1 << 26)
    def big(request: HttpRequest) -> HttpResponse:
        """A response of X-Size bytes (the database's statement limit may be below the policy's), after a write in
        the record's transaction; its run recorded apart (`record_run`)."""
        ran(request, alias, "big")
        record_run(request, "big")
        pay(request, alias, request.headers["X-Account"])
        return HttpResponse(b"x" * int(request.headers["X-Size"]), status=201)

    @idempotent(using=alias, scope=lambda request: request.headers.get("X-Account"), max_response_bytes=1 << 26,
                lease=BIG_LEASE)
    def big_external(request: HttpRequest) -> HttpResponse:
        """The same in lease mode: its write is its own (no transaction holds it), as an external call's would be."""
        ran(request, alias, "big-external")
        record_run(request, "big-external")
        pay(request, alias, request.headers["X-Account"])
        return HttpResponse(b"x" * int(request.headers["X-Size"]), status=201)

    class ClassBased(View):
        def post(self, request: HttpRequest) -> JsonResponse:
            ran(request, alias, "class")
            return JsonResponse({"id": pay(request, alias, request.headers["X-Account"]).pk}, status=201)

    return {"payments": Payments.as_view(), "explode": Explode.as_view(), "external": External.as_view(),
            "gated": Gated.as_view(), "crash": Crash.as_view(), "viewset": Accounts.as_view({"post": "create"}),
            "api_view": api_function, "function": function, "ledger": ledger, "refuse": refuse,
            "missing": Missing.as_view(), "big": big, "big-external": big_external,
            "class": idempotent(using=alias, scope=lambda r: r.headers.get("X-Account"))(ClassBased.as_view())}


def middleware_payments(request: HttpRequest) -> JsonResponse:
    """Under /mw/: made idempotent by IdempotencyMiddleware (settings.IDEMPOTENCY), the caller from X-Remote-User."""
    alias = settings.IDEMPOTENCY["DATABASE"]
    ran(request, alias, "middleware")
    if request.headers.get("X-Explode"):
        Payment.objects.using(alias).create(account=str(request.user), amount=0)
        raise RuntimeError("after the ORM write")
    if request.headers.get("X-Refuse"):
        Payment.objects.using(alias).create(account=str(request.user), amount=0)
        raise PermissionDenied("over the limit")
    payment = Payment.objects.using(alias).create(account=str(request.user), amount=1)
    return JsonResponse({"id": payment.pk, "user": str(request.user)}, status=201)


EVENTS_GATE = threading.Event()  # the stream's second event waits for the client to have read the first
EVENTS_SEEN: list[bool] = []


def middleware_events(request: HttpRequest) -> StreamingHttpResponse:
    """Under /mw/: server-sent events, a stream the middleware passes through (and does not store)."""
    ran(request, settings.IDEMPOTENCY["DATABASE"], "middleware-events")

    def events() -> Any:
        yield b"data: first\n\n"
        EVENTS_SEEN.append(EVENTS_GATE.wait(30))
        yield b"data: second\n\n"

    return StreamingHttpResponse(events(), content_type="text/event-stream")


class MiddlewareRefusal(APIView):
    """Under /mw/: a DRF view that answers by raising DRF's HTTP exception after a write (DRF answers it itself)."""

    authentication_classes: list[Any] = []
    permission_classes: list[Any] = []

    def post(self, request: Request) -> Response:
        alias = settings.IDEMPOTENCY["DATABASE"]
        ran(request, alias, "middleware-drf")
        Payment.objects.using(alias).create(account=str(request.user), amount=0)
        raise DRFPermissionDenied("over the limit")  # 403: a 404 under middleware may be a router's, never stored


async def middleware_async_payments(request: HttpRequest) -> JsonResponse:
    """An async view under /mw/: Django runs it from the sync middleware chain; its ORM calls come back to the thread
    (and the connection) that holds the record's transaction."""
    alias = settings.IDEMPOTENCY["DATABASE"]
    payment = await Payment.objects.using(alias).acreate(account="async", amount=1)
    if request.headers.get("X-Explode"):
        raise RuntimeError("after the ORM write")
    return JsonResponse({"id": payment.pk}, status=201)
