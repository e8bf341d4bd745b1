"""storage (issue 23): artifact tombstones, a job's keep policy, disk reservation and scratch size

Revision ID: t23a_storage
Revises: m25_deployment
"""
from alembic import op
import sqlalchemy as sa


revision = 't23a_storage'
down_revision = 'm25_deployment'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('artifacts', schema=None) as batch_op:
        batch_op.add_column(sa.Column('deleted_at', sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column('deleted_by', sa.String(length=40), nullable=True))
        batch_op.add_column(sa.Column('bytes_freed', sa.BigInteger(), nullable=True))
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('keep', sa.Boolean(), nullable=True))
        batch_op.add_column(sa.Column('disk_bytes', sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column('disk_volume', sa.String(length=40), nullable=True))
        batch_op.add_column(sa.Column('scratch_bytes', sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column('scratch_removed_at', sa.DateTime(timezone=True),
                                      nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        for c in ('scratch_removed_at', 'scratch_bytes', 'disk_volume', 'disk_bytes', 'keep'):
            batch_op.drop_column(c)
    with op.batch_alter_table('artifacts', schema=None) as batch_op:
        for c in ('bytes_freed', 'deleted_by', 'deleted_at'):
            batch_op.drop_column(c)
