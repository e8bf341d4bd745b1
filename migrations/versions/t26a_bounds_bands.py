"""targets.chat_template_sha256/_chars (listings show the template by hash); users.max_priority
(priority bands granted by an admin) (issue 26)

Revision ID: t26a_bounds_bands
Revises: t23a_storage
"""
import hashlib

from alembic import op
import sqlalchemy as sa


revision = 't26a_bounds_bands'
down_revision = 't23a_storage'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('targets', schema=None) as batch_op:
        batch_op.add_column(sa.Column('chat_template_sha256', sa.String(length=64),
                                      nullable=True))
        batch_op.add_column(sa.Column('chat_template_chars', sa.Integer(), nullable=True))
    with op.batch_alter_table('users', schema=None) as batch_op:
        batch_op.add_column(sa.Column('max_priority', sa.Integer(), nullable=True))
    conn = op.get_bind()
    t = sa.table('targets', sa.column('id', sa.String), sa.column('chat_template', sa.Text),
                 sa.column('chat_template_sha256', sa.String),
                 sa.column('chat_template_chars', sa.Integer))
    rows = conn.execute(sa.select(t.c.id, t.c.chat_template)
                        .where(t.c.chat_template.is_not(None))).all()
    for tid, text in rows:
        conn.execute(t.update().where(t.c.id == tid).values(
            chat_template_sha256=hashlib.sha256(text.encode()).hexdigest(),
            chat_template_chars=len(text)))


def downgrade() -> None:
    with op.batch_alter_table('users', schema=None) as batch_op:
        batch_op.drop_column('max_priority')
    with op.batch_alter_table('targets', schema=None) as batch_op:
        batch_op.drop_column('chat_template_chars')
        batch_op.drop_column('chat_template_sha256')
