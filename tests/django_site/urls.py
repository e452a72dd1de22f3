from django.conf import settings
from django.urls import URLPattern, path

from .views import MiddlewareRefusal, middleware_async_payments, middleware_events, middleware_payments, views_for


def alias_patterns(alias: str) -> list[URLPattern]:
    """The views writing to one database alias (views_for), under /<alias>/."""
    return [path(f"{alias}/{name}", view) for name, view in views_for(alias).items()]


urlpatterns = [path("mw/payments", middleware_payments), path("mw/async", middleware_async_payments),
               path("mw/drf", MiddlewareRefusal.as_view()), path("mw/events", middleware_events)]
for alias in settings.DATABASES:
    urlpatterns += alias_patterns(alias)
