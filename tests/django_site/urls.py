from django.conf import settings
from django.urls import path

from .views import MiddlewareRefusal, middleware_async_payments, middleware_events, middleware_payments, views_for

urlpatterns = [path("mw/payments", middleware_payments), path("mw/async", middleware_async_payments),
               path("mw/drf", MiddlewareRefusal.as_view()), path("mw/events", middleware_events)]
for alias in settings.DATABASES:
    urlpatterns += [path(f"{alias}/{name}", view) for name, view in views_for(alias).items()]
