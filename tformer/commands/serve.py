"""tformer serve: a batching HTTP translation service (own JSON API, LibreTranslate's API, the explorer page)."""

from __future__ import annotations

import argparse
import logging
import os

from tformer.commands import common

log = logging.getLogger("tformer")


def add_parser(sub) -> None:
    sp = sub.add_parser("serve", help="an HTTP translation service that batches requests from many clients",
                        description="Serve a checkpoint (or several, each for its languages) over HTTP: POST "
                        "/v1/translate and /v1/score (JSON), LibreTranslate's POST /translate, /detect and GET "
                        "/languages, GET /v1/health and /v1/info, the interactive API page at /docs, and the "
                        "explorer page at /. Sentences from concurrent requests with the same decoding settings "
                        "are decoded together by their model's thread; answers never depend on it. Binds 127.0.0.1 "
                        "(this machine only) by default. SIGTERM or Ctrl-C: stop accepting, answer what was "
                        "accepted, exit.")
    sp.add_argument("--checkpoint", help=common.CHECKPOINT_HELP)
    sp.add_argument("--model", action="append", metavar="NAME=PATH", help="serve several models instead of one "
                    "--checkpoint: each request goes to the first model (in this order) trained on its source and "
                    "target (a multilingual model: any of its data.pairs); every model is loaded before serving")
    sp.add_argument("--pivot", metavar="LANG", help="translate a pair no model covers through this language (two "
                    "models, or two directions of one), saying so in the answer (default: no pivot, a 400)")
    common.listen(sp)
    sp.add_argument("--api-key", default=os.environ.get("TFORMER_API_KEY") or None,
                    help="a key every request must carry ('Authorization: Bearer KEY', 'X-API-Key: KEY' or "
                    "LibreTranslate's api_key); default $TFORMER_API_KEY, else none. The variable keeps it out of "
                    "the process list")
    g = sp.add_argument_group("batching")
    g.add_argument("--max-wait-ms", type=float, default=5.0, help="how long the model waits for more requests to "
                   "fill a batch (default 5; 0: decode what is queued at once)")
    g.add_argument("--batch-tokens", type=int, default=4096, help="padded source tokens (sentences x longest) per "
                   "model call, also decode.batch_tokens (default 4096)")
    g.add_argument("--warm-up", type=int, default=64, metavar="SENTENCES", help="before answering, decode made-up "
                   "batches of 1, 2, 4, .. up to this many sentences, so no request pays what the model does once per "
                   "shape (default 64; 0: none)")
    common.number_format(g)
    g = sp.add_argument_group("limits (each refused with a status naming it)")
    g.add_argument("--max-sentences", type=int, default=64, help="sentences per request (default 64)")
    g.add_argument("--max-chars", type=int, default=1000, help="characters per sentence or prefix (default 1000)")
    g.add_argument("--max-tokens", type=int, default=256, help="pieces per sentence or prefix (default 256)")
    g.add_argument("--max-beam", type=int, default=16, help="largest beam a request may ask for (default 16)")
    g.add_argument("--max-nbest", type=int, default=8, help="most hypotheses a request may ask for (default 8)")
    g.add_argument("--max-body", type=int, default=1 << 20, help="bytes per request body; more: 413 before it is "
                   "read (default 1 MiB)")
    g.add_argument("--max-queue", type=int, default=512, help="sentences waiting for the model; more: 503 with "
                   "Retry-After (default 512)")
    g.add_argument("--timeout", type=float, default=60.0, help="seconds a request may wait for its answer (a request "
                   "may ask for less: its 'timeout' field): then 504, and its work leaves the model, queued or "
                   "decoding (default 60)")
    g.add_argument("--max-connections", type=int, default=256, help="open connections; a request past them: 503 "
                   "with Retry-After (default 256)")
    g.add_argument("--header-timeout", type=float, default=10.0, help="seconds a client has to send a request line "
                   "and headers, from connecting or its last answer: then 408 and the connection is closed, so slow "
                   "clients cannot hold connections (default 10)")
    g.add_argument("--body-timeout", type=float, default=30.0, help="seconds a client has to send a request body once "
                   "its headers are in: then 408 (default 30)")
    sp.add_argument("--glossary", metavar="[LANG=]FILE", action="append", help="a TSV file, 'source term<TAB>target "
                    "term' per line: a term found in a sentence (whole words, any case) must appear in its "
                    "translation, on every route (lexically constrained beam search: serve with "
                    "decode.strategy=beam); LANG=FILE: for the translations into LANG only (one per target "
                    "language; repeat the flag)")
    common.overrides(sp, common.INFERENCE_OVERRIDES)
    sp.set_defaults(func=run)


