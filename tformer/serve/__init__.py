"""`tformer serve`: a translation service over HTTP that batches sentences from many clients into one model
call, with LibreTranslate's API beside its own and the explorer page on the same port.

    from tformer.serve import Settings, create_app, serve
    serve(tformer.load("runs/m30k"), "127.0.0.1", 8000, Settings(max_wait_ms=5, batch_tokens=4096))
    serve({"en-de": t1, "multi": t2}, settings=Settings(pivot="en"))  # several models (tformer.serve.models)
    app = create_app(translator, settings)     # the ASGI app (Starlette), for any ASGI server or a test client

Routes (JSON in, JSON out; errors are {"error": message} with a 4xx naming the field, 503 busy with
Retry-After, 504 past the timeout):

    POST /v1/translate  {"src": [str, ...], "prefix": [str | null, ...], "alignment": bool, "constraints":
                         [[str, ...] | null, ...], "beam": int, "nbest": int, ...}  (all but src optional: the
                         checkpoint's decode section decides; "source" and "target" choose the model, which a
                         server of one one-pair model does not need). The decoding fields are DecodeConfig's
                         per-call fields and the phrase fields decode.PHRASE_INPUTS (tformer.serve.plans)
                        -> {"translations": [{"text", "score", "hypotheses": [{"text", "score"}, ...] (nbest > 1),
                            "alignment": [[source piece, target piece], ...], "tokens", "source_tokens"
                            (alignment)}, ...]  one per src, in order; "decoding": the per-call fields it used}
    POST /v1/score      {"src": [str, ...], "tgt": [str, ...]}
                        -> {"scores": [{"log_prob", "tokens" (target pieces, then </s>), "token_log_probs"}, ...]}
    GET  /v1/health     {"status": "ok", "pending_sentences", "uptime_seconds"}   (no API key needed)
    GET  /v1/info       model kind and shape, vocabularies, languages, decoding defaults, limits, batching
    POST /translate     LibreTranslate (tformer/serve/libretranslate.py): JSON or a form
    GET  /languages     LibreTranslate's language list (no API key needed)
    POST /detect        LibreTranslate's language detection, among the server's languages (source "auto" on
                        /translate detects too, and answers detectedLanguage)
    GET  /frontend/settings  what LibreTranslate's web client reads (no API key needed)
    GET  /              the explorer page; GET /api/info and POST /api/translate as tformer.explore describes
    GET  /openapi.json  the OpenAPI 3.1 description of all of these, with this server's limits (no API key needed)
    GET  /docs          that description as an interactive page (Swagger UI from its package: no CDN)

Every translating route makes its request into a plan (Translator.prepare: checked and tokenised once;
tformer.serve.plans), and the model thread (tformer.serve.batcher) runs plans with equal keys (plan.key: the
whole decoding) that arrive within `max_wait_ms` of each other in one Translator.run call, up to
`batch_tokens` padded source tokens (plan.widths); scoring goes through Translator.score. An answer never
depends on its company.
Limits (Settings): sentences per request, characters and pieces per sentence or prefix, beam and n-best,
body bytes (413 before reading), queued sentences (503), seconds per request (504), open connections.
A client that disconnects has its queued work dropped. SIGTERM or Ctrl-C stops accepting connections,
answers every request already accepted, and exits.

Security: binds 127.0.0.1 unless told otherwise, and then answers only requests addressed to a loopback name
(no DNS rebinding). With an API key (Settings.api_key: --api-key or TFORMER_API_KEY) every route but
/v1/health and /languages needs it, as 'Authorization: Bearer KEY', 'X-API-Key: KEY' or LibreTranslate's
api_key field (401 without it, 403 with a wrong one). /v1/* and /api/* take only application/json posts, which
a cross-site form cannot send.
"""

from tformer.serve.app import create_app
from tformer.serve.server import Server, serve
from tformer.serve.batcher import Batcher, Job
from tformer.serve.requests import RequestError, Settings

__all__ = ["Batcher", "Job", "RequestError", "Server", "Settings", "create_app", "serve"]
