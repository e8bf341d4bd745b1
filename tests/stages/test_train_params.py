"""Train stage pieces that need no training: params validation, input resolution, the device
plan and the torchrun / vLLM command lines, checkpoint identity, the stop signal."""

from __future__ import annotations

import json
import os
import shlex
import signal
import sys
from functools import partial
from pathlib import Path

import pytest
import torch

from contracts.train import OnlineParams, TrainParams
from workers.stages.common import StageError
from workers.stages.kernel import parse_params as _parse
from workers.stages.train import build, launch
from tests.stages.typed import train_job

parse_params = partial(_parse, TrainParams)

CONFIG = {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "num_hidden_layers": 8,
          "hidden_size": 64, "vocab_size": 151669, "dtype": "float32"}


def _invalid(raw: dict) -> StageError:
    with pytest.raises(StageError) as e:
        parse_params(raw)
    assert e.value.code == "invalid_params"
    return e.value


# --- params --------------------------------------------------------------------------------

def test_params_name_the_bad_field():
    assert "drafter.blok_size" in _invalid({"drafter": {"type": "dflash", "blok_size": 8}}).message
    assert "drafter: Field required" in _invalid({}).message
    assert "lr" in _invalid({"drafter": {"type": "dflash"}, "lr": 0}).message
    assert "seq_length" in _invalid({"drafter": {"type": "eagle3"}, "seq_length": 8}).message
    e = _invalid({"drafter": {"type": "eagle3", "block_size": 8}})
    assert "block_size applies to dflash and dspark only" in e.message
    assert "ttt_steps applies to eagle3" in _invalid(
        {"drafter": {"type": "dflash", "ttt_steps": 3}}).message
    assert "eval_every needs val_fraction" in _invalid(
        {"drafter": {"type": "dflash"}, "eval_every": 10}).message
    assert "dpace requires loss=ce" in _invalid(
        {"drafter": {"type": "dflash"}, "loss": "kl_div", "position_weighting": "dpace"}).message
    assert "distinct" in _invalid(
        {"drafter": {"type": "dflash", "target_layer_ids": [2, 2]}}).message
    assert e.details["errors"][0]["field"].startswith("params.drafter")


def test_param_defaults_follow_speculators():
    d = parse_params({"drafter": {"type": "dflash"}})
    assert (d.drafter.block_size, d.drafter.num_anchors, d.drafter.speculative_tokens) == \
        (8, 512, 7)
    assert (d.loss_fn, d.dflash_weighting, d.optimizer) == ("ce", "dpace", "muon")
    assert parse_params({"drafter": {"type": "dflash"}, "loss": "kl_div"}).dflash_weighting \
        == "fixed-exp-decay"
    e = parse_params({"drafter": {"type": "eagle3"}})
    assert (e.drafter.ttt_steps, e.drafter.speculative_tokens, e.loss_fn) == (4, 4, "kl_div")


def test_fingerprint_ignores_steering_fields_only():
    base = {"drafter": {"type": "dflash"}, "max_steps": 10}
    fp = parse_params(base).fingerprint()
    assert parse_params({**base, "max_steps": 99, "log_every": 1, "epochs": 3}).fingerprint() \
        == fp
    assert parse_params({**base, "lr": 0.5}).fingerprint() != fp


# --- inputs ---------------------------------------------------------------------------------

@pytest.fixture
def inputs(tmp_path):
    """3 tokenized rows and matching hidden states for layers [1, 4, 7] + the last."""
    import datasets
    from safetensors.torch import save_file

    tok = tmp_path / "tok"
    ids = [[5, 6, 7, 8], [9, 10, 11], [12, 13, 14, 15, 16]]
    ds = datasets.Dataset.from_dict({"input_ids": ids, "loss_mask": [[1] * len(x) for x in ids],
                                     "seq_len": [len(x) for x in ids]})
    ds.save_to_disk(str(tok))          # plain (python) format: the stage must cope
    torch.save({i: 1 for x in ids for i in x}, tok / "token_freq.pt")
    hs = tmp_path / "hs"
    hs.mkdir()
    g = torch.Generator().manual_seed(0)
    for i, x in enumerate(ids):
        save_file({"hidden_states": torch.randn(len(x), 4, 64, generator=g),
                   "token_ids": torch.tensor(x)}, str(hs / f"hs_{i}.safetensors"))
    return tok, hs


