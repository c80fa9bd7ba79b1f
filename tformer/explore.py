"""`tformer explore`: a local web page to translate sentences and look inside the model.

    Explorer(translator or checkpoint)   a tformer.api.Translator and the limits
      .check(request) -> Query           the request's fields checked (RequestError naming the field)
      .answer(query) -> dict             the model's answer: runs the model (tformer serve runs it on its worker)
      .translate(request) -> dict        both, in the calling thread

The page is served by tformer.serve (the same service as `tformer serve`, on 127.0.0.1 unless told
otherwise), which adds these routes beside its own (errors are {"error": message} with status 400, 401, 403,
404, 413, 415, 503, 504 or 500):

    GET  /                 the page (tformer/web/explorer.html: one file, no network resources)
    GET  /api/info         model shape (kinds, layers, heads), decoding defaults (the checkpoint's decode section:
                           its beam size if it says beam, else greedy: beam 1) and where they come from, input
                           limits, examples
    POST /api/translate    {"text": str, "beam": int, "nbest": int, "target": str (optional: force a translation)}
                           -> {"source": {...}, "hypotheses": [{"text", "score", "pieces", "labels",
                               "attention": {kind: [layer][head][query][key]}, "steps"}],
                               "decode": {"beam", "nbest", "forced", "strategy", "from"}, "seconds": ...}

Each translation runs alone on the server's one model thread (attention maps make it much heavier than a
plain translation); at most `Limits.max_queue` sentences wait for the model (more get 503 with
Retry-After). Bound to loopback, the server answers only requests addressed to a loopback name (no DNS
rebinding), and /api/translate takes only application/json posts (a cross-site form cannot post to it without
the browser asking first, and it never says yes).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from tformer.api import Translator, load
from tformer.errors import ConfigError, TformerError
from tformer.inspection import KINDS
from tformer.plan import Plan
from tformer.serve.requests import RequestError, Settings

log = logging.getLogger("tformer")
PAGE = Path(__file__).resolve().parent / "web" / "explorer.html"
MAX_BODY = 64 * 1024  # bytes of one request
FIELDS = {"text", "beam", "nbest", "target"}
__all__ = ["Explorer", "Limits", "PAGE", "Query", "RequestError", "server_settings"]


@dataclasses.dataclass(frozen=True)
class Limits:
    max_chars: int = 1000  # characters of input text
    max_tokens: int = 200  # source pieces after tokenisation
    max_beam: int = 16
    max_nbest: int = 8
    max_queue: int = 8  # translations waiting for (or in) the model; more are answered 503 at once

    @classmethod
    def of(cls, settings: Settings) -> "Limits":
        """The explorer's limits on a server with these settings (tformer serve's page)."""
        return cls(settings.max_chars, settings.max_tokens, settings.max_beam, settings.max_nbest, settings.max_queue)


def server_settings(limits: Limits, max_connections: int = 64) -> Settings:
    """The tformer.serve settings `tformer explore` runs its server with: the explorer's limits, 64 KiB bodies."""
    return Settings(max_sentences=min(64, limits.max_queue), max_chars=limits.max_chars, max_tokens=limits.max_tokens,
                    max_beam=limits.max_beam, max_nbest=limits.max_nbest, max_body=MAX_BODY,
                    max_queue=limits.max_queue, max_connections=max_connections)


@dataclasses.dataclass(frozen=True)
class Query:
    """An explorer request, checked."""

    text: str
    beam: int
    nbest: int
    target: str | None  # a translation to force (score), or None: the model's n-best list
    pieces: list[str]  # the source pieces
    chosen: str = "request"  # where beam and nbest come from: 'request' or 'defaults' (the checkpoint's)
    plan: Plan | None = None  # the sentence made ready to translate (None: a forced target, scored)


