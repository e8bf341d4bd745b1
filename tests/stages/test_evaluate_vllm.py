"""evaluate's vLLM measure without a GPU: metric parsing, the serve command, and the server
lifecycle (start in its own process group, health wait, scrape, requests, always stopped),
run against a small stand-in HTTP server that speaks the same three endpoints."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import pytest

from workers.stages.common import StageError
from procgroup import free_port as _free_port
from workers.stages.evaluate.vllm_metrics import (
    acceptance_from_counters,
    measure_with_vllm,
    metrics,
    parse_spec_counters,
    serve_command,
)
from workers.stages.vllm_server import VllmServer

# Shaped like vLLM v1's /metrics: counters get `_total` and `_created` samples, one series per
# engine, per-position counters carry a `position` label.
EXPOSITION = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="target"} 0.0
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="target"} 100.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="target"} 60.0
# HELP vllm:spec_decode_num_drafts_created Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_created gauge
vllm:spec_decode_num_drafts_created{engine="0",model_name="target"} 1.7e+09
# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="target"} 300.0
vllm:spec_decode_num_draft_tokens_total{engine="1",model_name="target"} 180.0
# HELP vllm:spec_decode_num_accepted_tokens_total Number of accepted tokens.
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="target"} 150.0
vllm:spec_decode_num_accepted_tokens_total{engine="1",model_name="target"} 90.0
# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position.
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="target",position="0"} 80.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="target",position="1"} 45.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="target",position="2"} 25.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="target",position="0"} 48.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="target",position="1"} 27.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="target",position="2"} 15.0
"""


def test_parse_sums_engines_and_skips_created():
    c = parse_spec_counters(EXPOSITION)
    assert (c.num_drafts, c.num_draft_tokens, c.num_accepted_tokens) == (160, 480, 240)
    assert c.accepted_per_pos == {0: 128, 1: 72, 2: 40}
    res = acceptance_from_counters(c)
    assert res["tau"] == pytest.approx(1 + 240 / 160)
    assert res["acceptance_rate_per_position"] == pytest.approx([0.8, 0.45, 0.25])
    # vLLM's identity: tau = 1 + sum of per-position rates
    assert res["tau"] == pytest.approx(1 + sum(res["acceptance_rate_per_position"]))
    assert res["draft_acceptance_rate"] == pytest.approx(0.5)


def test_counters_are_differenced_and_empty_is_none():
    before = parse_spec_counters(EXPOSITION)
    after = parse_spec_counters(EXPOSITION.replace(' 100.0', ' 110.0').replace(' 150.0', ' 170.0')
                                .replace('position="0"} 80.0', 'position="0"} 90.0')
                                .replace('position="1"} 45.0', 'position="1"} 55.0'))
    d = after.minus(before)
    assert (d.num_drafts, d.num_accepted_tokens) == (10, 20)
    assert acceptance_from_counters(d)["acceptance_rate_per_position"] == [1.0, 1.0, 0.0]
    assert acceptance_from_counters(before.minus(before))["tau"] is None
    assert parse_spec_counters("# no spec decode here\n").num_drafts == 0


