"""The worker's Celery consumer, reconnecting to the broker every second while it is down.

Celery's consumer waits out kombu's default backoff (2, 4, 6, 8, 10 ... 30 s between tries), so
after a 20-s Redis outage a worker could sit up to ~10 s more before it took messages again:
jobs dispatched meanwhile waited, and were requeued as unclaimed. Polling a
local Redis once a second costs nothing; the DB, not the broker, is the record."""

from __future__ import annotations

from celery.worker.consumer import Consumer

RECONNECT_EVERY_S = 1.0


class QuickReconnectConsumer(Consumer):
    def ensure_connected(self, conn):
        ensure = conn.ensure_connection

        def every_second(*args, **kwargs):
            kwargs.update(interval_start=RECONNECT_EVERY_S, interval_step=0,
                          interval_max=RECONNECT_EVERY_S)
            return ensure(*args, **kwargs)

        conn.ensure_connection = every_second
        return super().ensure_connected(conn)