def _spec(tmp_path, tok, hs, params, config=CONFIG):
    inputs = {"target": {"path": str(tmp_path / "target"), "config": config},
              "tokenized": {"path": str(tok), "meta": {}}}
    if hs is not None:
        inputs["hidden_states"] = {"path": str(hs), "meta": {"layer_ids": [1, 4, 7]}}
    return {"params": params, "inputs": inputs, "out_dir": str(tmp_path / "out"),
            "work_dir": str(tmp_path / "work")}


def _resolve(tmp_path, tok, hs, drafter=None, source="offline", config=CONFIG, **params):
    d = {"type": "dflash", "mask_token_id": 3, "draft_vocab_size": 16, **(drafter or {})}
    raw = {"drafter": d, **params}
    return train_job(_spec(tmp_path, tok, hs, raw, config), source)


def test_offline_layers_default_to_the_hidden_states_and_may_be_a_subset(tmp_path, inputs):
    tok, hs = inputs
    job = _resolve(tmp_path, tok, hs)
    assert (job.layer_ids, job.layer_select, job.attention) == ([1, 4, 7], None, "sdpa")
    assert (job.draft_vocab_size, job.mask_token_id, job.source) == (16, 3, "offline")
    sub = _resolve(tmp_path, tok, hs, {"target_layer_ids": [7, 1]})
    assert (sub.layer_ids, sub.layer_select) == ([7, 1], [2, 0])

    from workers.stages.train.data import LayerSubsetTransfer

    full = LayerSubsetTransfer(hs, [0, 1, 2]).get_cached(1)["hidden_states"]
    got = LayerSubsetTransfer(hs, sub.layer_select).get_cached(1)
    assert torch.equal(got["hidden_states"], full[:, [2, 0, 3]])   # + the last layer
    assert got["token_ids"].tolist() == [9, 10, 11]


def test_input_problems_are_typed(tmp_path, inputs):
    tok, hs = inputs

    def code(**kw) -> tuple[str, str]:
        with pytest.raises(StageError) as e:
            _resolve(tmp_path, tok, kw.pop("hs", hs), **kw)
        return e.value.code, e.value.message

    c, m = code(drafter={"target_layer_ids": [2]})
    assert c == "invalid_params" and "[1, 4, 7]" in m
    assert code(hs=None)[0] == "invalid_input"
    assert code(drafter={"draft_vocab_size": 200000})[0] == "invalid_params"
    assert code(attention="flex")[0] == "invalid_params"
    assert code(config={**CONFIG, "hidden_size": 32})[0] == "invalid_input"
    (hs / "hs_2.safetensors").unlink()
    c, m = code()
    assert c == "invalid_input" and "hs_2" in m
    (tok / "token_freq.pt").unlink()
    assert code(hs=None, source="hf")[0] == "invalid_input"   # no token_freq for 16 tokens


def test_online_layers_default_to_the_extract_stage_default(tmp_path, inputs):
    from workers.stages.extract.layers import default_layer_ids

    tok, _hs = inputs
    job = _resolve(tmp_path, tok, None, source="hf", mode="online")
    assert job.layer_ids == default_layer_ids("dflash", 8) and job.source == "hf"


def test_mask_token_for_the_qwen3_tokenizer():
    """Qwen3's tokenizer has no mask token; a spare embedding row is used when the target
    has one (real Qwen3: 151,936 rows), else pad (the tiny target: exactly 151,669)."""
    from workers.stages.tinymodel import qwen3_tokenizer_dir
    from workers.stages.train.job import resolve_mask_token_id

    tok = str(qwen3_tokenizer_dir())
    assert resolve_mask_token_id(tok, 151669, None) == 151643          # <|endoftext|>
    assert resolve_mask_token_id(tok, 151936, None) == 151669
    with pytest.raises(StageError):
        resolve_mask_token_id(tok, 151669, 151669)


# --- processes and command lines ------------------------------------------------------------

