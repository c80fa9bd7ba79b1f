"""Whitespace-tokenised parallel text: {split}.src and {split}.tgt, line i of one translating line i of
the other (the format `tformer data` writes)."""

from __future__ import annotations

from pathlib import Path

from tformer.data.corpus import read_lines
from tformer.errors import DataError


def read_parallel(folder: str | Path, split: str) -> list[tuple[list[str], list[str]]]:
    folder = Path(folder)
    src_path, tgt_path = folder / f"{split}.src", folder / f"{split}.tgt"
    src, tgt = read_lines(src_path), read_lines(tgt_path)
    if len(src) != len(tgt):
        raise DataError(f"{src_path} has {len(src)} lines but {tgt_path} has {len(tgt)}: "
                        "the files must be aligned line by line")
    pairs = []
    for n, (s, t) in enumerate(zip(src, tgt), 1):
        s_tok, t_tok = s.split(), t.split()
        if not s_tok or not t_tok:
            side = src_path if not s_tok else tgt_path
            raise DataError(f"{side}, line {n}: empty line; remove the pair from both files")
        pairs.append((s_tok, t_tok))
    if not pairs:
        raise DataError(f"{src_path} is empty")
    return pairs


def write_parallel(folder: str | Path, split: str, pairs: list[tuple[list[str], list[str]]]) -> None:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{split}.src").write_text("".join(" ".join(s) + "\n" for s, _ in pairs), encoding="utf-8")
    (folder / f"{split}.tgt").write_text("".join(" ".join(t) + "\n" for _, t in pairs), encoding="utf-8")
