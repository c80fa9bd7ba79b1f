"""The models one server holds, and which of them answers a direction.

    Models({"en-de": translator, "multi": other}, settings)   each model with its own Batcher (model thread), so
                                                              one model's batch never waits for another's
    models.route(source, target) -> Route      the model for a direction (a multilingual model is asked for its
                                               target), or two legs through the pivot language (Settings.pivot)
    models.languages()                         every language with the targets it reaches (LibreTranslate's list)
    models.default                             the first model: scoring, the explorer and requests that name no
                                               language go to it

A direction goes to the first model, in the order given, that was trained on it (a one-pair model's
src_lang -> tgt_lang, a multilingual model's data.pairs). A pair no model covers is a 400 naming the pairs
there are; with a pivot language (off by default), a pair covered through it runs as two legs, and the answer
says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Mapping

from tformer.api import Translator
from tformer.errors import ConfigError
from tformer.serve.batcher import Batcher
from tformer.serve.requests import RequestError, Settings

if TYPE_CHECKING:
    from tformer.serve.plans import TranslateRequest


@dataclass(frozen=True, eq=False)
class Model:
    name: str
    translator: Translator
    batcher: Batcher

    @property
    def pairs(self) -> tuple[tuple[str, str], ...]:
        languages = self.translator.languages
        data = self.translator.config.data
        return languages.pairs if languages is not None else ((data.src_lang, data.tgt_lang),)

    @property
    def multilingual(self) -> bool:
        return self.translator.languages is not None


@dataclass(frozen=True)
class Leg:
    model: Model
    source: str
    target: str

    @property
    def options(self) -> dict[str, str]:
        """What Translator.prepare is told: a multilingual model the languages (a one-pair model knows them)."""
        return {"source": self.source, "target": self.target} if self.model.multilingual else {}


@dataclass(frozen=True)
class Route:
    legs: tuple[Leg, ...]  # one; or two, through the pivot language

    @property
    def pivot(self) -> str | None:
        return self.legs[0].target if len(self.legs) > 1 else None


@dataclass(frozen=True)
class Routed:
    """A translation request on its route: the first leg's request, and how a later leg's is made from the texts
    the leg before it wrote."""

    route: Route
    first: "TranslateRequest"
    next_leg: Callable[[Leg, list[str]], "TranslateRequest"]


class Models:
    def __init__(self, translators: Mapping[str, Translator], settings: Settings) -> None:
        if not translators:
            raise ConfigError("a server needs at least one model")
        for name, t in translators.items():
            if t.reads_frames:
                raise ConfigError(f"model {name!r} ({t.path}) reads feature frames (model.source=features); the "
                                  "server translates text. Use `tformer transcribe` for frame models")
        self.settings = settings
        self.models = [Model(name, t, Batcher(settings.max_wait_ms / 1000, settings.batch_tokens, settings.max_queue))
                       for name, t in translators.items()]
        self.pivot = settings.pivot

    @property
    def default(self) -> Model:
        return self.models[0]

    def __iter__(self):
        return iter(self.models)

    def pairs(self) -> list[tuple[str, str]]:
        """Every direction a model here was trained on, each once, in the models' order."""
        return list(dict.fromkeys(p for m in self.models for p in m.pairs))

    def codes(self) -> tuple[str, ...]:
        """Every language a model here reads or writes."""
        return tuple(dict.fromkeys(lang for p in self.pairs() for lang in p))

    def direct(self, source: str, target: str) -> Model | None:
        return next((m for m in self.models if (source, target) in m.pairs), None)

    def route(self, source: str | None, target: str | None) -> Route:
        """The model(s) for `source` -> `target`. Neither given: the only model, when it translates one pair."""
        if source is None and target is None:
            only = self.default
            if len(self.models) == 1 and not only.multilingual:
                return Route((Leg(only, *only.pairs[0]),))
            raise RequestError(f"this server translates {self.listed()}: give source and target")
        for name, value in (("source", source), ("target", target)):
            if not isinstance(value, str):
                raise RequestError(f"{name}: {'missing' if value is None else 'must be a language code'}; this "
                                   f"server translates {self.listed()}")
        model = self.direct(source, target)
        if model is not None:
            return Route((Leg(model, source, target),))
        pivot = self.pivot
        if pivot and pivot not in (source, target):
            first, second = self.direct(source, pivot), self.direct(pivot, target)
            if first is not None and second is not None:
                return Route((Leg(first, source, pivot), Leg(second, pivot, target)))
        for name, value in (("source", source), ("target", target)):
            if value not in self.codes():
                raise RequestError(f"{name}: {value!r} is not a language here; this server translates {self.listed()} "
                                   "(GET /languages)")
        hint = ""
        if pivot:
            hint = f", nor through {pivot}"
        elif any(self.direct(source, p) and self.direct(p, target) for p in self.codes() if p not in (source, target)):
            hint = " (--pivot LANG lets a server go through another language)"
        raise RequestError(f"target: no model here translates {source} -> {target}{hint}; this server translates "
                           f"{self.listed()} (GET /languages)")

    def reachable(self, source: str) -> list[str]:
        """The targets `source` reaches: directly, or through the pivot language."""
        out = [t for s, t in self.pairs() if s == source]
        if self.pivot and source != self.pivot:
            out += [t for s, t in self.pairs() if s == self.pivot and t != source and (source, self.pivot) in
                    self.pairs()]
        return list(dict.fromkeys(out))

    def listed(self) -> str:
        return ", ".join(f"{s} -> {t}" for s, t in self.pairs())
