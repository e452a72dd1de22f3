"""Idempotent consumers for the brokers users run: each broker's adapter is a module of its own, imported only when
used (its client library is an extra of its own):

- `idem_dialects.consumers.rabbitmq`: RabbitMQ through aio-pika (``pip install 'idem-dialects[rabbitmq]'``);
- `idem_dialects.consumers.nats`: NATS JetStream through nats-py (``[nats]``);
- `idem_dialects.consumers.redis`: Redis Streams consumer groups through redis-py (``[redis]``);
- `idem_dialects.consumers.celery`: a decorator for Celery tasks with ``acks_late`` (``[celery]``).

Every adapter runs the handler and records the message id in one transaction (`IdempotencyStore.consume`) and
acknowledges the message only after that commit, so a crash between the two makes the broker deliver the message
again, and the redelivery is acknowledged without running the handler.
"""

from __future__ import annotations

from .base import ConsumerBase, DeadLetter, MessageId, header, transient

__all__ = ["ConsumerBase", "DeadLetter", "MessageId", "header", "transient"]