def settings(args: argparse.Namespace):
    """The Settings the flags ask for (checked: a ConfigError names the flag)."""
    from tformer.serve import Settings

    return Settings(max_sentences=args.max_sentences, max_chars=args.max_chars, max_tokens=args.max_tokens,
                    max_beam=args.max_beam, max_nbest=args.max_nbest, max_body=args.max_body,
                    max_queue=args.max_queue, timeout=args.timeout, max_wait_ms=args.max_wait_ms,
                    batch_tokens=args.batch_tokens, max_connections=args.max_connections,
                    header_timeout=args.header_timeout, body_timeout=args.body_timeout, api_key=args.api_key,
                    warm_up=args.warm_up, pivot=args.pivot, **_glossaries(args.glossary or []))


def run(args: argparse.Namespace) -> int:
    from tformer.serve import Server

    from tformer.errors import ConfigError

    chosen = settings(args)
    translators = _models(args)
    for name, translator in translators.items():
        if (chosen.glossary is not None or chosen.glossaries) and translator.config.decode.strategy != "beam":
            raise ConfigError(f"--glossary: its terms are held by beam search, and {name} ({translator.path}) decodes "
                              f"with {translator.config.decode.strategy!r}; add decode.strategy=beam (decode.beam_size=N)")
    if args.print_config:
        for translator in translators.values():
            common.print_config(translator.config)
        return 0
    server = Server(translators, args.host, args.port, chosen)
    models = server.service.models.models
    what = models[0].translator.path if len(models) == 1 else f"{len(models)} models"
    print(f"tformer serve: serving {what} at {server.url}  (Ctrl-C or SIGTERM stops)", flush=True)
    for model in models if len(models) > 1 else ():
        pairs = ", ".join(f"{a} -> {b}" for a, b in model.pairs)
        print(f"tformer serve:   {model.name}: {model.translator.path} ({pairs})", flush=True)
    warmed = server.warm_up()  # requests that come meanwhile wait in the socket's backlog, /v1/health too
    if warmed:
        print(f"tformer serve: warmed up with batches of {', '.join(map(str, warmed))} sentences in "
              f"{sum(warmed.values()):.1f} s (--warm-up); answering", flush=True)
    server.run()
    print("tformer serve: stopped", flush=True)
    return 0


def _models(args: argparse.Namespace) -> dict:
    """--checkpoint, or each --model NAME=PATH, loaded now: a model that cannot be is named before serving."""
    from tformer.api import load
    from tformer.errors import ConfigError, TformerError

    if bool(args.checkpoint) == bool(args.model):
        raise ConfigError("give --checkpoint PATH (one model) or --model NAME=PATH (each of several), not "
                          + ("both" if args.checkpoint else "neither"))
    if args.checkpoint:
        return {"model": common.load_translator(args)}
    out = {}
    for spec in args.model:
        name, eq, path = spec.partition("=")
        if not eq or not name.strip() or not path.strip():
            raise ConfigError(f"--model {spec!r}: give NAME=PATH, such as en-de=runs/en_de")
        if name in out:
            raise ConfigError(f"--model {name}: given twice; name each model once")
        try:
            out[name] = load(path, overrides=common.decode_overrides(args))
        except TformerError as e:
            raise type(e)(f"--model {name}={path}: {e}") from None
    return out


def _glossaries(given: list[str]) -> dict:
    """--glossary FILE (every translation) and LANG=FILE (the translations into LANG) as Settings fields."""
    from tformer.documents import Glossary
    from tformer.errors import ConfigError
    from tformer.languages import LANGUAGE

    out: dict = {"glossary": None, "glossaries": {}}
    for spec in given:
        lang, eq, path = spec.partition("=")
        if eq and LANGUAGE.match(lang):
            if lang in out["glossaries"]:
                raise ConfigError(f"--glossary {lang}=: given twice; one glossary per target language")
            out["glossaries"][lang] = Glossary.read(path)
        elif out["glossary"] is not None:
            raise ConfigError("--glossary FILE: given twice; one glossary for every language (LANG=FILE for one)")
        else:
            out["glossary"] = Glossary.read(spec)
    return out
