"""target and dataset names unique per owner (issue 27)

Existing duplicates are renamed first: in each (owner, name) group the oldest keeps its name,
each later one becomes "<name>-<its id>" (ids are unique, so the new names are), cut to fit
the 200-character column. Downgrade drops the indexes only (the new names stay).

Revision ID: f27_unique_names
Revises: t26a_bounds_bands
"""
from alembic import op
import sqlalchemy as sa


revision = 'f27_unique_names'
down_revision = 't26a_bounds_bands'
branch_labels = None
depends_on = None

TABLES = ("targets", "datasets")


def _rename_duplicates(table: str) -> None:
    bind = op.get_bind()
    t = sa.table(table, sa.column("id", sa.String), sa.column("owner_id", sa.String),
                 sa.column("name", sa.String), sa.column("created_at", sa.DateTime))
    seen: set[tuple[str, str]] = set()
    renames = []
    for row in bind.execute(sa.select(t.c.id, t.c.owner_id, t.c.name)
                            .order_by(t.c.created_at, t.c.id)):
        key = (row.owner_id, row.name)
        if key in seen:
            suffix = f"-{row.id}"
            renames.append((row.id, row.name[:200 - len(suffix)] + suffix))
        seen.add(key)
    for id_, name in renames:
        bind.execute(sa.update(t).where(t.c.id == id_).values(name=name))


def upgrade() -> None:
    for table in TABLES:
        _rename_duplicates(table)
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.create_index(f"uq_{table}_owner_name", ["owner_id", "name"], unique=True)


def downgrade() -> None:
    for table in TABLES:
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.drop_index(f"uq_{table}_owner_name")
