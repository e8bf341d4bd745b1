"""jobs.run_stage holds a job's key in its run: `<stage>:<drafter name>` for the jobs of one of
several drafters a run compares (contracts/run.py), up to 49 characters.

Revision ID: r38_run_stage_key
Revises: f27_unique_names
"""
from alembic import op
import sqlalchemy as sa


revision = 'r38_run_stage_key'
down_revision = 'f27_unique_names'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.alter_column('run_stage', existing_type=sa.String(length=20),
                              type_=sa.String(length=64), existing_nullable=True)


def downgrade() -> None:
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.alter_column('run_stage', existing_type=sa.String(length=64),
                              type_=sa.String(length=20), existing_nullable=True)
