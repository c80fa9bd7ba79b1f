"""Decoding precision (tformer.precision) and the matrix library chosen at load (tformer.model.matmul).

bf16's promise, tested here against fp32 as the oracle: every model kind decodes; a token's log-probability is
within BF16_ABS + BF16_REL * |value| of fp32's for the same tokens; a sentence's result does not depend on the
batch it is decoded in (as in fp32: alone == in a batch of sixteen). The matrix library's choice is an exact
rule on measured times (tested with given times), and either library gives fp32's products to rounding."""

import dataclasses
import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import tformer
import tformer.precision as policy
from tformer.config import DecodeConfig, ModelConfig
from tformer.errors import ConfigError
from tformer.inference import score_ids, translate_ids
from tformer.model import build_model, matmul
from tformer.precision import for_inference

from helpers.models import TEST_DEVICE, on_device

pytestmark = pytest.mark.device

ROOT = Path(__file__).resolve().parents[1]
V1 = ROOT / "tests" / "fixtures" / "checkpoint_v1" / "checkpoint"
LINES = (ROOT / "tests" / "fixtures" / "checkpoint_v1" / "input.en").read_text(encoding="utf-8").splitlines()
BF16_ABS, BF16_REL = 0.06, 0.02  # bf16 keeps 8 significant bits: a logit of 10 is off by up to 0.04

BASE = dict(d_model=32, n_heads=4, d_ff=64, encoder_layers=2, decoder_layers=2, dropout=0.0, attention_dropout=0.0,
            ffn_dropout=0.0)
KINDS = {
    "post-norm": {}, "pre-norm": dict(norm="pre"), "learned": dict(positions="learned"),
    "tupe": dict(positions="tupe", untie_first=True), "tupe-r": dict(positions="tupe-r"),
    "relative": dict(positions="relative"), "alibi": dict(positions="alibi"),
    "rotary": dict(positions="rotary", rotary_layout="halves"),
    "glu-rmsnorm-qk-norm": dict(ffn="glu", norm_layer="rmsnorm", qk_norm=True, activation="silu"),
    "grouped-query": dict(kv_heads=2), "universal": dict(kind="universal", max_steps=4),
    "dense": dict(attention="dense"), "graph": dict(attention="graph"),
    "speech-stack": dict(source="features", feature_dim=12, frame_stack=2, frame_skip=2),
    "speech-conv": dict(source="features", feature_dim=12, frontend="conv", conv_channels=8, cmvn=True, ctc=True),
    "marian": dict(sinusoid="marian", activation="silu", norm="post"),
}
SOURCES = [[5, 6, 7, 8], [9, 10, 11], [12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22], [23]]

# No test here skips for missing units: on a CPU without bf16 units (or with PyTorch's dispatch capped to AVX2),
# tests/conftest.py turns on tformer.precision.EMULATION_SWITCH and bf16 is emulated. A GPU without bf16 units
# (before Ampere) is the one place bf16 is not run.
needs_bf16 = pytest.mark.skipif(TEST_DEVICE.type == "cuda" and policy.unsupported("bf16", TEST_DEVICE) is not None,
                                reason=f"{TEST_DEVICE} has no bf16 units")


def _pair(kind: str) -> tuple:
    """An fp32 model of `kind`, the same weights loaded for bf16 decoding, and sources for them."""
    torch.manual_seed(0)
    cfg = ModelConfig(**{**BASE, **KINDS[kind]})
    fp32 = on_device(build_model(cfg, 30, 30).eval())
    bf16 = on_device(build_model(cfg, 30, 30).eval())
    bf16.load_state_dict(fp32.state_dict())
    for_inference(bf16, "bf16", "none")
    g = torch.Generator().manual_seed(1)
    sources = ([torch.randn(3 * len(s), 12, generator=g).to(TEST_DEVICE) for s in SOURCES] if cfg.source == "features"
               else SOURCES)
    return fp32, bf16, sources


def _close(got: list[float], want: list[float]) -> None:
    for g, w in zip(got, want, strict=True):
        assert abs(g - w) <= BF16_ABS + BF16_REL * abs(w), (got, want)


