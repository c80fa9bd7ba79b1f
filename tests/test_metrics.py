"""Token accuracy and exact match against counts written out by hand."""

import pytest
import torch

from tformer.errors import DataError
from tformer.metrics import exact_match, token_accuracy

PAD = 0


def test_token_accuracy_counts_right_argmaxes_at_real_positions_only():
    target = torch.tensor([3, 1, 0, 2, 0])  # two pads
    logits = torch.full((5, 4), -1.0)
    logits[[0, 1, 2, 3, 4], [3, 2, 0, 2, 1]] = 1.0  # right, wrong, (pad, "right"), right, (pad, wrong)
    assert token_accuracy(logits, target, PAD) == (2, 3)
    assert token_accuracy(logits, target, pad=9) == (3, 5)  # no pad id among them: every position counts


def test_exact_match_is_the_share_of_whole_sequences_equal_to_their_reference():
    refs = [[1, 2], [3], [4, 5, 6], []]
    assert exact_match([[1, 2], [3], [4, 5], []], refs) == 0.75
    assert exact_match([[2, 1], [3, 3], [4, 5], [7]], refs) == 0.0
    assert exact_match(refs, refs) == 1.0
    assert exact_match([], []) == 0.0
    with pytest.raises(DataError, match="2 hypotheses for 4 references"):
        exact_match([[1, 2], [3]], refs)


def test_moses_tokenizes_by_language_and_escapes_nothing():
    from tformer.metrics import moses_tokenize

    assert moses_tokenize(["l'homme don't"], "fr") == ["l' homme don' t"]  # French keeps the elision's apostrophe
    assert moses_tokenize(["l'homme don't"], "en") == ["l 'homme don 't"]  # English moves it to the next token
    assert moses_tokenize(['a & b "c" <d>'], "en") == ['a & b " c " < d >']  # no &amp; / &quot; / &lt;


def test_translation_scores_name_their_tokenizer_and_stay_quiet_on_detokenised_text(caplog):
    import logging

    from tformer.metrics import translation_scores

    hyps = [f"The cat number {i} sat on the mat." for i in range(120)]
    with caplog.at_level(logging.WARNING, logger="sacrebleu"):
        s = translation_scores(hyps, hyps, compound_split=True)  # Moses output ends in " .": tokenized BLEU
    assert not caplog.records, [r.getMessage() for r in caplog.records]  # must not warn about tokenized text
    assert s.tok_bleu_signature.endswith("|moses:en") and s.tok_bleu_lc_signature.endswith("|moses:en")
    assert "case:lc" in s.tok_bleu_lc_signature and "tok:none" in s.tok_bleu_signature
    assert s.as_dict() == {"bleu": s.bleu, "chrf": s.chrf, "tok_bleu": s.tok_bleu, "tok_bleu_lc": s.tok_bleu_lc,
                           "tok_bleu_compound": s.tok_bleu_compound}
    assert s.tok_bleu_compound == pytest.approx(100.0)
    with pytest.raises(DataError, match="1 hypotheses for 2 references"):
        translation_scores(hyps[:1], hyps[:2])
