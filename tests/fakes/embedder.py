"""A stand-in for the router's WordLlama embedder: a fixed unit vector per text, no model."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

HASH_DIM = 8


class HashEmbedder:
    """Each text's vector is drawn from a generator seeded by its hash: the same text always
    embeds the same, different texts almost never alike. Named as WordLlama is, so routers
    fitted with it load with it."""

    name = "wordllama-l2-256"
    dim = HASH_DIM

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        rows = []
        for text in texts:
            seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "big")
            v = np.random.default_rng(seed).normal(size=HASH_DIM)
            rows.append(v / np.linalg.norm(v))
        return np.array(rows, dtype=np.float32).reshape(len(texts), HASH_DIM)
