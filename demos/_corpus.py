"""The shipped corpus (demos/data/corpus.txt) as character ids, and random windows of it."""
import pathlib

import numpy as np

from minidist import backend


def load_corpus() -> tuple[list[str], np.ndarray]:
    """(the sorted characters, the text as their ids)."""
    text = (pathlib.Path(__file__).parent / "data" / "corpus.txt").read_text()
    chars = sorted(set(text))
    ids = {c: i for i, c in enumerate(chars)}
    return chars, np.array([ids[c] for c in text], dtype=np.int64)


def windows(data: np.ndarray, batch: int, block: int, seed: int):
    """Endless (x, y) batches of ``batch`` random windows of ``block`` characters, y one
    character ahead of x: the same sequence for every run with the same seed."""
    rng = np.random.default_rng(seed)
    while True:
        starts = rng.integers(0, len(data) - block - 1, batch)
        x = np.stack([data[s:s + block] for s in starts])             # (B, T)
        y = np.stack([data[s + 1:s + block + 1] for s in starts])     # (B, T)
        yield backend.from_host(x), backend.from_host(y)
