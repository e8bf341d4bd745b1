"""Unit tests of the generate stage's parts that need no model: turn planning, reasoning
split, params, stop truncation, the shard store."""

from __future__ import annotations

from functools import partial

import pytest

from contracts.generate import GenerateParams
from workers.stages.common import StageError
from workers.stages.generate.backends.base import truncate_at_stop
from workers.stages.generate.plan import RecordJob, answer_positions, turn_seed
from workers.stages.generate.render import opens_think, split_reasoning
from workers.stages.generate.shards import ShardStore, assemble, shard_row
from workers.stages.kernel import parse_params as _parse

parse_params = partial(_parse, GenerateParams)

U = {"role": "user", "content": "q"}
A = {"role": "assistant", "content": "a"}
S = {"role": "system", "content": "s"}
CALL = {"role": "assistant", "content": "", "tool_calls": [{"type": "function",
        "function": {"name": "f", "arguments": {}}}]}
TOOL = {"role": "tool", "content": "42"}


@pytest.mark.parametrize("msgs,mode,want", [
    ([U], "all", [1]),                       # prompt only: one appended answer
    ([S, U], "last", [2]),
    ([U, A, U, A], "all", [1, 3]),
    ([U, A, U, A], "last", [3]),
    ([U, A, U], "all", [1, 3]),              # ends on a user turn: answer appended
    ([U, A, U], "last", [3]),
    ([U, CALL, TOOL, A], "all", [3]),        # the tool call is kept, its results answer it
    ([U, CALL, TOOL], "all", [3]),           # ends on a tool result: answer appended
    ([U, A, U, CALL], "last", []),           # final turn is a tool call: nothing to answer
    ([S], "all", []),
    ([], "all", []),
])
def test_answer_positions(msgs, mode, want):
    assert answer_positions(msgs, mode) == want


def test_record_job_replaces_and_appends_in_order():
    rec = {"id": "r", "source": "s:1", "messages": [S, U, A, U]}
    job = RecordJob.create(0, rec, "all")
    assert job.positions == [2, 4]
    assert job.history() == [S, U]
    job.answer("think", "one", [1, 2], [3, 4], "stop")
    assert job.history()[2] == {"role": "assistant", "content": "one", "reasoning": "think"}
    job.answer(None, "two", [5], [6], "length")
    assert job.done and job.failure is None
    out = job.output()
    assert [m["content"] for m in out["messages"]] == ["s", "q", "one", "q", "two"]
    assert rec["messages"][2] == A  # the input record is not mutated
    assert [t["turn"] for t in job.turns] == [2, 4]


def test_turn_seed_is_stable_and_distinct():
    assert turn_seed(0, "a", 1) == turn_seed(0, "a", 1)
    assert len({turn_seed(0, "a", 1), turn_seed(1, "a", 1), turn_seed(0, "b", 1),
                turn_seed(0, "a", 3)}) == 4


@pytest.mark.parametrize("text,prompt_open,want", [
    # Qwen3 thinking on: the model writes the whole block.
    ("<think>\nstep 1\n</think>\n\nThe answer.", False, ("step 1", "The answer.")),
    # Qwen3.5/3.6 thinking on: the prompt opened the block.
    ("step 1\n</think>\n\nThe answer.", True, ("step 1", "The answer.")),
    ("still thinking", True, ("still thinking", "")),          # ran out of tokens
    ("<think>\nhalf", False, ("half", "")),
    ("Plain answer.", False, (None, "Plain answer.")),         # thinking off
    ("a</think>b</think>c", False, ("a", "b</think>c")),      # only the first close splits
])
def test_split_reasoning(text, prompt_open, want):
    assert split_reasoning(text, prompt_open) == want


