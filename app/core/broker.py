"""The Celery app object (transport only; the DB is the record). The API only sends tasks by
name; `workers/` registers them on this same object."""

from __future__ import annotations

import os
import uuid
from functools import lru_cache
from time import monotonic

from celery import Celery
from kombu import Queue
from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps

from app.core.config import get_settings

RUN_JOB = "draftyard.run_job"
SCHEDULE = "draftyard.schedule"


class _WholeMessages(filesystem.Channel):
    """kombu's filesystem channel creates a message file under its final name and writes it
    afterwards: a worker listing the folder in between took the empty file, failed to decode
    it and stopped ("Unrecoverable error: JSONDecodeError"), and the embedded deployment ran
    nothing more (tests/test_broker_fs.py). A message is written under a name no
    queue reads (no dot), then renamed to kombu's name: the rename is atomic, so a reader
    sees the whole message or none."""

    def _put(self, queue, payload, **kwargs):
        name = f"{int(round(monotonic() * 1000))}_{uuid.uuid4()}.{queue}.msg"  # kombu's order
        tmp = os.path.join(self.data_folder_out, f"writing-{uuid.uuid4()}")
        try:
            with open(tmp, "wb") as f:
                f.write(str_to_bytes(dumps(payload)))
            os.replace(tmp, os.path.join(self.data_folder_out, name))
        except OSError as exc:
            raise ChannelError(f"Cannot add file {name!r} to directory") from exc


class FilesystemTransport(filesystem.Transport):
    Channel = _WholeMessages


@lru_cache
def celery_app() -> Celery:
    s = get_settings()
    app = Celery("draftyard", broker=s.broker, set_as_current=True)
    conf = dict(
        task_ignore_result=True,
        # Early ack, prefetch of one: a long GPU task is never redelivered behind our back
        # (Redis visibility timeout); recovery comes from DB heartbeats and the reaper.
        task_acks_late=False,
        worker_prefetch_multiplier=1,
        task_default_queue="control",
        task_queues=[Queue("control"), Queue("cpu")],
        task_serializer="json",
        accept_content=["json"],
        broker_connection_retry_on_startup=True,
        broker_connection_timeout=3,
        worker_hijack_root_logger=False,
        worker_send_task_events=False,
    )
    if s.broker.startswith("filesystem"):
        conf["broker_transport"] = FilesystemTransport
        d = s.broker_dir
        for sub in ("in", "processed", "control"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        conf["broker_transport_options"] = {"data_folder_in": str(d / "in"),
                                            "data_folder_out": str(d / "in"),
                                            "processed_folder": str(d / "processed"),
                                            # exchange bindings; default is ./control in the cwd
                                            "control_folder": str(d / "control"),
                                            "store_processed": False}
    else:
        conf["broker_transport_options"] = {"socket_connect_timeout": 3}
    app.conf.update(**conf)
    return app


def send_run_job(job_id: str, queue: str) -> None:
    celery_app().send_task(RUN_JOB, args=[job_id], queue=queue, retry=True,
                           retry_policy={"max_retries": 3, "interval_start": 0.1})


def ping_broker(timeout: float = 2.0) -> None:
    with celery_app().connection_for_write() as conn:
        conn.ensure_connection(max_retries=1, timeout=timeout)
