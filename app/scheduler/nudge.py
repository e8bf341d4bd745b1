"""Run one scheduling decision now (after a commit that may have freed or queued work)."""

from __future__ import annotations

import logging

from sqlalchemy.exc import OperationalError

from app.core.db import unit_of_work

log = logging.getLogger("draftyard.scheduler")


def nudge() -> None:
    from app.scheduler.service import schedule_once

    for attempt in range(3):
        try:
            with unit_of_work() as s:
                schedule_once(s)
            return
        except OperationalError as e:  # lock timeouts, deadlock on lease rows: try again
            log.warning("scheduling pass failed (attempt %d): %s", attempt + 1, e)
        except Exception:  # noqa: BLE001  the periodic tick recovers
            log.exception("scheduling pass failed")
            return
