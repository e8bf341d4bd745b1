"""Apply the Alembic migrations (tests, `draftyard up` and the compose `migrate` service)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

MIGRATIONS = Path(__file__).resolve().parents[2] / "migrations"


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.cmd_opts = type("o", (), {"x": [f"url={url}"]})()
    return cfg


def upgrade_head(url: str) -> None:
    command.upgrade(alembic_config(url), "head")