class Explorer:
    """A Translator (tformer.api) made ready to answer explorer requests; given a path, it loads one."""

    def __init__(self, translator: Translator | str | Path, limits: Limits = Limits(), overrides: list[str] = (),
                 which: str = "best") -> None:
        if not isinstance(translator, Translator):
            translator = load(translator, which=which, overrides=list(overrides), device="cpu")
        if translator.reads_frames:
            raise ConfigError(f"{translator.path} reads feature frames (model.source=features); the explorer "
                              "translates typed text. Use `tformer transcribe` for frame models")
        self.translator = translator
        self.limits = limits
        self.name = str(translator.path)
        self.examples = self._examples()
        self.language = page_languages(translator)
        overridden = any(o.startswith("decode.") for o in overrides)
        self.defaults, self.decoding = defaults(translator.config.decode, limits, overridden)

    def _examples(self) -> list[str]:
        """A few validation sources to try (when the data is at hand), else none."""
        try:
            return [s for s in self.translator.load_split("valid").texts["valid"][0] if len(s) <= 120][:5]
        except Exception as e:  # the page works without examples; say why there are none
            log.info("explorer: no example sentences (%s)", e)
            return []

    def info(self) -> dict[str, Any]:
        cfg = self.translator.config
        m = cfg.model
        universal = m.kind == "universal"
        layers = ({"encoder": m.max_steps, "decoder": m.max_steps, "cross": m.max_steps} if universal else
                  {"encoder": m.encoder_layers, "decoder": m.decoder_layers, "cross": m.decoder_layers})
        return {"checkpoint": self.name, "step": self.translator.checkpoint.trainer.get("step"),
                "task": cfg.data.task, "languages": ([cfg.data.src_lang, cfg.data.tgt_lang] if not self.language else
                                                     [self.language["source"], self.language["target"]]),
                "model": {"kind": m.kind, "layers": layers, "heads": m.n_heads, "d_model": m.d_model,
                          "layer_name": "step" if universal else "layer", "attention": m.attention,
                          "positions": m.positions, "norm": m.norm},
                "defaults": self.defaults, "decoding": self.decoding,
                "limits": dataclasses.asdict(self.limits), "examples": self.examples}

    def _parse(self, request: Any) -> tuple[str, int, int, str | None]:
        if not isinstance(request, dict):
            raise RequestError("the request must be a JSON object such as {\"text\": \"...\", \"beam\": 5}")
        unknown = set(request) - FIELDS
        if unknown:
            raise RequestError(f"unknown field(s) {', '.join(sorted(unknown))}; the fields are "
                               f"{', '.join(sorted(FIELDS))}")
        text = request.get("text")
        if not isinstance(text, str):
            raise RequestError("'text' must be a string: the sentence to translate")
        if len(text) > self.limits.max_chars:  # as sent, spaces included
            raise RequestError(f"'text' has {len(text)} characters; the limit is {self.limits.max_chars} "
                               "(start the explorer with a larger --max-chars to change it)")
        text = text.strip()
        if not text:
            raise RequestError("'text' is blank: type a sentence to translate")
        beam, nbest = request.get("beam", self.defaults["beam"]), request.get("nbest", self.defaults["nbest"])
        chosen = "request" if "beam" in request or "nbest" in request else "defaults"
        for name, value, top in (("beam", beam, self.limits.max_beam), ("nbest", nbest, self.limits.max_nbest)):
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top:
                raise RequestError(f"'{name}' must be a whole number from 1 to {top}, got {value!r}")
        if nbest > beam:
            raise RequestError(f"nbest ({nbest}) cannot exceed the beam size ({beam}): a beam of {beam} keeps "
                               f"{beam} hypotheses")
        target = request.get("target")
        if target is not None and (not isinstance(target, str) or not target.strip()):
            raise RequestError("'target' must be a non-empty string (a translation to force), or left out")
        if target is not None and len(target) > self.limits.max_chars:
            raise RequestError(f"'target' (the forced translation) has {len(target)} characters; the limit is "
                               f"{self.limits.max_chars}")
        return text, beam, nbest, target, chosen

    def _run(self, query: Query) -> list[dict[str, Any]]:
        """The hypotheses with their attention: the model's n-best list, or the forced target scored."""
        if query.plan is None:
            forced = self.translator.score([query.text], [query.target], return_attention=True, **self.language)[0]
            hyps = [(query.target, forced.log_prob, forced.tokens[:-1], forced.attention)]
        else:
            out = self.translator.run([query.plan])[0][0]
            hyps = [(h.text, h.score, h.tokens, h.attention) for h in out.hypotheses]
        return [{"text": hyp_text, "score": round(score, 4), "pieces": pieces,
                 "labels": {k: dict(zip(("queries", "keys"), maps.labels(k))) for k in KINDS},
                 "attention": {k: _rounded(maps.weights[k]) for k in KINDS},
                 "steps": None if maps.steps is None else {"source": maps.steps[0], "target": maps.steps[1]}}
                for hyp_text, score, pieces, maps in hyps]

    def check(self, request: Any) -> Query:
        """An /api/translate request's fields and the source's length, checked (no model work)."""
        text, beam, nbest, target, chosen = self._parse(request)
        plan = None
        if target is None:  # checked and tokenised once, here; the model thread only decodes it
            try:
                plan = self.translator.prepare([text], beam=beam, nbest=nbest, return_attention=True, **self.language)
            except TformerError as e:
                raise RequestError(f"'text': {e}") from None
            ids = plan.sources[0] or ()
        else:
            ids = self.translator.encode(text)
        pieces = self.translator.pieces(ids, "source")
        if not pieces:
            raise RequestError(f"'text' is {text!r}: nothing the model reads (control characters or spaces); type a "
                               "sentence to translate")
        if len(pieces) > self.limits.max_tokens:
            raise RequestError(f"'text' is {len(pieces)} pieces long; the limit is {self.limits.max_tokens} "
                               "(--max-tokens)")
        return Query(text, beam, nbest, target, pieces, chosen, plan)

    def answer(self, query: Query, queued_seconds: float = 0.0) -> dict[str, Any]:
        """The answer to a checked request (runs the model in this thread)."""
        tic = time.perf_counter()
        hypotheses = self._run(query)
        return {"source": {"text": query.text, "pieces": query.pieces}, "hypotheses": hypotheses,
                "decode": {"beam": query.beam, "nbest": query.nbest, "forced": query.target is not None,
                           "strategy": "beam" if query.beam > 1 else "greedy",
                           "from": self.decoding if query.chosen == "defaults" else "the request"},
                "seconds": round(time.perf_counter() - tic, 4), "queued_seconds": round(queued_seconds, 4)}

    def translate(self, request: Any) -> dict[str, Any]:
        """Answer one /api/translate request (see the module docstring) in this thread."""
        return self.answer(self.check(request))


