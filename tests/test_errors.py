"""One family of exceptions for bad input (tformer.errors): each mistake a user can make and fix raises the fitting
TformerError subclass with a message naming where (file, line, key); an invariant only tformer's own code can
break stays a plain ValueError, so the command line and the servers (which catch TformerError only) show its
traceback as the bug it is."""

import gzip
import json

import numpy as np
import pytest
import torch

from tformer.config import DataConfig, ModelConfig, StructureConfig
from tformer.errors import CheckpointError, ConfigError, DataError, TformerError


def _write(path, text: str | bytes):
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


# --------------------------------------------------------------------------- data: corpora and input files


def _misaligned(tmp_path):
    from tformer.data.corpus import read_aligned

    read_aligned(_write(tmp_path / "a.en", "one\ntwo\n"), _write(tmp_path / "a.de", "eins\nzwei\ndrei\n"))


def _invalid_utf8(tmp_path):
    from tformer.data.corpus import read_lines

    read_lines(_write(tmp_path / "latin1.txt", b"fine\ncaf\xe9\n"))


def _nul_byte(tmp_path):
    from tformer.data.corpus import decode_lines

    decode_lines(b"one\ntw\0o\n", "standard input")


def _truncated_gzip(tmp_path):
    from tformer.data.corpus import read_lines

    read_lines(_write(tmp_path / "train.en.gz", gzip.compress(b"one\ntwo\n" * 100)[:30]))


def _tsv_short_line(tmp_path):
    from tformer.data.corpus import read_tsv

    read_tsv(_write(tmp_path / "fra.txt", "Go.\tVa !\nno tab here\n"))


def _missing_corpus(tmp_path):
    from tformer.data.translation import read_split

    read_split(DataConfig(task="translation", dir=str(tmp_path), src_lang="en", tgt_lang="de"), "train")


def _text_empty_line(tmp_path):
    from tformer.data.text import read_parallel

    _write(tmp_path / "train.src", "a b\n\n")
    _write(tmp_path / "train.tgt", "b a\nc\n")
    read_parallel(tmp_path, "train")


def _unknown_split(tmp_path):
    from tformer.data import load_task

    load_task(DataConfig(task="copy"), ("train", "dev"))


def _missing_vocab(tmp_path):
    from tformer.data.vocab import Vocab

    Vocab.load(tmp_path / "vocab.src.txt")


def _vocab_bad_token(tmp_path):
    from tformer.data.vocab import Vocab

    Vocab.load(_write(tmp_path / "vocab.txt", "<pad>\n<s>\n</s>\n<unk>\nhello world\n"))


def _not_sentencepiece(tmp_path):
    from tformer.data.tokenizer import SubwordTokenizer

    SubwordTokenizer.load(_write(tmp_path / "spm.src.model", b"this is no protobuf \xff\xfe" * 8))


def _speech_nan(tmp_path):
    from tformer.data.speech import load_frames

    frames = np.zeros((4, 3), dtype=np.float32)
    frames[2, 1] = np.nan
    np.save(tmp_path / "u7.npy", frames)
    load_frames(tmp_path / "u7.npy", 3)


def _speech_split_missing_npy(tmp_path):
    from tformer.data.speech import read_speech_split

    _write(tmp_path / "train.tsv", "u1\thello\n")
    read_speech_split(DataConfig(task="speech", dir=str(tmp_path)), "train", 3)


def _text_into_frame_encoder(tmp_path):
    from tformer.data.speech import FrameInput

    FrameInput().encode("hello")


def _download_offline(tmp_path):
    from tformer.data.download import fetch

    fetch("http://127.0.0.1:9/train.en.gz", timeout=5)  # the discard port: nothing listens on loopback


# --------------------------------------------------------------------------- structures, metrics, viz


def _edge_file_bad_line(tmp_path):
    from tformer.structures import build_structure

    build_structure(StructureConfig(edges=str(_write(tmp_path / "edges.txt", "0 0\n1 x\n"))))


def _edge_file_missing(tmp_path):
    from tformer.structures import build_structure

    build_structure(StructureConfig(edges=str(tmp_path / "no_edges.txt")))


def _hypotheses_for_references(tmp_path):
    from tformer.metrics import translation_scores

    translation_scores(["a cat"], ["a cat", "a dog"])


def _exact_match_counts(tmp_path):
    from tformer.metrics import exact_match

    exact_match([[1, 2]], [])


def _error_rate_counts(tmp_path):
    from tformer.data.speech import error_rates

    error_rates(["abc", "d"], ["abc"])


def _no_recording(tmp_path):
    from tformer.viz.record import load_recording

    load_recording(tmp_path / "run")


def _damaged_recording(tmp_path):
    from tformer.viz.record import load_recording

    (tmp_path / "run" / "attention").mkdir(parents=True)
    _write(tmp_path / "run" / "attention" / "step_0000100.safetensors", b"not safetensors")
    load_recording(tmp_path / "run")


