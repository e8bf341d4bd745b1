"""A node joins only if it can work: before it registers, a worker proves that it
reaches the database and the broker and that it reads and writes the deployment's shared
folder (app/cluster/shared.py). Otherwise it refuses to start, with a message that names the
address or the mount that is missing."""

from __future__ import annotations

from sqlalchemy import make_url, text
from sqlalchemy.exc import SQLAlchemyError

from app.cluster.shared import NotShared, ensure_shared
from app.core.config import get_settings
from app.core.db import unit_of_work


class CannotJoin(RuntimeError):
    """This node cannot work; `python -m workers` prints the message and exits 2."""


def _where(url: str) -> str:
    """host:port of a URL, never its password."""
    try:
        u = make_url(url)
        return f"{u.host or 'localhost'}:{u.port or '(default port)'}"
    except Exception:  # noqa: BLE001  a broker URL SQLAlchemy cannot parse
        rest = url.split("://", 1)[-1].rsplit("@", 1)[-1]
        return rest.split("/", 1)[0]


def _short(e: BaseException) -> str:
    return str(getattr(e, "orig", None) or e).strip().splitlines()[0][:300]


def check_database(node: str) -> None:
    """Raise CannotJoin unless the database answers (first: a restarted node requeues its
    earlier incarnation's jobs before the slower checks of `check_can_join`)."""
    s = get_settings()
    try:
        with unit_of_work() as sess:
            sess.execute(text("SELECT 1"))
    except SQLAlchemyError as e:
        raise CannotJoin(f"node {node} cannot join: the database at {_where(s.db_url)} "
                         f"(DRAFTYARD_DATABASE_URL) does not answer: {_short(e)}") from None


def check_can_join(node: str) -> str:
    """Raise CannotJoin unless this node can work (broker, shared folder; the database was
    checked by `check_database`); returns the shared folder's token."""
    s = get_settings()
    who = f"node {node} cannot join"
    if not s.embedded and not s.broker.startswith("filesystem"):
        from kombu import Connection

        try:
            with Connection(s.broker, connect_timeout=5) as c:
                c.ensure_connection(max_retries=1, timeout=5)
        except Exception as e:  # noqa: BLE001  kombu raises its transport's own errors
            raise CannotJoin(f"{who}: the broker at {_where(s.broker)} (DRAFTYARD_BROKER_URL) "
                             f"does not answer: {_short(e)}") from None
    try:
        with unit_of_work() as sess:
            return ensure_shared(sess, s, who)
    except NotShared as e:
        raise CannotJoin(str(e)) from None
    except SQLAlchemyError as e:
        raise CannotJoin(f"{who}: the database at {_where(s.db_url)} failed while checking the "
                         f"shared folder: {_short(e)}") from None