@needs_bf16
@pytest.mark.parametrize("kind", list(KINDS))
def test_bf16_decodes_every_model_kind_with_fp32s_log_probabilities_to_its_tolerance(kind):
    """Weights held in bf16 (every float parameter), log-probabilities in fp32. Oracle: the fp32 model's
    teacher-forced log-probabilities of the tokens bf16 chose, and of fixed targets; both searches run."""
    fp32, bf16, sources = _pair(kind)
    assert {p.dtype for p in bf16.parameters() if p.is_floating_point()} == {torch.bfloat16}
    targets = [[5, 6], [7], [8, 9, 10, 11], []]
    got, want = score_ids(bf16, sources, targets), score_ids(fp32, sources, targets)
    for g, w in zip(got, want):
        _close(g, w)
    limit = 8  # a hypothesis shorter than this ended with </s>, and its score counts it
    greedy = translate_ids(bf16, sources, DecodeConfig(max_len_a=0.0, max_len_b=limit))
    beam = translate_ids(bf16, sources, DecodeConfig(strategy="beam", beam_size=3, nbest=2, max_len_a=0.0,
                                                    max_len_b=limit, len_penalty=0.0))
    assert all(len(h) == 2 and s[0] >= s[1] for h, s in zip(beam.tokens, beam.scores))
    for found in (greedy, beam):
        best = [h[0] for h in found.tokens]
        for tokens, score, logp in zip(best, found.scores, score_ids(fp32, sources, best)):
            _close([score[0]], [sum(logp[: len(tokens) + (len(tokens) < limit)])])


@needs_bf16
def test_a_bf16_models_sinusoid_table_grows_in_bf16():
    """Past the table's first 1,024 positions it grows (sinusoids have no limit), still in the model's format:
    a float32 table would turn the embeddings float32, which the bf16 layers refuse."""
    fp32, bf16, _ = _pair("post-norm")
    long = [list(range(4, 30)) * 50]  # 1,300 tokens
    for g, w in zip(score_ids(bf16, long, [[5, 6, 7]]), score_ids(fp32, long, [[5, 6, 7]])):
        _close(g, w)
    assert bf16.src_embed.positions.table.dtype == torch.bfloat16


@needs_bf16
@pytest.mark.parametrize("attention", ["sdpa", "graph"])
@pytest.mark.parametrize("strategy", ["greedy", "beam"])
def test_bf16_results_do_not_depend_on_the_batch(strategy, attention):
    """Each sentence decoded alone equals the batch of sixteen (tokens, scores to 1e-4), as in fp32, though
    the batch runs the matrix products on other row counts, pads the keys wider, and (sdpa) may choose another
    kernel by the batch's shape. tests/test_capped_isa.py runs it on AVX2 kernels too."""
    torch.manual_seed(0)
    cfg = ModelConfig(**{**BASE, "d_model": 64, "d_ff": 128, "attention": attention})
    model = for_inference(on_device(build_model(cfg, 300, 300).eval()), "bf16", "none")
    g = torch.Generator().manual_seed(1)
    sources = [torch.randint(4, 300, (int(n),), generator=g).tolist() for n in torch.randint(2, 15, (16,), generator=g)]
    decode = DecodeConfig(strategy=strategy, beam_size=4, max_len_b=12, batch_size=16)
    batch = translate_ids(model, sources, decode)
    for i, s in enumerate(sources):
        alone = translate_ids(model, [s], decode)
        assert alone.tokens[0] == batch.tokens[i]
        assert alone.scores[0][0] == pytest.approx(batch.scores[i][0], abs=1e-4)


@needs_bf16
def test_bf16_through_the_api_translate_nbest_prefix_alignment_score_attention_and_an_ensemble():
    """tformer.load(..., precision="bf16"): every call works and stays within bf16's tolerance of fp32."""
    fp32 = tformer.load(V1, device=TEST_DEVICE)
    bf16 = tformer.load(V1, device=TEST_DEVICE, precision="bf16")
    assert bf16.config.decode.precision == "bf16" and next(bf16.model.parameters()).dtype == torch.bfloat16
    lines = LINES[:6]
    out = bf16.translate(lines, beam=4, nbest=2, alignment=True, return_attention=True)
    want = fp32.translate(lines, beam=4, nbest=2)
    assert sum(a.text == b.text for a, b in zip(out, want)) >= 5  # a near tie may flip; most agree
    assert all(len(t.hypotheses) == 2 and t.alignment is not None and t.attention is not None for t in out)
    forced = bf16.translate(lines[:2], prefix=["Ein", None])
    assert forced[0].text.startswith("Ein")
    refs = [t.text for t in want]
    for g, w in zip(bf16.score(lines, refs), fp32.score(lines, refs)):
        _close(g.token_log_probs, w.token_log_probs)
    ensemble = tformer.load([V1, V1], device=TEST_DEVICE, precision="bf16")
    assert [t.text for t in ensemble.translate(lines)] == [t.text for t in bf16.translate(lines)]