def test_device_plan_splits_the_leased_gpus(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5,6,7")
    assert launch.plan_devices(0, None, "offline", 1) == launch.DevicePlan("cpu", 1)
    assert launch.plan_devices(0, 2, "offline", 1).nproc == 2
    p = launch.plan_devices(4, None, "offline", 1)
    assert (p.device, p.nproc, p.train_gpus, p.vllm_gpus) == ("cuda", 4, ["3", "5", "6", "7"],
                                                              [])
    p = launch.plan_devices(4, None, "vllm", 1)
    assert (p.nproc, p.train_gpus, p.vllm_gpus) == (3, ["5", "6", "7"], ["3"])
    assert launch.worker_env(p)["CUDA_VISIBLE_DEVICES"] == "5,6,7"
    for args, code in (((1, None, "vllm", 1), "insufficient_gpus"),
                       ((2, 4, "offline", 1), "invalid_params"),
                       ((0, None, "vllm", 1), "backend_unavailable")):
        with pytest.raises(StageError) as e:
            launch.plan_devices(*args)
        assert e.value.code == code


def test_torchrun_command_line():
    spec = Path("/w/launch/worker.json")
    cmd = launch.torchrun_command(4, spec)
    assert cmd == [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes",
                   "1", "--nproc-per-node", "4", "--max-restarts", "0", "-m",
                   "workers.stages.train.launch", "--spec", str(spec)]
    # torchrun's own parser reads it as intended.
    from torch.distributed.run import get_args_parser

    a = get_args_parser().parse_args(cmd[3:])
    assert (a.standalone, a.nproc_per_node, a.max_restarts, a.module) == (True, "4", 0, True)
    assert a.training_script == "workers.stages.train.launch"
    assert a.training_script_args == ["--spec", str(spec)]
    env = launch.worker_env(launch.DevicePlan("cpu", 2))
    repo = str(Path(__file__).resolve().parents[2])
    assert env["PYTHONPATH"].split(os.pathsep)[0] == repo


def test_vllm_command_lines(tmp_path):
    cmd = launch.vllm_server_command("/m/target", [1, 4, 7], 8, tmp_path / "hs", 8123, tp=2,
                                     max_model_len=2048, gpu_memory_utilization=0.8,
                                     options=OnlineParams(enforce_eager=True))
    assert cmd[:5] == [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", "/m/target"]
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1"
    spec = json.loads(cmd[cmd.index("--speculative-config") + 1])
    assert spec["method"] == "extract_hidden_states"
    assert spec["draft_model_config"]["hf_config"]["eagle_aux_hidden_state_layer_ids"] == \
        [1, 4, 7, 8]   # the aux layers, then N: the last entry the trainer splits off
    kv = json.loads(cmd[cmd.index("--kv-transfer-config") + 1])
    assert kv["kv_connector_extra_config"]["shared_storage_path"] == str(tmp_path / "hs")
    assert cmd[cmd.index("--tensor-parallel-size") + 1] == "2"
    assert cmd[cmd.index("--port") + 1] == "8123" and cmd[-1] == "--enforce-eager"

    serve = build.vllm_serve_command("/models/my target", "/art/drafter/x",
                                     {"method": "dflash", "num_speculative_tokens": 7})
    argv = shlex.split(serve)
    assert argv[:4] == ["vllm", "serve", "/models/my target", "--speculative-config"]
    assert json.loads(argv[4]) == {"model": "/art/drafter/x", "method": "dflash",
                                   "num_speculative_tokens": 7}


# --- checkpoints and stopping ---------------------------------------------------------------

def test_a_checkpoint_of_another_config_is_refused(tmp_path, inputs):
    from workers.stages.train.loop import _find_checkpoint

    tok, hs = inputs
    job = _resolve(tmp_path, tok, hs, max_steps=10)
    ckpt = Path(job.work_dir) / "checkpoints" / "step_5"
    ckpt.mkdir(parents=True)
    state = {"step": 5, "fingerprint": job.p.fingerprint()}
    (ckpt / "trainer_state.json").write_text(json.dumps(state))
    longer = _resolve(tmp_path, tok, hs, max_steps=50)     # a steering change: resumes
    assert _find_checkpoint(longer, print) == (ckpt, state)
    other = _resolve(tmp_path, tok, hs, max_steps=10, lr=0.5)
    with pytest.raises(StageError) as e:
        _find_checkpoint(other, print)
    assert e.value.code == "checkpoint_mismatch" and e.value.details["fields"] == ["lr"]
    # A half-written checkpoint (no trainer_state.json yet) is not a candidate.
    (Path(job.work_dir) / "checkpoints" / "step_9").mkdir()
    assert _find_checkpoint(longer, print)[0] == ckpt


def test_stop_request_turns_signals_into_a_flag():
    from workers.stages.train.runtime import StopRequest, Topology

    before = signal.getsignal(signal.SIGTERM)
    with StopRequest(grace_s=60) as stop:
        assert not stop.agreed(Topology(), torch.device("cpu"))
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)      # the duplicate from torchrun: same request
        assert stop.requested and stop.signum == signal.SIGTERM
        assert stop.agreed(Topology(), torch.device("cpu"))
    assert signal.getsignal(signal.SIGTERM) is before
    with StopRequest(grace_s=0) as stop, pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)        # a later repeat: abort now