def _recording_whose_labels_name_missing_tensors(tmp_path):
    """A valid safetensors file whose labels promise an example the tensors do not hold (tampered, or
    written by something else)."""
    from safetensors.numpy import save_file

    from tformer.viz.record import load_recording

    (tmp_path / "run" / "attention").mkdir(parents=True)
    save_file({"0.encoder": np.zeros((1, 1, 2, 2), dtype=np.float16)},
              str(tmp_path / "run" / "attention" / "step_0000100.safetensors"),
              metadata={"labels": json.dumps([[["a", "</s>"], ["A"]]])})
    load_recording(tmp_path / "run")


def _example_out_of_range(tmp_path):
    from tformer.viz.record import Recording, animate_attention

    animate_attention(Recording([0], [[None]]), 3, "encoder", 0, 0, tmp_path / "a.gif")


def _metrics_not_json(tmp_path):
    from tformer.viz.curves import read_metrics

    _write(tmp_path / "metrics.jsonl", '{"kind": "train", "step": 1}\nstep 2: loss 3.1\n{"kind": "train", "step": 3}\n')
    read_metrics(tmp_path)


def _metrics_missing(tmp_path):
    from tformer.viz.curves import plot_curves

    (tmp_path / "run").mkdir()
    plot_curves(tmp_path / "run")


def _no_ponder_records(tmp_path):
    from tformer.viz.ponder import plot_ponder_curve

    plot_ponder_curve(_write(tmp_path / "metrics.jsonl", json.dumps({"kind": "train", "step": 1, "loss": 2.0})))


def _ponder_curve_bad_line(tmp_path):
    from tformer.viz.ponder import plot_ponder_curve

    plot_ponder_curve(_write(tmp_path / "metrics.jsonl", '{"kind": "train", "step": 1}\n[\n{"kind": "x", "step": 2}\n'))


# --------------------------------------------------------------------------- settings and checkpoints


def _over_long_example(tmp_path):
    from tformer.data import token_budget_batches

    token_budget_batches([5, 40], [5, 12], max_tokens=32)


def _pairs_of_translation_task(tmp_path):
    from tformer.data import load_pairs

    load_pairs(DataConfig(task="translation", dir=str(tmp_path)), "train")


def _valid_and_test_take_everything(tmp_path):
    from tformer.data.corpus import Corpus, split_corpus

    split_corpus(Corpus(["a", "b"], ["x", "y"], "tiny.tsv", [1, 2]), valid_size=1, test_size=1, seed=0)


def _edge_function_not_importable(tmp_path):
    from tformer.structures import build_structure

    build_structure(StructureConfig(edges="no_such_module_xyz:edges"))


def _not_exportable(tmp_path):
    from tformer.export import check_exportable

    check_exportable(ModelConfig(kind="universal"))


def _shared_embeddings_two_vocabularies(tmp_path):
    from tformer.model import build_model

    build_model(ModelConfig(d_model=8, n_heads=2, d_ff=16, share_embeddings=True), 10, 12)


def _ponder_of_vanilla_model(tmp_path):
    from tformer.evaluation import ponder_steps
    from tformer.model import build_model

    ponder_steps(build_model(ModelConfig(d_model=8, n_heads=2, d_ff=16), 10, 10), [([4, 5], [6])])


def _cuda_without_cuda(tmp_path):
    from tformer.training.distributed import resolve_device

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    resolve_device("cuda")


def _checkpoint_without_vocabulary(tmp_path):
    from tformer.checkpoint import load_tokenizers

    load_tokenizers(tmp_path)


