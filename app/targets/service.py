"""Targets: model directories inside the model roots, described from their config."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from jinja2 import TemplateSyntaxError, nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment
from sqlalchemy import select
from sqlalchemy.orm import Session, defer

from app.core.auth import Principal
from app.core.config import get_settings
from app.core.names import check_name_free
from app.core.errors import Invalid, NotFound
from app.core.ids import new_id
from app.core.pagination import Page, paginate
from app.core.paths import resolve_inside
from app.models import Target
from contracts.target import looks_like_template_path, template_path_message, text_config


class GenerationTag(Extension):
    """`{% generation %}...{% endgeneration %}`, the tag transformers' AssistantTracker adds
    to its template environment (TRL's `*_training.jinja` templates use it to mark what is
    trained). Here it only has to compile: the body renders as is. The tracking version,
    which records the blocks' spans for the loss mask, is the prepare stage's
    (workers/stages/prepare/templates.py); app/ may not import the stages."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body).set_lineno(lineno)


def check_template(text: str, param: str = "chat_template") -> None:
    """Compile a chat template the way transformers does; a syntax error is a 422 with its line."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols", GenerationTag])
    try:
        env.parse(text)
    except TemplateSyntaxError as e:
        raise Invalid(f"{param} does not compile: {e.message} (line {e.lineno})", param=param,
                      code="template_error", details={"line": e.lineno, "error": e.message}) from e


def read_config(model_dir: Path, shown: str) -> dict:
    """`shown`: the path as the client wrote it; messages never show the resolved one (it
    would tell members where the server's model roots are)."""
    cfg_path = model_dir / "config.json"
    if not cfg_path.is_file():
        raise Invalid(f"path: {shown} has no config.json (not a transformers model folder)",
                      param="path", code="not_a_model")
    try:
        return json.loads(cfg_path.read_text())
    except (ValueError, OSError) as e:
        raise Invalid(f"path: {shown}/config.json is not valid JSON: {e}", param="path",
                      code="not_a_model") from e


def has_template(tok_dir: Path) -> bool:
    if (tok_dir / "chat_template.jinja").is_file() or (tok_dir / "chat_template.json").is_file():
        return True
    tc = tok_dir / "tokenizer_config.json"
    try:
        return bool(tc.is_file() and json.loads(tc.read_text()).get("chat_template"))
    except ValueError:
        return False


def create_target(session: Session, user: Principal, body) -> Target:
    check_name_free(session, Target, user, body.name)
    s = get_settings()
    roots = s.roots("model")
    path = resolve_inside(body.path, roots, what="model", param="path", env="DRAFTYARD_MODEL_ROOTS")
    tok = (resolve_inside(body.tokenizer_path, roots, what="model", param="tokenizer_path",
                          env="DRAFTYARD_MODEL_ROOTS") if body.tokenizer_path else path)
    cfg = read_config(path, body.path)
    text_cfg = text_config(cfg)
    if body.chat_template is not None:
        if looks_like_template_path(body.chat_template):
            raise Invalid(template_path_message(body.chat_template), param="chat_template",
                          code="template_is_a_path")
        check_template(body.chat_template)
    tmpl = body.chat_template
    t = Target(id=new_id("tgt"), name=body.name, owner_id=user.id, path=str(path),
               tokenizer_path=str(tok), chat_template=tmpl,
               chat_template_sha256=hashlib.sha256(tmpl.encode()).hexdigest() if tmpl else None,
               chat_template_chars=len(tmpl) if tmpl is not None else None,
               chat_template_kwargs=body.chat_template_kwargs or {},
               architecture=(cfg.get("architectures") or [cfg.get("model_type")])[0],
               hidden_size=text_cfg.get("hidden_size"),
               num_layers=text_cfg.get("num_hidden_layers"),
               vocab_size=text_cfg.get("vocab_size"),
               has_chat_template=body.chat_template is not None or has_template(tok),
               config=cfg)
    session.add(t)
    session.flush()
    return t


def list_targets(session: Session, page: Page):
    # The templates stay in the database: a listing shows them by hash and length.
    return paginate(session, select(Target).options(defer(Target.chat_template)), Target.id,
                    page)


def get_target(session: Session, target_id: str) -> Target:
    t = session.get(Target, target_id)
    if t is None:
        raise NotFound(f"target {target_id} not found", param="id")
    return t
