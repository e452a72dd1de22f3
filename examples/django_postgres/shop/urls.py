from django.urls import path
from payments.views import PaymentList

urlpatterns = [path("payments/", PaymentList.as_view())]