CASES = [
    # (what goes wrong, the call, the class, a piece of the message that says where)
    ("misaligned corpus", _misaligned, DataError, "a.de has 3: the files disagree from line 3"),
    ("invalid UTF-8", _invalid_utf8, DataError, "latin1.txt, line 2, byte 4"),
    ("NUL byte", _nul_byte, DataError, "standard input, line 2"),
    ("truncated gzip", _truncated_gzip, DataError, "train.en.gz looks gzip-compressed"),
    ("TSV line without a tab", _tsv_short_line, DataError, "fra.txt, line 2"),
    ("missing corpus file", _missing_corpus, DataError, "train.en.gz exists"),
    ("empty line in parallel text", _text_empty_line, DataError, "train.src, line 2"),
    ("unknown split", _unknown_split, DataError, "unknown split 'dev'"),
    ("missing vocabulary file", _missing_vocab, DataError, "vocab.src.txt does not exist"),
    ("vocabulary token with a space", _vocab_bad_token, DataError, "vocab.txt, line 5"),
    ("not a SentencePiece model", _not_sentencepiece, DataError, "spm.src.model is not a SentencePiece model"),
    ("speech frames with NaN", _speech_nan, DataError, "u7.npy: frame 2 holds NaN"),
    ("speech utterance without .npy", _speech_split_missing_npy, DataError, "train.tsv, line 1: utterance 'u1'"),
    ("text into a frame encoder", _text_into_frame_encoder, DataError, "reads .npy features"),
    ("download while offline", _download_offline, DataError, "cannot download http://127.0.0.1:9/train.en.gz"),
    ("bad structure edge file", _edge_file_bad_line, DataError, "edges.txt:2"),
    ("missing structure edge file", _edge_file_missing, DataError, "no_edges.txt does not exist"),
    ("BLEU hypothesis count", _hypotheses_for_references, DataError, "1 hypotheses for 2 references"),
    ("exact match count", _exact_match_counts, DataError, "1 hypotheses for 0 references"),
    ("error rate count", _error_rate_counts, DataError, "2 hypotheses for 1 references"),
    ("no attention recording", _no_recording, DataError, "has no recorded attention"),
    ("damaged attention recording", _damaged_recording, DataError, "step_0000100.safetensors is not a tformer"),
    ("recording labels without tensors", _recording_whose_labels_name_missing_tensors, DataError,
     "step_0000100.safetensors is not a tformer attention recording (KeyError: '0.decoder')"),
    ("example index out of range", _example_out_of_range, DataError, "1 examples (0..0); got 3"),
    ("metrics line not JSON", _metrics_not_json, DataError, "metrics.jsonl:2: not a JSON record"),
    ("metrics file missing", _metrics_missing, DataError, "metrics.jsonl does not exist"),
    ("no ponder records", _no_ponder_records, DataError, "has no ponder records"),
    ("ponder curve from a bad line", _ponder_curve_bad_line, DataError, "metrics.jsonl:2"),
    ("example over train.max_tokens", _over_long_example, ConfigError, "train.max_tokens=32"),
    ("load_pairs of translation", _pairs_of_translation_task, ConfigError, "goes through load_task"),
    ("valid + test leave no training", _valid_and_test_take_everything, ConfigError, "tiny.tsv: 2 pairs"),
    ("edge function not importable", _edge_function_not_importable, ConfigError, "no_such_module_xyz:edges"),
    ("model CTranslate2 cannot run", _not_exportable, ConfigError, "model.kind=universal"),
    ("shared embeddings, two vocabularies", _shared_embeddings_two_vocabularies, ConfigError,
     "model.share_embeddings"),
    ("ponder steps of a vanilla model", _ponder_of_vanilla_model, ConfigError, "model.kind=universal"),
    ("cuda without a GPU", _cuda_without_cuda, ConfigError, "train.device"),
    ("checkpoint without vocabulary", _checkpoint_without_vocabulary, CheckpointError, "vocab.src.txt"),
]


@pytest.mark.parametrize("what, call, cls, where", CASES, ids=[c[0] for c in CASES])
def test_user_mistakes_raise_the_fitting_tformer_error(tmp_path, what, call, cls, where):
    with pytest.raises(cls) as info:
        call(tmp_path)
    assert isinstance(info.value, TformerError)
    assert where in str(info.value), f"{what}: the message should name {where!r}: {info.value}"


def test_the_family_keeps_working_for_code_that_catches_value_error():
    from tformer.data.corpus import decode_lines

    with pytest.raises(ValueError, match="line 1"):  # code written before the family still catches it
        decode_lines(b"\0", "x")


# --------------------------------------------------------------------------- bugs stay bugs


def _graph_kernel_without_graph():
    from tformer.attention.graph import graph_attention

    q = torch.zeros(1, 2, 3, 4)
    graph_attention(q, q, q, mask=torch.ones(1, 3, 3, dtype=torch.bool))


def _unknown_kernel():
    from tformer.attention.registry import get_kernel

    get_kernel("flash-v9")


def _unknown_positions():
    from tformer.positions import build_positions

    build_positions("hyperbolic", 8, 16)


@pytest.mark.parametrize("call, message", [(_graph_kernel_without_graph, "needs a Graph"),
                                           (_unknown_kernel, "unknown attention kernel 'flash-v9'"),
                                           (_unknown_positions, "unknown positions 'hyperbolic'")],
                         ids=["graph kernel without a Graph", "unknown kernel", "unknown positions"])
def test_internal_invariants_stay_plain_value_errors(call, message):
    """Names and shapes the configuration validated or tformer's own code built: breaking them is a bug, and
    must not be caught by the command line as if it were the user's mistake."""
    with pytest.raises(ValueError, match=message) as info:
        call()
    assert not isinstance(info.value, TformerError)


def test_a_bad_line_inside_a_checkpoint_is_a_checkpoint_error_not_a_relabelled_bug(tmp_path):
    """load_tokenizers re-labels only the data errors of its files; a damaged vocabulary says which file."""
    from tformer.checkpoint import load_tokenizers

    _write(tmp_path / "vocab.src.txt", "<pad>\n<s>\n</s>\n<unk>\na\n")
    _write(tmp_path / "vocab.tgt.txt", "<pad>\n<s>\n</s>\n<unk>\nb c\n")
    with pytest.raises(CheckpointError, match=r"vocab\.tgt\.txt, line 5"):
        load_tokenizers(tmp_path)