def test_serve_command_names_drafter_method_and_tokens():
    from contracts.vllm import VllmServeOptions

    cmd = serve_command("/m/target", "/m/drafter", "dflash", 7, 8123,
                        options=VllmServeOptions(enforce_eager=True, dtype="bfloat16"))
    # The configured vLLM (a server setting): by default this interpreter's.
    assert cmd[:5] == [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", "/m/target"]
    spec = json.loads(cmd[cmd.index("--speculative-config") + 1])
    assert spec == {"model": "/m/drafter", "method": "dflash", "num_speculative_tokens": 7}
    assert cmd[cmd.index("--port") + 1] == "8123"
    assert cmd[-3:] == ["--enforce-eager", "--dtype", "bfloat16"]
    assert json.loads(serve_command("t", "d", "eagle3", 3, 1)[-1])["method"] == "eagle3"
    with pytest.raises(StageError):
        serve_command("t", "d", "medusa", 3, 1)


STAND_IN = textwrap.dedent('''
    """Speaks /health, /metrics and /v1/completions like a vLLM server with spec decode."""
    import json, sys
    from http.server import BaseHTTPRequestHandler, HTTPServer

    state = {"drafts": 0, "accepted": 0, "pos": [0, 0, 0]}

    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def _send(self, code, body, ctype="application/json"):
            data = body.encode()
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path == "/health":
                return self._send(200, "")
            if self.path == "/metrics":
                lines = ["# TYPE vllm:spec_decode_num_drafts_total counter",
                         f"vllm:spec_decode_num_drafts_total{{engine=\\"0\\"}} {state['drafts']}",
                         "# TYPE vllm:spec_decode_num_accepted_tokens_total counter",
                         f"vllm:spec_decode_num_accepted_tokens_total{{engine=\\"0\\"}} "
                         f"{state['accepted']}",
                         "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter"]
                lines += [f"vllm:spec_decode_num_accepted_tokens_per_pos_total"
                          f"{{engine=\\"0\\",position=\\"{i}\\"}} {v}"
                          for i, v in enumerate(state["pos"])]
                return self._send(200, "\\n".join(lines) + "\\n", "text/plain")
            self._send(404, "{}")

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            assert body["temperature"] == 0.0 and isinstance(body["prompt"], list)
            # every request: 4 drafts, accepted 2, 1, 0, 3 tokens
            for a in (2, 1, 0, 3):
                state["drafts"] += 1
                state["accepted"] += a
                for i in range(a):
                    state["pos"][i] += 1
            assert body["return_token_ids"] is True
            ids = [len(body["prompt"]) + i for i in range(body["max_tokens"])]
            self._send(200, json.dumps({"usage": {"completion_tokens": body["max_tokens"]},
                                        "choices": [{"text": "", "token_ids": ids}]}))

    HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
''')


def test_measure_lifecycle_against_stand_in_server(tmp_path: Path):
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN)
    port = _free_port()
    res = measure_with_vllm("t", "d", "dflash", 3, [[1, 2, 3]] * 5, 16, tmp_path,
                            port=port, command=[sys.executable, str(script), str(port)],
                            startup_timeout_s=30, keep_outputs=True)
    # 5 measured requests x 4 drafts; the warm-up request is differenced away
    assert res["num_drafts"] == 20
    assert res["tau"] == pytest.approx(1 + 6 / 4)
    assert res["acceptance_rate_per_position"] == pytest.approx([0.75, 0.5, 0.25])
    assert res["generated_tokens"] == 80 and res["prompts"] == 5
    # The generated token ids of each measured prompt, in prompt order (not the warm-up's).
    assert res["outputs"] == [list(range(3, 19))] * 5


def test_server_is_stopped_and_startup_failure_is_typed(tmp_path: Path):
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN)
    port = _free_port()
    srv = VllmServer([sys.executable, str(script), str(port)], port, tmp_path / "a.log",
                     startup_timeout_s=30)
    with srv:
        pid = srv.proc.pid
        assert metrics(srv).num_drafts == 0
    assert srv.proc.poll() is not None
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)  # the whole process group is gone

    bad = VllmServer([sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"], port,
                     tmp_path / "b.log", startup_timeout_s=30)
    with pytest.raises(StageError) as e:
        bad.__enter__()
    assert e.value.code == "backend_failed" and "status 3" in e.value.message
    assert "boom" in e.value.message


def test_a_server_that_never_gets_healthy_is_stopped(tmp_path: Path):
    # Seen with real vLLM: `with VllmServer(...)` whose start timed out left the server
    # running, because __exit__ does not run when __enter__ raises.
    port = _free_port()
    srv = VllmServer([sys.executable, "-c", "import time; time.sleep(600)"], port,
                     tmp_path / "c.log", startup_timeout_s=1.0)
    with pytest.raises(StageError) as e:
        with srv:
            pass
    assert e.value.code == "backend_timeout" and "not healthy" in e.value.message
    assert srv.proc.poll() is not None
    with pytest.raises(ProcessLookupError):
        os.killpg(srv.proc.pid, 0)
