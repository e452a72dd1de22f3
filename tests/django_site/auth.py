"""Who the caller is, for the middleware's requests: the X-Remote-User header (Django's RemoteUserMiddleware
mechanism), so tests need no sessions or cookies."""

from django.contrib.auth.middleware import RemoteUserMiddleware


class HeaderUserMiddleware(RemoteUserMiddleware):
    header = "HTTP_X_REMOTE_USER"
    force_logout_if_no_header = False
