"""Alembic environment: the URL comes from draftyard's settings (or -x url=...)."""

from alembic import context

from app.core.config import get_settings
from app.core.db import make_engine
from app.models import Base

target_metadata = Base.metadata


def run_migrations() -> None:
    url = context.get_x_argument(as_dictionary=True).get("url") or get_settings().db_url
    conn = context.config.attributes.get("connection")
    if conn is not None:
        context.configure(connection=conn, target_metadata=target_metadata,
                          render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = make_engine(url)
    with engine.connect() as connection:
        context.configure(connection=connection, target_metadata=target_metadata,
                          render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


run_migrations()