@needs_bf16
@pytest.mark.skipif(TEST_DEVICE.type != "cuda", reason="a GPU's attention backends (TFORMER_TEST_DEVICE=cuda)")
@pytest.mark.parametrize("strategy", ["greedy", "beam"])
def test_bf16_decoding_on_a_gpu_never_plans_cudnn_attention_per_shape(strategy):
    """Each step's new shape made SDPA's cuDNN backend build a graph (bf16 beam search 8-12x slower than fp32 on an
    H100). Oracle: torch.profiler's record of the ops a bf16 search runs, with the attention kernels' outputs
    equal to the dense kernel's to bf16's tolerance (they are what runs instead)."""
    from torch.profiler import ProfilerActivity, profile

    torch.manual_seed(0)
    cfg = ModelConfig(**{**BASE, "d_model": 64, "d_ff": 128})
    model = for_inference(on_device(build_model(cfg, 300, 300).eval()), "bf16", "none")
    decode = DecodeConfig(strategy=strategy, beam_size=4, max_len_b=12, batch_size=16)
    sources = [list(range(4, 4 + n)) for n in range(3, 19)]
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        found = translate_ids(model, sources, decode)
    ops = {e.key for e in prof.key_averages()}
    assert any("scaled_dot_product" in op for op in ops) and not any("cudnn_attention" in op for op in ops), ops
    assert all(len(h[0]) > 0 for h in found.tokens)
    dense = for_inference(on_device(build_model(dataclasses.replace(cfg, attention="dense"), 300, 300).eval()),
                          "bf16", "none")
    dense.load_state_dict(model.state_dict())
    for g, w in zip(score_ids(model, sources, [h[0] for h in found.tokens]),
                    score_ids(dense, sources, [h[0] for h in found.tokens])):
        _close(g, w)


def test_bf16_with_int8_and_bf16_without_units_are_config_errors_naming_the_key(monkeypatch):
    with pytest.raises(ConfigError, match="config key 'decode.precision': bf16 with decode.quantize=int8"):
        DecodeConfig(precision="bf16", quantize="int8")
    with pytest.raises(ConfigError, match="config key 'decode.precision'"):
        tformer.load(V1, device="cpu", precision="bf16", quantize="int8")
    monkeypatch.delenv(policy.EMULATION_SWITCH)  # as users run: no emulation
    monkeypatch.setattr(policy, "cpu_flags", lambda: {"avx2", "fma", "avx512f"})  # an AVX2/AVX-512F-only CPU
    with pytest.raises(ConfigError, match=r"'decode.precision': bf16 on cpu: this CPU has no avx512_bf16 or "
                                          r"amx_bf16.*decode.precision=fp32"):
        tformer.load(V1, device="cpu", precision="bf16")
    with pytest.raises(ConfigError, match="avx512_fp16 or amx_fp16"):
        tformer.load(V1, device="cpu", overrides=["decode.precision=fp16"])
    assert tformer.load(V1, device="cpu").config.decode.precision == "fp32"  # fp32 needs nothing
    monkeypatch.setattr(policy, "cpu_flags", lambda: {"avx2", "avx512f", "avx512_bf16"})  # the units, with
    monkeypatch.setattr(policy, "dispatch_cap", lambda p: "PyTorch runs its AVX2 kernels here")  # kernels capped
    with pytest.raises(ConfigError, match=r"'decode.precision': bf16 on cpu: PyTorch runs its AVX2 kernels here"):
        tformer.load(V1, device="cpu", precision="bf16")
    monkeypatch.setenv(policy.EMULATION_SWITCH, "1")  # the tests' switch: emulated, allowed
    assert next(tformer.load(V1, device="cpu", precision="bf16").model.parameters()).dtype == torch.bfloat16
    monkeypatch.setattr(policy, "cpu_flags", lambda: None)  # flags unreadable: no claim, no refusal
    assert policy.unsupported("bf16", torch.device("cpu")) is None


def test_precision_is_chosen_when_loading_not_per_call():
    translator = tformer.load(V1, device="cpu")
    with pytest.raises(ConfigError, match="decode.precision.*tformer.load"):
        translator.translate(LINES[:1], precision="bf16")
    assert translator.translate(LINES[:1], precision="fp32")[0].text == translator.translate(LINES[:1])[0].text


