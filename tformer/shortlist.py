"""Lexical shortlists (Marian's --shortlist, CTranslate2's vocabulary map): the target tokens a sentence may
output are the `first` most frequent target tokens plus, for each of its source tokens, the `best` target
tokens most often aligned to it, p(t|s) from word alignments of a parallel corpus. Decoding then computes the
output projection for those rows only, which is most of a small model's decoding step.

    shortlist = build_shortlist(translator, "train.en", "train.de")    # eflomal alignments of the corpus
    shortlist.save("shortlist.safetensors")
    tformer.load(run, shortlist="shortlist.safetensors").translate([...])   # or decode.shortlist=..., --shortlist

The alignments come from eflomal (Östling & Tiedemann, 2016; the aligner of the Firefox Translations pipeline),
run over the model's own subword pieces in both directions; a link in either direction counts. p(t|s) is the
number of links between s and t over the links of s. A shortlist is tied to the vocabularies it was built with
(their fingerprints are stored) and refused for others.

In decoding (`restrict`) each batch computes the output rows of the union of its sentences' lists, once per
batch, and the search runs over those K columns only (softmax, top-k, every rule), as CTranslate2's does. Each
sentence's hypotheses see their own list only (the other columns are -inf), so a sentence's output does not
depend on the sentences it is batched with (CTranslate2's and Marian's use the batch's union). The
softmax is over the sentence's list: where the full search's best path leaves the list, or where renormalising
over it reorders the beam, the output changes; benchmarks/RESULTS.md counts how often.
"""

from __future__ import annotations

import functools
import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, NamedTuple, Sequence

import numpy as np
import torch
from torch import Tensor

from tformer.data.vocab import Vocab
from tformer.errors import ConfigError, DataError
from tformer.files import replace_atomically

FORMAT = "tformer-shortlist/1"
SPECIALS = (Vocab.eos, Vocab.unk)  # always allowed: </s> ends every output; <unk> the model may need


@dataclass(frozen=True)
class Shortlist:
    frequent: np.ndarray  # (F,) int64: the target ids always allowed
    indptr: np.ndarray  # (Vs + 1,) int64: source id s's candidates are indices[indptr[s]:indptr[s + 1]]
    indices: np.ndarray  # (nnz,) int64: target ids, each source id's best by p(t|s) first
    probs: np.ndarray  # (nnz,) float32: their p(t|s)
    fingerprints: tuple[str, str]  # the source and target tokenizers' (tokenizer.fingerprint())
    settings: dict[str, Any] = field(default_factory=dict)  # first, best, threshold, pairs, aligner

    @property
    def source_vocab(self) -> int:
        return len(self.indptr) - 1

    def candidates(self, source_id: int) -> np.ndarray:
        return self.indices[self.indptr[source_id]:self.indptr[source_id + 1]]

    def allowed(self, source: Sequence[int], extra: Iterable[int] = ()) -> np.ndarray:
        """The sorted target ids one sentence (source ids) may output: the frequent ones, </s> and <unk>, its
        source tokens' candidates, and `extra` (its forced prefix and constraint tokens)."""
        parts = [self.frequent, np.asarray(SPECIALS, dtype=np.int64), np.fromiter(extra, dtype=np.int64)]
        parts += [self.candidates(s) for s in set(source) if 0 <= s < self.source_vocab]
        return np.unique(np.concatenate(parts))

    def check(self, translator) -> "Shortlist":
        """Refuse a shortlist built for other vocabularies than `translator`'s (or for a frame encoder, which has
        no source tokens); returns the shortlist."""
        if translator.reads_frames:
            raise ConfigError(f"decode.shortlist maps source tokens to target tokens; {translator.path} reads feature "
                              "frames: decode without one")
        mine = (translator.source_tokenizer.fingerprint(), translator.target_tokenizer.fingerprint())
        if mine != tuple(self.fingerprints):
            raise ConfigError(f"the shortlist {self.settings.get('path', '')} was built for other vocabularies than "
                              f"{translator.path}'s; build one for this model (tformer shortlist --checkpoint "
                              f"{translator.path} ...)")
        return self

    def save(self, path: str | Path) -> Path:
        """One safetensors file (the tables, and the settings and fingerprints as metadata), written atomically."""
        from safetensors.numpy import save

        meta = {"format": FORMAT, "fingerprints": json.dumps(list(self.fingerprints)),
                "settings": json.dumps({k: v for k, v in self.settings.items() if k != "path"})}
        data = save({"frequent": self.frequent, "indptr": self.indptr, "indices": self.indices, "probs": self.probs},
                    metadata=meta)
        path = Path(path)
        with replace_atomically(path, binary=True) as f:
            f.write(data)
        return path

    @classmethod
    def open(cls, path: str | Path) -> "Shortlist":
        """`load`, once per file version (path, size, modification time) in a process."""
        path = Path(path)
        try:
            st = path.stat()
        except FileNotFoundError:
            raise DataError(f"the shortlist {path} does not exist; build one with tformer shortlist") from None
        return _opened(str(path.resolve()), st.st_size, st.st_mtime_ns)

    @classmethod
    def load(cls, path: str | Path) -> "Shortlist":
        from safetensors import SafetensorError, safe_open

        path = Path(path)
        try:
            with safe_open(str(path), "np") as f:
                meta = f.metadata() or {}
                tables = {k: f.get_tensor(k) for k in f.keys()}
        except FileNotFoundError:
            raise DataError(f"the shortlist {path} does not exist; build one with tformer shortlist") from None
        except (SafetensorError, OSError, ValueError) as e:
            raise DataError(f"{path} is not a shortlist file ({e}); build one with tformer shortlist") from None
        if meta.get("format") != FORMAT or set(tables) != {"frequent", "indptr", "indices", "probs"}:
            raise DataError(f"{path} is not a tformer shortlist (format {meta.get('format')!r}, expected "
                            f"{FORMAT!r}); build one with tformer shortlist")
        settings = {**json.loads(meta["settings"]), "path": str(path)}
        return cls(tables["frequent"], tables["indptr"], tables["indices"], tables["probs"],
                   tuple(json.loads(meta["fingerprints"])), settings)