def defaults(decode, limits: Limits, overridden: bool = False) -> tuple[dict[str, int], str]:
    """The page's beam and nbest when a request gives none: what the checkpoint's decode section says (its
    beam_size if its strategy is beam, else greedy: beam 1), within the limits; and where they come from
    (`overridden`: decode.* overrides were given when loading)."""
    if decode.strategy == "beam":
        beam = min(decode.beam_size, limits.max_beam)
        nbest = min(max(decode.nbest, 3), beam, limits.max_nbest)
        said = f"beam {decode.beam_size}" + (f" (at most {beam} here: --max-beam)" if beam < decode.beam_size else "")
    else:
        beam = nbest = 1
        said = "greedy" if decode.strategy == "greedy" else f"{decode.strategy} (the explorer decodes greedily)"
    where = "the checkpoint's decode section" + (" with the overrides given" if overridden else "")
    return {"beam": beam, "nbest": nbest}, f"{where}: {said}"


def _rounded(w: np.ndarray) -> list:
    """(layers, H, Lq, Lk) floats -> nested lists, 4 decimals, NaN (halted positions) as null."""
    values = np.round(w.astype(np.float64), 4)
    if not np.isnan(values).any():
        return values.tolist()
    return np.where(np.isnan(values), None, values).tolist()


def page_languages(translator) -> dict[str, str]:
    """The languages the page asks a multilingual model for: its config's src_lang and tgt_lang where it knows them,
    else its first source and a target other than it ({}: a one-pair model)."""
    languages, data = translator.languages, translator.config.data
    if languages is None:
        return {}
    source = data.src_lang if data.src_lang in languages.sources else languages.sources[0]
    target = next(t for t in (data.tgt_lang, *languages.targets) if t in languages.targets and t != source)
    return {"source": source, "target": target}