def test_the_command_line_flag_is_the_config_key():
    import argparse

    from tformer.commands import common

    sp = argparse.ArgumentParser()
    common.batching(sp)
    args = sp.parse_args(["--precision", "bf16", "--batch-size", "8"])
    assert "decode.precision=bf16" in common.decode_overrides(args)


@pytest.mark.parametrize("library", ["prepacked", "rows"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_each_library_computes_f_linear_and_keeps_the_parameters(dtype, library):
    if not matmul.available():
        pytest.skip("no oneDNN prepacked linear in this build")
    torch.manual_seed(0)
    linear = torch.nn.Linear(50, 200).to(dtype)
    product = matmul.Product(linear.weight.detach(), linear.bias.detach(), (library,) * len(matmul.ROWS))
    try:
        matmul.LIBRARIES[library].ready(linear.weight.detach())
        assert product.choice == (library,) * len(matmul.ROWS)
    except RuntimeError:  # no kernel for this format here (bf16 under ONEDNN_MAX_CPU_ISA=AVX2; bf16 in the rows
        assert product.choice == matmul.PLAIN  # kernel): the products below are F.linear's
    # every library runs here (the rows kernel built), but oneDNN may refuse to pack bf16
    assert library in product.choice or (library, dtype) == ("prepacked", torch.bfloat16)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    with torch.inference_mode():
        # 12 rows: the rows kernel's 8 then 4; 50 inputs: its 3 x 16 lanes, then 2
        for shape in ((1, 50), (7, 50), (3, 5, 50), (12, 50), (300, 50), (2, 0, 50)):
            x = torch.randn(shape).to(dtype)
            torch.testing.assert_close(product(x), F.linear(x, linear.weight, linear.bias), **tol)
        x = torch.randn(50, 6).to(dtype).T  # rows that are not contiguous
        torch.testing.assert_close(product(x), F.linear(x, linear.weight, linear.bias), **tol)
    x = torch.randn(3, 50, dtype=dtype, requires_grad=True)  # with gradients on: the plain product, which has one
    product(x).sum().backward()
    assert x.grad is not None and x.grad.shape == x.shape
    # a model keeps its state dict and its tied generator
    model = build_model(ModelConfig(**BASE), 30, 30).eval()
    keys = list(model.state_dict())
    matmul.prepack(model)
    assert list(model.state_dict()) == keys
    assert model.generator.weight is model.tgt_embed.tokens.weight
    assert isinstance(model.generator, matmul.MeasuredLinear)
    from tformer.attention import MultiHeadAttention

    attentions = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    assert attentions and all(set(m.prepacked) == {"q", "kv"} for m in attentions)  # their parts as well
    x = torch.randn(2, 32, requires_grad=True)
    model.generator(x).sum().backward()
    assert x.grad is not None


def test_a_format_onednn_cannot_pack_here_is_never_prepacked(monkeypatch):
    """oneDNN refuses to pack bf16 on a CPU without AVX-512 or AVX-NE-CONVERT (an AVX2 EPYC): the measured choice
    never names it; without the rows kernel too it is the plain product, and a layer of that format runs as
    F.linear."""
    if not matmul.available():
        pytest.skip("no oneDNN prepacked linear in this build")

    def refuse(weight):
        raise RuntimeError("mkldnn_reorder_linear_weight: bf16 path needs the cpu support avx_ne_convert")

    monkeypatch.setattr(matmul, "_CHOICES", {})
    monkeypatch.setattr(matmul, "_reorder", refuse)
    assert "prepacked" not in matmul.measure(48, 200, torch.bfloat16)
    monkeypatch.setattr(matmul, "_CHOICES", {})
    monkeypatch.setattr(matmul, "rows_kernel", lambda: None)  # and no C compiler here
    assert matmul.measure(48, 200, torch.bfloat16) == matmul.PLAIN
    linear = torch.nn.Linear(48, 200).bfloat16()
    run = matmul.Product.measured(linear.weight, linear.bias)
    with torch.inference_mode():
        x = torch.randn(300, 48).bfloat16()
        assert torch.equal(run(x), F.linear(x, linear.weight, linear.bias)) and run.ready == {}


def test_a_burst_of_load_during_the_timing_does_not_choose_the_slower_library(monkeypatch):
    """The libraries are timed in turn: a burst of the machine's other work (here 4 calls in a row run 10x
    slower, whichever library they are) slows both alike, and the faster one is still chosen. The oracle: a
    clock the calls advance by known amounts. Timed one library after the other (as before), the burst fell
    on the faster library's calls alone and chose the slower."""
    clock = [0.0]
    monkeypatch.setattr(matmul.time, "perf_counter", lambda: clock[0])
    for burst_at in range(12):
        n = [0]

        def call(cost):
            def fn():
                n[0] += 1
                clock[0] += cost * (10 if burst_at <= n[0] < burst_at + 4 else 1)
            return fn

        assert matmul._fastest({"plain": call(2.0), "fast": call(1.0)}) == "fast", burst_at  # fast costs 1, plain 2
        assert matmul._fastest({"plain": call(1.0), "fast": call(2.0)}) == "plain", burst_at
        assert matmul._fastest({"a": call(3.0), "b": call(2.0), "c": call(1.5)}) == "c", burst_at


def test_each_row_count_runs_on_the_library_that_won_nearest_to_it(monkeypatch):
    """The rule, on given times: a product of M rows runs on the library that won at the count timed nearest to M
    (log scale), whatever won at other counts; the rows kernel is timed up to COLD_ROWS rows only; each shape is
    measured once per process. Oracle: the winners a fake timing names, and which library each product calls."""
    if not matmul.available():
        pytest.skip("no oneDNN prepacked linear in this build")
    offered = []

    def fake(winners):
        def fastest(calls, repeats=5):  # asked for each of ROWS in order
            offered.append(set(calls))
            return winners[matmul.ROWS[len(offered) - 1]]
        return fastest

    assert [matmul.nearest(m) for m in (1, 2, 3, 5, 6, 11, 12, 22, 24, 32, 300, 5000)] == [0, 1, 2, 2, 3, 3, 4, 4, 5,
                                                                                             5, 8, 8]
    linear = torch.nn.Linear(8, 12)
    rows_up_to_8 = ("rows",) * 4
    for choice in (rows_up_to_8 + ("prepacked",) * 3 + ("plain",) * 2,  # the three, as on a Zen 4
                   ("plain", "prepacked", "rows", "plain", "prepacked", "plain", "plain", "plain", "prepacked"),
                   matmul.PLAIN, ("prepacked",) * len(matmul.ROWS)):
        offered.clear()
        monkeypatch.setattr(matmul, "_CHOICES", {})
        monkeypatch.setattr(matmul, "_fastest", fake(dict(zip(matmul.ROWS, choice))))
        assert matmul.measure(8, 12, torch.float32) == choice
        assert offered == [set(matmul.LIBRARIES) if r <= matmul.COLD_ROWS else {"plain", "prepacked"}
                           for r in matmul.ROWS]
        assert matmul.measure(8, 12, torch.float32) == choice and len(offered) == len(matmul.ROWS)  # cached
        used = []
        for name in ("prepacked", "rows"):
            monkeypatch.setitem(matmul.LIBRARIES, name, dataclasses.replace(
                matmul.LIBRARIES[name], run=lambda x, w, b, name=name: used.append((name, x.shape[0])) or x[:, :1]))
        run = matmul.Product.measured(linear.weight, linear.bias)
        with torch.inference_mode():
            for m in (1, 3, 12, 24, 40, 200, 600):
                run(torch.randn(m, 8))
        assert used == [(choice[matmul.nearest(m)], m) for m in (1, 3, 12, 24, 40, 200, 600)
                        if choice[matmul.nearest(m)] != "plain"]
        assert set(run.ready) == set(choice) - {"plain"}  # no prepacked copy where prepacked never runs
        monkeypatch.undo()
    monkeypatch.setenv("TFORMER_PREPACK", "0")
    model = build_model(ModelConfig(**BASE), 30, 30).eval()
    assert not any(isinstance(m, matmul.MeasuredLinear) for m in matmul.prepack(model).modules())


def test_few_rows_are_timed_on_weights_read_cold_and_many_rows_on_one_weight(monkeypatch):
    """A decoding step of a few sentences reads each layer's weights from memory: the chooser times each library at
    up to COLD_ROWS rows on copies of the weight filling twice the last-level cache (capped at MAX_COPIES), each
    read once per timed pass, and above it on one weight (the rows' arithmetic decides there). Oracle: the
    weights each timed pass hands the libraries, seen by their entry points."""
    if not matmul.available():
        pytest.skip("no oneDNN prepacked linear in this build")
    cache_bytes = 48 * 200 * 4 * 5  # twice this: 10 copies of a 48 -> 200 fp32 weight
    monkeypatch.setattr(matmul, "_last_cache_bytes", lambda: cache_bytes)
    monkeypatch.setattr(matmul, "_CHOICES", {})
    seen: dict[str, list] = {name: [] for name in matmul.LIBRARIES}
    for name, library in matmul.LIBRARIES.items():  # each library's product, recording which weight each call reads
        monkeypatch.setitem(matmul.LIBRARIES, name, dataclasses.replace(
            library, run=lambda x, w, b, name=name, run=library.run: seen[name].append(id(w)) or run(x, w, b)))
    passes: list[tuple[str, int, int]] = []

    def fastest(calls, repeats=5):
        for name, fn in calls.items():
            seen[name].clear()
            fn()
            passes.append((name, len(seen[name]), len(set(seen[name]))))
        return "plain"

    monkeypatch.setattr(matmul, "_fastest", fastest)
    matmul.measure(48, 200, torch.float32)
    want = [(name, 10, 10) if rows <= matmul.COLD_ROWS else (name, 1, 1) for rows in matmul.ROWS
            for name in matmul.LIBRARIES if rows <= matmul.LIBRARIES[name].most_rows]
    assert passes == want
    passes.clear()
    matmul.measure(48, 200, torch.float32, cold=False)  # a model that fits in the cache: timed warm, as it runs
    assert [p[1:] for p in passes] == [(1, 1)] * len(want)
    passes.clear()
    monkeypatch.setattr(matmul, "_last_cache_bytes", lambda: 1 << 40)  # a huge cache: MAX_COPIES at most
    matmul.measure(48, 201, torch.float32)
    assert passes[0] == ("plain", matmul.MAX_COPIES, matmul.MAX_COPIES)
    # prepack(model) times cold when the model's linear weights (here 2 x 48 x 200 x 4 bytes) exceed the cache
    for cache, cold in ((48 * 200 * 4, True), (1 << 20, False)):
        asked = []
        monkeypatch.setattr(matmul, "_last_cache_bytes", lambda: cache)
        monkeypatch.setattr(matmul, "measure", lambda i, o, d, c=True: asked.append(c) or matmul.PLAIN)
        matmul.prepack(torch.nn.Sequential(torch.nn.Linear(48, 200), torch.nn.Linear(200, 48)).eval())
        assert asked == [cold, cold]


def test_the_rows_kernel_sums_bf16_in_fp32_and_rounds_once_to_the_nearest():
    """In bf16 the rows kernel widens rows, weights and bias exactly, sums in fp32 and rounds each output once to
    the nearest bf16 (NaN stays NaN). Oracle: the same product computed in fp32 by F.linear, then rounded by
    PyTorch: equal but where the order of the sums moves a value across a rounding boundary (one bf16 step)."""
    torch.manual_seed(0)
    for rows, inputs, outputs in ((1, 512, 700), (4, 50, 300), (8, 2048, 64), (11, 24, 50)):
        x, weight, bias = (torch.randn(rows, inputs).bfloat16(), torch.randn(outputs, inputs).bfloat16(),
                           torch.randn(outputs).bfloat16())
        got = matmul._rows_linear(x, matmul._rows_ready(weight), bias)
        want = F.linear(x.float(), weight.float(), bias.float()).bfloat16()
        assert got.dtype == torch.bfloat16 and got.shape == want.shape
        assert (got == want).float().mean() >= 0.99, (rows, inputs, outputs)
        torch.testing.assert_close(got, want, rtol=2 ** -7, atol=0)  # elsewhere one step of 8 bits apart
    x = torch.tensor([[float("nan"), 1.0]]).bfloat16()
    assert matmul._rows_linear(x, torch.ones(3, 2).bfloat16(), None).isnan().all()


def test_the_rows_kernel_is_built_once_per_machine_and_missing_without_a_compiler(monkeypatch, tmp_path, caplog):
    """rows.c is compiled into $TFORMER_CACHE/kernels on first use and loaded from there by later processes (no
    compiler run); with no C compiler the kernel is missing, said in the log, and the chooser times the others.
    Oracle: the files in the cache, and whether the compiler is called."""
    import logging
    import subprocess

    monkeypatch.setenv("TFORMER_CACHE", str(tmp_path))
    build = matmul.rows_kernel.__wrapped__  # the uncached function: each call is a new process
    functions = build()
    assert set(functions) == {torch.float32, torch.bfloat16}
    assert [p.name.startswith("rows-") and p.suffix == ".so" for p in (tmp_path / "kernels").iterdir()] == [True]
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("compiled again"))
    assert set(build()) == {torch.float32, torch.bfloat16}
    monkeypatch.setenv("TFORMER_CACHE", str(tmp_path / "elsewhere"))
    monkeypatch.setenv("CC", "no-such-cc")
    with caplog.at_level(logging.INFO, logger="tformer"):
        assert build() is None
    assert "no C compiler 'no-such-cc'" in caplog.text and "run on oneDNN or MKL" in caplog.text


def _huge_bytes_at(address: int) -> int:
    """The bytes on huge pages in the mapping that holds `address`, as the kernel accounts them (/proc/self/smaps)."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and ":" not in head:
            low, high = (int(x, 16) for x in head.split("-"))
            inside = low <= address < high
        elif inside and head == "AnonHugePages:":
            return int(line.split()[1]) * 1024
    return 0


def test_weights_streamed_from_memory_go_on_huge_pages_with_their_values_unchanged(monkeypatch):
    """huge_pages advises the whole 2 MiB pages inside each tensor and collapses them now; the values stay. Oracle:
    the kernel's own account of the mapping (smaps), on a kernel that has MADV_COLLAPSE (6.1 and later). And
    prepack does it for a model that does not fit in the last-level cache only."""
    import sys

    weight = torch.randn(3 << 20)  # 12 MiB: at least 5 whole huge pages inside
    before = weight.clone()
    done = matmul.huge_pages([weight, torch.randn(10), before.to_mkldnn()])  # too small; no storage: left alone
    assert torch.equal(weight, before)
    major, minor = (int(x) for x in os.uname().release.split(".")[:2]) if sys.platform == "linux" else (0, 0)
    if (major, minor) >= (6, 1):
        assert done >= 5 * matmul.HUGE_PAGE
    first = -(-weight.data_ptr() // matmul.HUGE_PAGE) * matmul.HUGE_PAGE
    assert done == (_huge_bytes_at(first) if done else 0)
    for cache, cold in ((48 * 200 * 4, True), (1 << 20, False)):
        advised = []
        monkeypatch.setattr(matmul, "_last_cache_bytes", lambda: cache)
        monkeypatch.setattr(matmul, "huge_pages", lambda tensors: advised.append(len(tensors)) or 0)
        matmul.prepack(torch.nn.Sequential(torch.nn.Linear(48, 200), torch.nn.Linear(200, 48)).eval())
        assert (2 in advised) == cold and (not advised) == (not cold)


def test_the_last_level_cache_size_is_read_from_the_system():
    """Whatever the CPU: a size between 1 MiB and 4 GiB (or the 32 MiB default where sysfs has none)."""
    assert (1 << 20) <= matmul._last_cache_bytes() <= (4 << 30)


@needs_bf16
@pytest.mark.parametrize("kind", ["post-norm", "grouped-query", "rotary", "universal", "graph"])
def test_a_bf16_step_caches_what_attention_reads_and_computes_the_same_logits(kind):
    """In bf16 on a CPU attention sums in float64 (kernels.sums_in_fp64): the decoder caches the memory's keys and
    values, and its own, in float64 already (the values of bf16 ones: exact), so a step converts only its new
    position. Oracle: the same steps with the cache handed back in bf16, which attention converts at every step,
    as before; the logits are equal, bit for bit. The graph kernel reads its inputs' own format and keeps bf16."""
    _, model, sources = _pair(kind)
    src = torch.tensor([sources[0]], device=TEST_DEVICE)
    with torch.inference_mode():
        enc = model.encode(src, torch.tensor([src.shape[1]], device=TEST_DEVICE))
        cache = model.init_cache(enc)
        want_format = torch.float64 if TEST_DEVICE.type == "cpu" and kind != "graph" else torch.bfloat16
        assert {t.dtype for kv in cache.cross for t in kv} == {want_format}
        as_bf16 = dataclasses.replace(cache, cross=[tuple(t.bfloat16() for t in kv) for kv in cache.cross])
        tokens = torch.tensor([1], device=TEST_DEVICE)
        for _ in range(3):
            got, cache = model.decode_step(tokens, cache)
            want, as_bf16 = model.decode_step(tokens, as_bf16)
            assert torch.equal(got, want)
            as_bf16 = dataclasses.replace(as_bf16, self_kv=[tuple(t.bfloat16() for t in kv) for kv in as_bf16.self_kv],
                                          preallocated=False)
            tokens = got.argmax(-1)
        if kind != "universal":  # (its steps cache keys of their own making)
            assert {k.dtype for k, _ in cache.self_kv} == {want_format}


def test_the_choices_are_saved_and_a_later_process_reads_them_instead_of_timing(monkeypatch, tmp_path):
    """prepack saves the choices it timed (one file per CPU and torch version, under $TFORMER_CACHE); a later
    process (nothing in memory) takes them from the file and times nothing; a damaged file, or an entry not well
    formed, is timed again and saved anew. Oracle: the choices given by a fake timing, and whether it is asked."""
    if not matmul.available():
        pytest.skip("no oneDNN prepacked linear in this build")
    import json

    monkeypatch.setenv("TFORMER_CACHE", str(tmp_path))
    timed = []

    def new_process(fastest):
        monkeypatch.setattr(matmul, "_CHOICES", {})
        monkeypatch.setattr(matmul, "_READ", set())
        monkeypatch.setattr(matmul, "_fastest", fastest)

    def fake(calls, repeats=5):  # prepacked and the rows kernel win in turn, plain where they are not timed
        timed.append(1)
        return ("prepacked", "rows")[len(timed) % 2] if "rows" in calls else "plain"

    def model():
        return matmul.prepack(torch.nn.Sequential(torch.nn.Linear(48, 200), torch.nn.Linear(200, 48)).eval())

    new_process(fake)
    model()
    first = dict(matmul._CHOICES)
    threads = torch.get_num_threads()
    saved = json.loads(matmul.saved_path().read_text(encoding="utf-8"))
    assert matmul.saved_path().parent == tmp_path / "matmul" and len(timed) == 2 * len(matmul.ROWS)
    assert saved == {f"{i},{o},float32,{threads},warm": list(first[(i, o, torch.float32, threads, False)])
                     for i, o in ((48, 200), (200, 48))}
    assert {name for choice in first.values() for name in choice} == set(matmul.LIBRARIES)

    new_process(lambda *a, **k: pytest.fail("timed again, though the choices were saved"))
    again = model()
    assert matmul._CHOICES == first and again[0].run.choice == first[(48, 200, torch.float32, threads, False)]

    old = [True] * len(matmul.ROWS)  # the form saved before the rows kernel: whether prepacked won
    for damage in ("{not json", json.dumps({**saved, f"48,200,float32,{threads},warm": ["rows"]}),
                   json.dumps({**saved, f"48,200,float32,{threads},warm": ["fastest"] * len(matmul.ROWS)}),
                   json.dumps({**saved, f"48,200,float32,{threads},warm": old})):
        matmul.saved_path().write_text(damage, encoding="utf-8")
        timed.clear()
        new_process(fake)
        model()
        assert len(timed) == (2 if damage.startswith("{not") else 1) * len(matmul.ROWS)  # only what was unusable
        assert set(json.loads(matmul.saved_path().read_text(encoding="utf-8"))) == set(saved)


@pytest.mark.parametrize("kind", list(KINDS))
def test_the_warm_up_decodes_every_model_kind_with_each_search(kind, monkeypatch):
    """tformer.inference.warm_up (what `tformer serve` runs before answering) decodes a made-up batch of each size
    for any model kind (speech: frames) and search: the decoder's step sees size x beam rows."""
    from tformer.inference import warm_up

    torch.manual_seed(0)
    model = on_device(build_model(ModelConfig(**{**BASE, **KINDS[kind]}), 30, 30).eval())
    rows = []
    step = model.decode_step
    monkeypatch.setattr(model, "decode_step", lambda tokens, *a, **k: rows.append(tokens.shape[0]) or step(tokens, *a,
                                                                                                             **k))
    for cfg, k in ((DecodeConfig(), 1), (DecodeConfig(strategy="beam", beam_size=3), 3),
                   (DecodeConfig(strategy="sample", seed=1), 1)):
        rows.clear()
        seconds = warm_up(model, cfg, (1, 3))
        assert list(seconds) == [1, 3] and all(s > 0 for s in seconds.values())
        assert {1 * k, 3 * k} <= set(rows) and max(rows) == 3 * k
