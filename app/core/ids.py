"""Prefixed, time-sortable ids (`job_01J...`): a 48-bit millisecond clock then 80 random bits
in Crockford base32, so ordering by id is ordering by creation (cursor pagination)."""

from __future__ import annotations

import os
import time

_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"
PREFIXES = ("ds", "job", "run", "art", "tgt", "usr", "tok", "wh", "evt")


def _b32(n: int, length: int) -> str:
    out = []
    for _ in range(length):
        out.append(_ALPHABET[n & 31])
        n >>= 5
    return "".join(reversed(out))


def new_id(prefix: str) -> str:
    assert prefix in PREFIXES, prefix
    ms = int(time.time() * 1000)
    rnd = int.from_bytes(os.urandom(10), "big")
    return f"{prefix}_{_b32(ms, 10)}{_b32(rnd, 16)}"
