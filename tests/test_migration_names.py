"""Migration f27_unique_names: existing duplicate target and dataset names of one
owner are renamed (the oldest keeps its name) before the unique index is built."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import sqlalchemy as sa
from alembic import command

from app.core.migrate import alembic_config


def test_duplicates_are_renamed_then_names_are_unique(tmp_path):
    url = f"sqlite:///{tmp_path / 'old.db'}"
    command.upgrade(alembic_config(url), "t26a_bounds_bands")
    eng = sa.create_engine(url)
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    with eng.begin() as c:
        for u in ("usr_a", "usr_b"):
            c.execute(sa.text("INSERT INTO users (id, name, role, created_at) "
                              "VALUES (:i, :i, 'member', :t)"), {"i": u, "t": t0})
        for i, (owner, name) in enumerate([("usr_a", "qwen"), ("usr_a", "qwen"),
                                           ("usr_b", "qwen"), ("usr_a", "qwen")]):
            c.execute(sa.text(
                "INSERT INTO targets (id, name, owner_id, path, tokenizer_path, "
                "chat_template_kwargs, has_chat_template, config, created_at) VALUES "
                "(:i, :n, :o, '/m', '/m', '{}', 0, '{}', :t)"),
                {"i": f"tgt_{i}", "n": name, "o": owner, "t": t0 + timedelta(minutes=i)})
            c.execute(sa.text(
                "INSERT INTO datasets (id, name, owner_id, status, source, rejected_sample, "
                "stats, created_at) VALUES (:i, :n, :o, 'ready', '{}', '[]', '{}', :t)"),
                {"i": f"ds_{i}", "n": "orca", "o": owner, "t": t0 + timedelta(minutes=i)})
    command.upgrade(alembic_config(url), "head")
    with eng.begin() as c:
        names = dict(c.execute(sa.text("SELECT id, name FROM targets")).all())
        assert names == {"tgt_0": "qwen", "tgt_1": "qwen-tgt_1", "tgt_2": "qwen",
                         "tgt_3": "qwen-tgt_3"}
        ds = dict(c.execute(sa.text("SELECT id, name FROM datasets")).all())
        assert ds["ds_0"] == "orca" and ds["ds_1"] == "orca-ds_1" and ds["ds_2"] == "orca"
        try:
            c.execute(sa.text("UPDATE targets SET name = 'qwen' WHERE id = 'tgt_1'"))
            raise AssertionError("the unique index let a duplicate name in")
        except sa.exc.IntegrityError:
            pass
    command.downgrade(alembic_config(url), "t26a_bounds_bands")
    eng.dispose()
