"""Token-count buckets: the dynamic dimension T (tokens in a step) in ranges a kernel variant
is specialised and tuned for, each with the token count the tuner measures it at."""

from __future__ import annotations

# (name, lowest T, highest T, T the tuner times)
BUCKETS = (
    ("1", 1, 1, 1),
    ("2-8", 2, 8, 4),
    ("9-64", 9, 64, 32),
    ("65-512", 65, 512, 256),
    (">512", 513, 1 << 62, 1024),
)
BUCKET_TOKENS = {name: tokens for name, _, _, tokens in BUCKETS}


def bucket_of(tokens: int) -> str:
    for name, low, high, _ in BUCKETS:
        if low <= tokens <= high:
            return name
    raise ValueError(f"no bucket for {tokens} tokens")