def test_opens_think():
    assert opens_think("<|im_start|>assistant\n<think>\n")
    assert not opens_think("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not opens_think("<|im_start|>assistant\n")


def test_params_defaults_and_errors():
    p = parse_params({})
    assert (p.backend, p.turns, p.temperature, p.max_tokens, p.batch_size) == \
        ("auto", "all", 0.0, 256, 32)
    assert p.vllm.tensor_parallel_size == 1 and p.vllm.concurrency == 64
    with pytest.raises(StageError) as e:
        parse_params({"max_tokenz": 3})
    assert e.value.code == "invalid_params" and "max_tokenz" in e.value.message
    with pytest.raises(StageError) as e:
        parse_params({"vllm": {"tensor_parallel_size": 0}})
    assert "vllm.tensor_parallel_size" in e.value.message
    with pytest.raises(StageError) as e:
        parse_params({"turns": "first"})
    assert "turns" in e.value.message


def test_truncate_at_stop_finds_first_occurrence():
    vocab = {1: "Hel", 2: "lo", 3: " ST", 4: "OP", 5: " more", 6: " STOP"}

    def decode(ids):
        return "".join(vocab[i] for i in ids)

    assert truncate_at_stop([1, 2, 3, 4, 5, 6], decode, ["STOP"]) == [1, 2, 3, 4]
    assert truncate_at_stop([1, 2, 5], decode, ["STOP"]) is None
    assert truncate_at_stop([1, 2, 5], decode, []) is None


def _rec(i):
    return {"id": f"r{i}", "source": f"t:{i}", "messages": [U, A]}


def test_shard_store_resume_fingerprint_and_assembly(tmp_path):
    store = ShardStore(tmp_path / "gen")
    assert store.open("fp1")
    turns = [{"turn": 1, "prompt_ids": [1, 2], "completion_ids": [3, 4, 5],
              "finish_reason": "stop"}]
    store.write([shard_row(0, _rec(0), turns=turns), shard_row(1, _rec(1), "empty_answer", "x")])
    (store.dir / ".shard-000001.parquet.tmp999").write_bytes(b"half")  # a killed write
    store.write([shard_row(2, _rec(2), turns=turns), shard_row(0, _rec(0), turns=turns)])
    assert store.open("fp1")  # same fingerprint: kept
    assert not list(store.dir.glob(".*tmp*"))
    ids, failed = store.done()
    assert ids == {"r0", "r1", "r2"} and failed == 1
    out = assemble(store, tmp_path / "ds")
    # r0 appears in two shards but once in the output
    assert (out.num_records, out.num_failed, out.tokens_generated) == (2, 1, 6)
    assert out.failed_by_reason == {"empty_answer": 1}
    assert out.finish_reasons == {"stop": 2}
    assert not store.open("fp2")  # other params: old shards are not mixed in
    assert store.done() == (set(), 0)


def test_backend_choice_eos_ids_and_gpu_count(tmp_path, monkeypatch):
    import json
    from types import SimpleNamespace

    from contracts.resolved import ResolvedTarget
    from workers.stages.generate.stage import (
        _check_gpus,
        config_context_len,
        eos_token_ids,
        resolve_backend,
    )

    assert resolve_backend("auto") == "hf"  # no CUDA here
    monkeypatch.setenv("DRAFTYARD_VLLM_COMMAND", "/opt/vllm/bin/vllm")  # a vLLM, no GPU
    assert resolve_backend("auto") == "hf"
    assert resolve_backend("vllm") == "vllm"
    # EOS ids: generation_config first, then config, then the tokenizer; each once.
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [151645,
                                                                                 151643]}))
    target = ResolvedTarget(path=str(tmp_path), config={"eos_token_id": 151645})
    assert eos_token_ids(target, SimpleNamespace(eos_token_id=7)) == (151645, 151643, 7)
    assert config_context_len({"max_position_embeddings": 4096}) == 4096
    assert config_context_len({"text_config": {"max_position_embeddings": 2048}}) == 2048
    assert config_context_len({}) is None
    p = parse_params({"vllm": {"tensor_parallel_size": 2, "data_parallel_size": 2}})
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    _check_gpus(p)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    with pytest.raises(StageError) as e:
        _check_gpus(p)
    assert e.value.code == "invalid_params" and "4 GPUs" in e.value.message
