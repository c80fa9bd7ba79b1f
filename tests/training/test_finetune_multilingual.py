"""Fine-tuning an imported multilingual model (M2M-100's tokens on both sides, mBART-50's network) on Multi30k
en -> fr, then exporting it back: the prepared pairs carry the model's own language tokens on the sides it
reads them, validation decodes with the target's token given, the output bias M2M-100 lacks stays out, and the
exported folder decodes exactly as tformer does, judged by transformers' generate."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers")
import tformer  # noqa: E402
from helpers.corpora import small_multi30k  # noqa: E402
from helpers.hf_m2m100_models import make_folder as make_m2m100  # noqa: E402
from helpers.hf_nllb_mbart_models import CODES, TEXTS, check_outputs, hf_pair  # noqa: E402
from helpers.hf_nllb_mbart_models import make_folder as make_other  # noqa: E402
from tformer.errors import DataError  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("family", ["m2m100", "mbart50"])
def test_a_fine_tuned_multilingual_import_exports_back_and_decodes_alike(tmp_path, shared_data, family):
    import ctranslate2

    from tformer.export import export, export_ctranslate2, translate_ctranslate2

    folder = (make_m2m100(tmp_path / "m2m") if family == "m2m100" else
              make_other(tmp_path / "mbart", "mbart50"))
    codes = {"en": "en", "fr": "fr"} if family == "m2m100" else CODES["mbart50"]
    data = small_multi30k(shared_data, tmp_path / "corpus", 300, 12, names=codes)
    run = tmp_path / "run"
    tformer.train("finetune", run, overrides=[
        f"train.init_from={folder}", f"data.dir={data}", f"data.pairs=[{codes['en']}-{codes['fr']}]",
        "data.valid_prefix=val", "data.test_prefix=val", "train.max_steps=6", "train.eval_every=3",
        "train.save_every=3", "train.warmup=2", "train.lr=0.003", "train.max_tokens=400", "train.max_hours=0",
        "train.ema=0", "data.workers=1"])
    start, tuned = tformer.load(folder, device="cpu"), tformer.load(run, device="cpu")
    tags = tuned.language_tags(codes["fr"], codes["en"])
    assert tuned.config.data.tag_sides == "both"
    examples = tuned.load_split("valid").examples["valid"]
    assert all(s[0] == tags.source and t[0] == tags.target for s, t in examples)  # the model's own tokens
    evaluation = tuned.evaluate("valid", beam=1)  # decoded with the target's token given, as a request is
    assert evaluation.outputs == [x.text for x in tuned.translate(evaluation.sources, source=codes["en"],
                                                                  target=codes["fr"], beam=1)]
    logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert any(f"bleu_{codes['en']}-{codes['fr']}" in row for row in logged)
    ours, before = tuned.model.state_dict(), start.model.state_dict()
    assert not torch.equal(ours["src_embed.tokens.weight"], before["src_embed.tokens.weight"])  # it learned
    assert torch.equal(ours["generator.bias"], before["generator.bias"])  # model.output_bias false: held
    fmt = "hf-m2m100" if family == "m2m100" else "hf-mbart"
    hf, tok = hf_pair(export(fmt, run, tmp_path / "hf"))
    check_outputs(tuned, hf, tok, codes["en"], codes["fr"], TEXTS["en"])
    ct2 = export_ctranslate2(run, tmp_path / "ct2")  # its decoder starts from </s>'s row too (model.start_row)
    ours = tuned.translate(TEXTS["en"], source=codes["en"], target=codes["fr"], beam=1, max_len_a=0.0, max_len_b=20)
    assert translate_ctranslate2(ct2, tuned, TEXTS["en"], beam=1, max_len=20, source=codes["en"],
                                 target=codes["fr"]) == [x.text for x in ours]
    tags = tuned.language_tags(codes["fr"], codes["en"])
    src = [tuned.pieces([tags.source, *tuned.encode(x)], "source") for x in TEXTS["en"]]
    tgt = [tuned.pieces([tags.target, *tuned.encode(y)]) for y in TEXTS["fr"]]
    theirs = [sum(r.log_probs) for r in ctranslate2.Translator(str(ct2)).score_batch(src, tgt)]
    scored = tuned.score(TEXTS["en"], TEXTS["fr"], source=codes["en"], target=codes["fr"])
    assert max(abs(a - b.log_prob) for a, b in zip(theirs, scored)) < 1e-3  # the language's token and </s> too


def test_tags_on_both_sides_need_a_tokenizer_that_leaves_them_out_of_the_text(tmp_path, shared_data):
    data = small_multi30k(shared_data, tmp_path / "corpus", 200, 12, names={"en": "en", "fr": "fr"})
    with pytest.raises(DataError, match="tags on both sides are for models imported with them"):
        tformer.train("multi30k_multi", tmp_path / "run", overrides=[
            f"data.dir={data}", "data.pairs=[en-fr]", "data.tag_sides=both", "data.valid_prefix=val",
            "data.test_prefix=val", "data.vocab_size=200", "train.max_steps=1", "data.workers=1"])