@functools.lru_cache(maxsize=8)
def _opened(path: str, size: int, mtime_ns: int) -> Shortlist:
    return Shortlist.load(path)


# ---------------------------------------------------------------------------------------------- building


def align(sources: list[list[int]], targets: list[list[int]]) -> tuple[list[np.ndarray], ...]:
    """eflomal's links for each pair of id sequences, forward and reverse: per pair an (L, 2) array of
    (source position, target position). eflomal samples, seeded by the system: two runs can differ a little."""
    try:
        import eflomal
    except ImportError:
        raise ConfigError("building a shortlist aligns the corpus with eflomal: pip install 'tformer[distill]'") from None
    with tempfile.TemporaryDirectory() as tmp:
        fwd, rev = Path(tmp) / "fwd", Path(tmp) / "rev"
        aligner = eflomal.Aligner()
        aligner.align([" ".join(map(str, s)) for s in sources], [" ".join(map(str, t)) for t in targets],
                      links_filename_fwd=str(fwd), links_filename_rev=str(rev), quiet=True)
        return tuple([_links(line) for line in p.read_text(encoding="utf-8").splitlines()] for p in (fwd, rev))


def _links(line: str) -> np.ndarray:
    pairs = [p.split("-") for p in line.split()]
    return np.array(pairs, dtype=np.int64).reshape(-1, 2)


