from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from idem_dialects.django import idempotent

from .models import Payment


class PaymentSerializer(serializers.ModelSerializer):
    class Meta:
        model = Payment
        fields = ["id", "amount", "created"]


class PaymentList(APIView):
    def get(self, request: Request) -> Response:
        payments = Payment.objects.filter(owner=request.user).order_by("id")
        return Response(PaymentSerializer(payments, many=True).data)

    @idempotent()  # the Idempotency-Key's record commits in the same transaction as Payment.objects.create
    def post(self, request: Request) -> Response:
        serializer = PaymentSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        payment = serializer.save(owner=request.user)
        return Response(PaymentSerializer(payment).data, status=201, headers={"Location": f"/payments/{payment.pk}"})
