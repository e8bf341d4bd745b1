"""POST /v1/targets' template check, in-process on the rolled-back DB fixture: it compiles what
transformers compiles (the `{% generation %}` tag of training templates included) and still
names the line of a real syntax error."""

from __future__ import annotations

import json
import uuid

import pytest

from app.core.errors import Invalid
from app.targets.routes import TargetCreate
from app.targets.service import check_template, create_target
from tests.stages.conftest import shared_fixtures


@pytest.fixture
def model_dir(home):
    d = home / "models" / f"cfg-{uuid.uuid4().hex[:6]}"
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"],
                                               "hidden_size": 64, "num_hidden_layers": 8}))
    return d




def test_target_with_generation_tags_is_accepted(db, user, model_dir):
    text = (shared_fixtures() / "chat_templates" /
            "qwen3_6_training_generation_tags.jinja").read_text()
    assert "{% generation %}" in text
    t = create_target(db, user, TargetCreate(name="gen", path=str(model_dir), chat_template=text))
    assert t.chat_template == text and t.has_chat_template


def test_every_fixture_template_compiles_and_errors_name_the_line():
    for p in sorted((shared_fixtures() / "chat_templates").glob("*.jinja")):
        if "BROKEN" in p.name:  # the negative control: an unescaped apostrophe
            with pytest.raises(Invalid, match="line 5"):
                check_template(p.read_text())
        else:
            check_template(p.read_text())
    with pytest.raises(Invalid) as e:
        check_template("{{ messages }}\n{% generation %}x")  # never closed
    assert e.value.details["line"] == 2 and "endgeneration" in e.value.message