def build_shortlist(translator, sources: str | Path, targets: str | Path, *, first: int = 100, best: int = 100,
                    threshold: float = 0.0, progress: bool = False) -> Shortlist:
    """A shortlist for `translator`'s vocabularies from the parallel files `sources`, `targets` (UTF-8, plain
    or gzip, line-aligned; the model's training corpus, or its distilled version): the `first` most frequent
    target tokens, and per source token its `best` target tokens by p(t|s) >= `threshold`."""
    from tformer.data.corpus import iter_lines

    for name, value in (("first", first), ("best", best)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(f"{name} must be a whole number >= 0, got {value!r}")
    if not 0 <= threshold < 1:
        raise ConfigError(f"threshold must be in [0, 1), got {threshold!r}")
    src_lines, tgt_lines = list(iter_lines(sources)), list(iter_lines(targets))
    if len(src_lines) != len(tgt_lines):
        raise DataError(f"{sources} has {len(src_lines)} lines and {targets} {len(tgt_lines)}; give line-aligned "
                        "files")
    pairs = [(translator.encode(s), translator.encode(t, "target")) for s, t in zip(src_lines, tgt_lines)]
    pairs = [(s, t) for s, t in pairs if s and t]
    if not pairs:
        raise DataError(f"{sources} and {targets} hold no pair with text on both sides")
    src, tgt = [s for s, _ in pairs], [t for _, t in pairs]
    Vs, Vt = len(translator.source_tokenizer.vocab), len(translator.target_tokenizer.vocab)
    fwd, rev = align(src, tgt)
    links = []
    for s, t, a, b in zip(src, tgt, fwd, rev):
        both = np.unique(np.concatenate([a, b]), axis=0)
        links.append(np.stack([np.asarray(s)[both[:, 0]], np.asarray(t)[both[:, 1]]], 1))
    st = np.concatenate(links)  # (L, 2) source id, target id of every link
    code = st[:, 0] * Vt + st[:, 1]
    codes, counts = np.unique(code, return_counts=True)
    s_ids, t_ids = codes // Vt, codes % Vt
    per_source = np.bincount(s_ids, weights=counts, minlength=Vs)
    probs = (counts / per_source[s_ids]).astype(np.float32)
    order = np.lexsort((t_ids, -probs, s_ids))  # by source, then p(t|s) down, then id
    s_ids, t_ids, probs = s_ids[order], t_ids[order], probs[order]
    starts = np.searchsorted(s_ids, np.arange(Vs))
    rank = np.arange(len(s_ids)) - starts[s_ids]
    keep = (rank < best) & (probs >= threshold)
    s_ids, t_ids, probs = s_ids[keep], t_ids[keep], probs[keep]
    indptr = np.concatenate([[0], np.cumsum(np.bincount(s_ids, minlength=Vs))]).astype(np.int64)
    frequency = np.bincount(np.concatenate([np.asarray(t) for t in tgt]), minlength=Vt)
    frequency[list(range(4))] = 0  # specials are added by `allowed`
    frequent = np.sort(np.argsort(-frequency, kind="stable")[:first]).astype(np.int64)
    import eflomal  # noqa: F401 (align has checked it is there)
    from importlib.metadata import version

    settings = {"first": first, "best": best, "threshold": threshold, "pairs": len(pairs),
                "aligner": f"eflomal {version('eflomal')}", "sources": str(sources), "targets": str(targets)}
    fingerprints = (translator.source_tokenizer.fingerprint(), translator.target_tokenizer.fingerprint())
    return Shortlist(frequent, indptr, t_ids.astype(np.int64), probs, fingerprints, settings)


# ---------------------------------------------------------------------------------------------- decoding


class ShortlistCache(NamedTuple):
    """A model's cache and, per sentence, 0 where it may output each of the batch's K shortlist columns and -inf
    where it may not (B, K)."""
    inner: Any
    bias: Tensor

    def reorder(self, hyp_rows: Tensor, sentence_rows: Tensor | None = None) -> "ShortlistCache":
        bias = self.bias if sentence_rows is None else self.bias.index_select(0, sentence_rows)
        return ShortlistCache(self.inner.reorder(hyp_rows, sentence_rows), bias)


COLUMN_MULTIPLE = 64  # the batch's columns are padded to a multiple of this (tformer.decode.common.row_max)


class Restricted(NamedTuple):
    """A search over one batch in the columns of its shortlists' union: `step` takes column tokens and returns
    (N, K) logits, `cache` is its cache, and column c stands for target id `ids[c]` (sorted, so <pad>, <s>,
    </s> and <unk>, always present, are columns 0-3 as they are ids 0-3). The searches need nothing else: their
    prefixes and constraints go in as columns (`columns`) and their outputs come back as ids (`tokens`)."""
    step: Any
    cache: ShortlistCache
    ids: Tensor  # (K,)

    def columns(self, lists):
        """Target ids -> columns, in nested lists (prefixes, constraint phrases); None stays None."""
        column = {i: c for c, i in enumerate(self.ids.tolist())}

        def convert(x):
            return x if x is None else column[x] if isinstance(x, int) else [convert(y) for y in x]
        return convert(lists)

    def reachable(self, per_sentence):
        """Phrases (per sentence, a list of id lists, or None) in columns, keeping only those whose every token
        has one: no output of the batch can write the others. For a phrase input whose tokens the shortlist does
        not keep (PhraseInput.written False: phrases to avoid), whose phrases outside it are then moot."""
        column = {i: c for c, i in enumerate(self.ids.tolist())}
        return [None if s is None else [[column[t] for t in p] for p in s if all(t in column for t in p)]
                for s in per_sentence]

    def tokens(self, nbest):
        """A search's NBest in columns -> the same in target ids."""
        ids = self.ids.tolist()
        return type(nbest)([None if hyps is None else [[ids[c] for c in h] for h in hyps] for hyps in nbest.tokens],
                           nbest.scores)


def restrict(model, cache, allowed: list[np.ndarray], vocab_size: int, multiple: int | None = None) -> Restricted:
    """The search over one batch in its columns (`Restricted`): `model`'s decode_step on the union of the
    sentences' `allowed` ids (one sorted id array per sentence, in the batch's order) and the four special ids,
    padded with the lowest other ids to a multiple of `multiple` (default COLUMN_MULTIPLE); each sentence's
    columns are -inf outside its own list. A sentence's hypotheses are consecutive rows, as many for each
    (tformer.decode). The softmax and every search rule then run over K columns instead of the whole vocabulary,
    as CTranslate2's search does with its vocabulary map."""
    union = np.unique(np.concatenate([np.arange(4, dtype=np.int64), *allowed]))
    pad = min(-len(union) % (multiple or COLUMN_MULTIPLE), vocab_size - len(union))
    if pad:
        union = np.union1d(union, np.setdiff1d(np.arange(len(union) + pad), union)[:pad])
    device = cache_device(cache)
    ids = torch.from_numpy(union).to(device)
    keep = torch.stack([torch.from_numpy(np.isin(union, a)) for a in allowed]).to(device)  # (B, K)
    bias = torch.zeros(keep.shape, device=device).masked_fill_(~keep, float("-inf"))
    output = model.restricted_output(ids)

    def step(columns: Tensor, c: ShortlistCache) -> tuple[Tensor, ShortlistCache]:
        own = [_masked(o, c.bias) for o in output] if isinstance(output, list) else _masked(output, c.bias)
        logits, inner = model.decode_step(ids[columns], c.inner, own)  # (N, K)
        return logits, ShortlistCache(inner, c.bias)

    return Restricted(step, ShortlistCache(cache, bias), ids)


def _masked(project, bias: Tensor):
    """`project` with each sentence's columns outside its list -inf, its hypotheses' rows alike: an ensemble's
    models are each normalised over the sentence's own list, so no step depends on the batch's union."""
    def masked(x: Tensor) -> Tensor:
        logits = project(x)  # (N, K)
        (B, K), rows = bias.shape, logits.shape[0]
        return (logits.view(B, rows // B, K) + bias.to(logits.dtype)[:, None]).view(rows, K)
    return masked


def cache_device(cache) -> torch.device:
    """The device of a model's (or an ensemble's) decoder cache."""
    while not hasattr(cache, "src_mask"):
        cache = cache.caches[0]
    return cache.src_mask.device


# ---------------------------------------------------------------------------------------------- CTranslate2


def write_vmap(shortlist: Shortlist, translator, path: str | Path) -> Path:
    """CTranslate2's vocabulary map of `shortlist`: a line '<TAB>always allowed pieces' and, per source piece with
    candidates, 'piece<TAB>its candidates' (CTranslate2 adds <unk>, <s>, </s> itself)."""
    src_itos = translator.source_tokenizer.vocab.itos
    tgt_itos = translator.target_tokenizer.vocab.itos
    with replace_atomically(path) as f:
        f.write("\t" + " ".join(tgt_itos[i] for i in shortlist.frequent) + "\n")
        for s in range(4, shortlist.source_vocab):
            cand = shortlist.candidates(s)
            if len(cand):
                f.write(src_itos[s] + "\t" + " ".join(tgt_itos[i] for i in cand) + "\n")
    return Path(path)
