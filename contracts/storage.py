"""How many bytes a stage will write, from what is known before it starts: the
scheduler reserves this on the volume when it places the job (app/storage/reserve.py), and
the extract planner checks the same number against the free space (workers/stages/extract/
planner.py). Pure arithmetic, shared by both sides."""

from __future__ import annotations

DTYPE_SIZES = {"bfloat16": 2, "float16": 2, "float32": 4}
TOKEN_ID_BYTES = 8            # token ids are stored as int64, as speculators compares them
# A safetensors header for {hidden_states, token_ids} is ~150 bytes, padded to 8: the
# allowance per file keeps the disk check honest for data sets of very short samples.
FILE_OVERHEAD_BYTES = 256
# Stated estimates of the stages whose output is not known exactly in advance:
# prepare writes per token the input ids, the loss mask and the position (int64 + int8 +
# int32, uncompressed in the layout speculators reads) plus per-row offsets: about 16 bytes a
# token, against roughly 4 bytes a token of Parquet text in its dataset. So 4x its input.
PREPARE_PER_INPUT_BYTE = 4
# generate writes the regenerated responses as text and their token ids: per record at most
# max_tokens tokens of ~4 bytes of text + 8 bytes of id, plus the records it copies.
GENERATE_BYTES_PER_TOKEN = 12


def hidden_state_bytes(num_tokens: int, num_layers: int, hidden_size: int, dtype_size: int,
                       num_samples: int = 0) -> int:
    """Bytes on disk for `num_tokens` tokens: hidden states at `num_layers` stored layers
    (aux layers + the last one) plus the token ids, plus a header allowance per sample file."""
    payload = num_tokens * (num_layers * hidden_size * dtype_size + TOKEN_ID_BYTES)
    return payload + num_samples * FILE_OVERHEAD_BYTES


def prepare_bytes(dataset_bytes: int) -> int:
    return int(dataset_bytes) * PREPARE_PER_INPUT_BYTE


def generate_bytes(num_records: int, max_tokens: int, dataset_bytes: int) -> int:
    return int(num_records) * int(max_tokens) * GENERATE_BYTES_PER_TOKEN + int(dataset_bytes)


def human_bytes(n: int | float) -> str:
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} PiB"
