"""Settings from the environment (`DRAFTYARD_` prefix; names in docs/API.md "Running it")."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="DRAFTYARD_", extra="ignore")

    home: Path = Field(default_factory=lambda: Path.home() / ".draftyard")
    # Empty means embedded: SQLite under home and a broker that needs no server.
    database_url: str = ""
    broker_url: str = ""
    data_roots: str = ""   # ':'-separated folders the server may read datasets from
    model_roots: str = ""  # ':'-separated folders the server may read models from
    max_upload_bytes: int = 2 * 1024**3
    # What a compressed upload (gzip, zstd, ...) may inflate to: a 56 KB gzip of 30 MB of
    # zeros must not pass as 56 KB.
    max_decompressed_bytes: int = 16 * 1024**3
    # Any other request body (JSON): a run body with a long chat template is ~100 KB; a 50 MB
    # body is refused from its Content-Length, or once that many bytes have streamed in.
    max_body_bytes: int = 8 * 1024**2
    # Plans run a child process of up to 120 s each: a few at once per API instance.
    max_concurrent_plans: int = 2
    # Plans are forked by a warm plan server (workers/stages/starter.py) that has the
    # stage core imported already (a plan in ~0.5 CPU-s instead of ~3); false: a fresh
    # process per plan.
    plan_server: bool = True
    # Start that plan server with the API instead of with its first plan (~3 CPU-s of
    # imports the first plan would wait for): for a service that is about to plan, like the
    # demo, which starts it while its target builds.
    plan_warm_up: bool = False
    # A worker forks its model stages (generate, extract, train, evaluate) from a warm
    # starter (workers/stages/starter.py) that has torch, transformers and speculators
    # imported already, instead of a fresh process each paying ~5 CPU-s of imports; false: a
    # fresh process per stage.
    stage_server: bool = True
    # Start that model stage starter with the worker instead of with its first model stage
    # (~5 CPU-s of imports the first generate or train would wait for): for a worker that
    # is about to run one, like a box that joins to take over a lost job's retry.
    stage_warm_up: bool = False
    # The per-GPU rates behind the plan's time estimates, as a JSON object overriding any of
    # workers/stages/plan_time.py DEFAULT_RATES (e.g. {"decode_tokens_per_s_per_gpu": 2400}
    # measured for the target on this hardware).
    plan_rates: dict[str, Any] = Field(default_factory=dict)
    env: str = "development"  # "production" refuses the embedded defaults
    # Scheduler and worker timing. Heartbeats every few seconds; a job or node silent for
    # `stale_after_s` is reaped (a lost job is requeued within 60 s).
    heartbeat_s: float = 2.0
    stale_after_s: float = 20.0
    cancel_grace_s: float = 10.0
    # A worker that is told to stop (SIGTERM or SIGINT, or `draftyard up` stopping or dying)
    # asks each running stage to save and exit (train checkpoints at its next step), gives it
    # this long, then kills it and requeues its job (workers/supervisor.py `request_stop`).
    stop_grace_s: float = 5.0
    max_attempts: int = 3
    user_gpu_quota: int = 0  # 0 = no per-user quota
    # A big job may be passed by smaller ones only for this long (aging bound).
    backfill_bound_s: float = 300.0
    cpu_slots: int = 2  # concurrent CPU (gpus=0) jobs per node
    # Priority bands: the highest priority a member's job may have unless an
    # admin granted the user more (users.max_priority). The default priority itself: a
    # member orders their own jobs below it but cannot preempt anyone's default-priority work.
    member_max_priority: int = 50
    # Node-local scratch: one folder per attempt with the stage's spec, events file
    # and TMPDIR; nothing a retry on another node needs (that stays under home, the shared
    # folder: app/cluster/shared.py). Empty: under the job's folder in home.
    scratch_dir: Path | None = None
    # Storage (app/storage/): an offline run's hidden states are deleted once its
    # train succeeded and no live job needs them, unless kept (this default, or `keep` on the
    # run or job); a failed or cancelled job's scratch (work/) is removed this long after it
    # ended; a user's live artifact bytes plus the disk their waiting and running jobs will
    # write may not pass the quota (0 = none); a reservation must leave this much free.
    keep_hidden_states: bool = False
    scratch_ttl_s: float = 3 * 86400.0
    user_storage_quota_bytes: int = 0
    disk_margin_bytes: int = 0
    # Preemption: a job is preempted at most this often per hour, so a stream of
    # urgent jobs cannot keep one run restarting forever; a stage asked to yield gets this
    # long to checkpoint before SIGKILL.
    preempt_max_per_hour: int = 2
    preempt_grace_s: float = 120.0
    # Webhooks: retries with exponential backoff (base * 2**(attempt-1), capped), then the
    # delivery is marked failed; the sender polls the outbox every webhook_poll_s.
    webhook_max_attempts: int = 8
    webhook_backoff_s: float = 5.0
    webhook_backoff_max_s: float = 3600.0
    webhook_timeout_s: float = 10.0
    webhook_poll_s: float = 1.0
    # Host names and addresses/CIDRs (comma-separated) webhooks may reach although they are
    # internal (loopback, private, link-local...): a receiver on the team's network.
    webhook_allowed_hosts: str = ""
    # CPU slots one user may hold while another user's CPU job waits (0: all but one).
    user_cpu_slots: int = 0
    log_level: str = "info"

    @model_validator(mode="after")
    def _production_is_explicit(self) -> "Settings":
        if self.env == "production" and (not self.database_url or not self.broker_url):
            raise ValueError("DRAFTYARD_ENV=production needs DRAFTYARD_DATABASE_URL and "
                             "DRAFTYARD_BROKER_URL (embedded SQLite is for one machine)")
        return self

    @property
    def embedded(self) -> bool:
        return not self.database_url

    @property
    def db_url(self) -> str:
        return self.database_url or f"sqlite:///{self.home / 'draftyard.db'}"

    @property
    def broker(self) -> str:
        return self.broker_url or "filesystem://"

    @property
    def broker_dir(self) -> Path:
        return self.home / "broker"

    @property
    def artifacts_dir(self) -> Path:
        return self.home / "artifacts"

    @property
    def jobs_dir(self) -> Path:
        return self.home / "jobs"

    @property
    def uploads_dir(self) -> Path:
        return self.home / "uploads"

    def roots(self, which: str) -> list[Path]:
        raw = self.data_roots if which == "data" else self.model_roots
        return [Path(p).resolve() for p in raw.split(":") if p.strip()]


@lru_cache
def get_settings() -> Settings:
    return Settings()
