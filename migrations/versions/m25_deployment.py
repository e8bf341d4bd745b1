"""deployment facts: the shared folder's marker token (issue 25)

Revision ID: m25_deployment
Revises: t16a_preempt_webhooks
"""
from alembic import op
import sqlalchemy as sa


revision = 'm25_deployment'
down_revision = 't16a_preempt_webhooks'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('deployment',
    sa.Column('key', sa.String(length=40), nullable=False),
    sa.Column('value', sa.String(length=200), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('key', name=op.f('pk_deployment'))
    )


def downgrade() -> None:
    op.drop_table('deployment')
