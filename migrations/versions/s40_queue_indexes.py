"""Partial indexes over the waiting jobs, for the placement-only read of a scheduling decision
(app/scheduler/reads.py `_FEW_PG`): it reads a few hundred index entries with 10,000 queued
instead of scanning every waiting row (bench/scheduler.py). PostgreSQL only: the embedded
SQLite deployment reads its few waiting jobs with one scan. Each index's predicate is the one
the read repeats, so the planner can prove the index applies.

Revision ID: s40_queue_indexes
Revises: r38_run_stage_key
"""
from alembic import op


revision = 's40_queue_indexes'
down_revision = 'r38_run_stage_key'
branch_labels = None
depends_on = None

_QUEUE = "status = 'queued' AND NOT held"
INDEXES = {
    # each owner's g-GPU jobs in the policy's order (priority, age, id as Python compares it)
    "ix_jobs_queue": f'(owner_id, gpus_requested, priority DESC, queued_at, id COLLATE "C") '
                     f"WHERE {_QUEUE}",
    "ix_jobs_queue_cpu": f"(id) WHERE {_QUEUE} AND gpus_requested = 0",
    "ix_jobs_queue_aged": f"(queued_at) WHERE {_QUEUE} AND gpus_requested > 0",
    "ix_jobs_queue_unfingerprinted": "(type) WHERE status = 'queued' AND fingerprint IS NULL",
}


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for name, spec in INDEXES.items():
        op.execute(f"CREATE INDEX {name} ON jobs {spec}")


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for name in INDEXES:
        op.execute(f"DROP INDEX {name}")
