"""Reading and checking config data for the frozen dataclasses of tformer.config: each value against its field's
annotation (`coerce`) and bounds (`Bounds`, in the field's metadata), nested sections built from mappings
(`build`), YAML files, dotted overrides (`a.b=c`) and the settings a trained model may still change. Every
refusal is a ConfigError that names the key.

    option(default, help, low=..., high=..., per_call=True)  a field with its help, bounds and whether a call may
                                                           set it (DecodeConfig's fields; see `request_fields`)
    build(cls, mapping, prefix) / updated(section, prefix, values)   typed and checked sections
    read_yaml(path), parse_override(text), merge_overrides(data, overrides), check_inference_overrides(...)
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Mapping

import yaml

from tformer.errors import ConfigError

if typing.TYPE_CHECKING:
    from tformer.config import ModelConfig

_EXPONENT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")

# Settings that may change after training: `translate` and `evaluate` accept overrides for these alone. Where
# the corpus lives may change too (a moved folder), and which list is the test split (a speech corpus's noisy
# copy, another test set); a prepared corpus is checked against the checkpoint's tokenizer.
INFERENCE_KEYS = ("decode.", "model.attention", "data.dir", "data.prepared", "data.test_prefix")


def check(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise ConfigError(f"config key '{key}': {message}")


# --------------------------------------------------------------------------- fields that describe themselves


@dataclass(frozen=True)
class Bounds:
    """The values a number may take: low <= value <= high (`open_low`: low < value); None: no bound."""

    low: float | None = None
    high: float | None = None
    open_low: bool = False

    def holds(self, value: float) -> bool:
        if self.low is not None and (value <= self.low if self.open_low else value < self.low):
            return False
        return self.high is None or value <= self.high

    def __str__(self) -> str:
        low = None if self.low is None else f"{'>' if self.open_low else '>='} {_number(self.low)}"
        if self.high is None:
            return low or "any number"
        if low is None:
            return f"<= {_number(self.high)}"
        if self.open_low:
            return f"in ({_number(self.low)}, {_number(self.high)}]"
        return f"{'> 0, ' if self.low > 0 else ''}from {_number(self.low)} to {_number(self.high)}"

    def schema(self) -> dict[str, float]:
        """The bounds as JSON Schema keywords (minimum / exclusiveMinimum, maximum)."""
        out: dict[str, float] = {}
        if self.low is not None:
            out["exclusiveMinimum" if self.open_low else "minimum"] = self.low
        if self.high is not None:
            out["maximum"] = self.high
        return out


def _number(x: float) -> str:
    return str(x) if isinstance(x, int) else f"{x:g}"


def option(default: Any, help: str, *, low: float | None = None, high: float | None = None, open_low: bool = False,
           per_call: bool = False) -> Any:
    """A dataclass field whose metadata says what it means (`help`, one line), the values it may take (`bounds`,
    which the section's __post_init__ checks: `check_bounds`) and whether one call may set it (`per_call`: a
    translate keyword and a /v1/translate field; the others are chosen when a model is loaded or trained)."""
    return field(default=default, metadata={"help": help, "bounds": Bounds(low, high, open_low), "per_call": per_call})


def check_bounds(section: Any, prefix: str) -> None:
    """Each field of `section` within the bounds its metadata gives (a ConfigError naming `prefix.name`)."""
    for f in dataclasses.fields(section):
        bounds = f.metadata.get("bounds")
        value = getattr(section, f.name)
        if bounds is not None and isinstance(value, (int, float)):
            ok = not isinstance(value, float) or math.isfinite(value)
            check(ok and bounds.holds(value), f"{prefix}.{f.name}", f"must be {bounds}, got {value}")


def request_fields(cls: type) -> dict[str, dataclasses.Field]:
    """The fields of a config section that one call may set (option(..., per_call=True)), by name."""
    return {f.name: f for f in dataclasses.fields(cls) if f.metadata.get("per_call")}


# --------------------------------------------------------------------------- values, mappings, files


def coerce(value: Any, tp: Any, key: str) -> Any:
    """Check `value` against the annotation `tp`; return it converted (int -> float, list -> tuple)."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        choices = typing.get_args(tp)
        check(value in choices, key, f"must be one of {', '.join(map(repr, choices))}; got {value!r}")
        return value
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        return coerce(value, next(a for a in args if a is not type(None)), key)
    if origin is tuple:
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:  # tuple[X, ...]: a list of any length
            check(isinstance(value, (list, tuple)), key, f"must be a list, got {value!r}")
            return tuple(coerce(v, args[0], f"{key}[{i}]") for i, v in enumerate(value))
        check(isinstance(value, (list, tuple)) and len(value) == len(args), key,
               f"must be a list of {len(args)} values, got {value!r}")
        return tuple(coerce(v, a, f"{key}[{i}]") for i, (v, a) in enumerate(zip(value, args)))
    if tp is bool:
        check(isinstance(value, bool), key, f"must be true or false, got {value!r}")
        return value
    if tp is int:
        check(isinstance(value, int) and not isinstance(value, bool), key, f"must be an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, str) and _EXPONENT.fullmatch(value.strip()):
            value = float(value)  # YAML 1.1 reads 1e-4 (no dot) as a string; it is meant as a number
        check(isinstance(value, (int, float)) and not isinstance(value, bool), key,
               f"must be a number, got {value!r}")
        return float(value)
    if tp is str:
        check(isinstance(value, str), key, f"must be a string, got {value!r}")
        return value
    raise TypeError(f"unsupported annotation {tp!r} for {key}")  # an invariant of this module


def unknown_key(prefix: str, key: Any, names: list[str]) -> ConfigError:
    close = difflib.get_close_matches(str(key), names, n=1)
    hint = f"; did you mean '{prefix}{close[0]}'?" if close else f"; known keys: {', '.join(names)}"
    return ConfigError(f"config key '{prefix}{key}' is unknown{hint}")


def build(cls: type, data: Mapping[str, Any], prefix: str) -> Any:
    if not isinstance(data, Mapping):
        raise ConfigError(f"config key '{prefix.rstrip('.') or '<top>'}': must be a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in data.items():
        if key not in names:
            raise unknown_key(prefix, key, names)
        tp = hints[key]
        if dataclasses.is_dataclass(tp):
            kwargs[key] = build(tp, value, f"{prefix}{key}.")
        else:
            kwargs[key] = coerce(value, tp, f"{prefix}{key}")
    return cls(**kwargs)


def to_dict(cfg: Any) -> dict[str, Any]:
    """A plain nested dict (tuples become lists) that YAML writes and `from_dict` reads back."""

    def plain(v: Any) -> Any:
        if isinstance(v, tuple):
            return [plain(x) for x in v]
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        return v

    return plain(dataclasses.asdict(cfg))


def parse_override(text: str) -> tuple[list[str], Any]:
    """`model.d_model=512` -> (['model', 'd_model'], 512); the value is read as YAML."""
    if "=" not in text:
        raise ConfigError(f"override '{text}' is not of the form section.key=value (e.g. model.d_model=512)")
    key, raw = text.split("=", 1)
    path = key.strip().split(".")
    if len(path) < 2 or not all(path):
        raise ConfigError(f"override '{text}': the key must be section.key, e.g. train.lr=2.0")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as e:
        raise ConfigError(f"override '{text}': the value is not valid YAML ({e})") from None
    return path, value


def merge_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    out = {k: dict(v) if isinstance(v, Mapping) else v for k, v in (data or {}).items()}
    for text in overrides:
        path, value = parse_override(text)
        node = out
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override '{text}': '{part}' is not a section")
        node[path[-1]] = value
    return out


def read_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"config file {path} is not UTF-8 text (byte {e.start})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {path} is not valid YAML: {e}") from None
    if data is not None and not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of sections, got {type(data).__name__}")
    return data or {}


def check_inference_overrides(overrides: list[str]) -> None:
    """Only decoding and kernel settings may change on a trained model."""
    for text in overrides:
        key = ".".join(parse_override(text)[0])
        if not any(key == k or (k.endswith(".") and key.startswith(k)) for k in INFERENCE_KEYS):
            raise ConfigError(
                f"config key '{key}' cannot change after training; only decode.*, model.attention, data.dir, "
                "data.prepared and data.test_prefix can"
            )


def save_config(cfg: Any, path: str | Path) -> None:
    """Write `cfg` as YAML under a temporary name, then rename it into place (never half a file)."""
    from tformer.files import replace_atomically

    with replace_atomically(path) as f:
        f.write(cfg.to_yaml())


def updated(section: Any, prefix: str, values: Mapping[str, Any]) -> Any:
    """The frozen config `section` with `values` in place of its fields, each key and type checked as a YAML
    file's would be and the section validated again; errors name `prefix.key` (e.g. 'decode.beam_size')."""
    names = [f.name for f in dataclasses.fields(section)]
    hints = typing.get_type_hints(type(section))
    changes = {}
    for key, value in values.items():
        if key not in names:
            raise unknown_key(f"{prefix}.", key, names)
        changes[key] = coerce(value, hints[key], f"{prefix}.{key}")
    return dataclasses.replace(section, **changes)


def export_problems(cfg: ModelConfig) -> list[str]:
    """The settings of `cfg` that an exported Transformer cannot express (empty: none), each as `model.key=value`
    or in words: what `check_exportable`, and the compiled decoding step (tformer.model.compiled), refuse."""
    problems = []
    if cfg.kind != "vanilla":
        problems.append(f"model.kind={cfg.kind} (ACT halting has no CTranslate2 counterpart)")
    if cfg.source != "tokens":
        problems.append("model.source=features (a frame encoder)")
    for key, value, default in (("norm_layer", cfg.norm_layer, "layernorm"), ("ffn", cfg.ffn, "standard"),
                                ("qk_norm", cfg.qk_norm, False),
                                ("kv_heads", 0 if cfg.kv_heads == cfg.n_heads else cfg.kv_heads, 0)):
        if value != default:
            problems.append(f"model.{key}={value}")
    for side in ("encoder", "decoder"):
        if cfg.side_positions(side) not in ("sinusoidal", "learned"):
            problems.append(f"{side} positions {cfg.side_positions(side)} (an attention bias)")
    if not (cfg.encoder_structure.window == cfg.decoder_structure.window == 0
            and not cfg.encoder_structure.edges and not cfg.decoder_structure.edges
            and cfg.encoder_structure.dilation == cfg.decoder_structure.dilation == 1
            and cfg.encoder_structure.global_tokens == cfg.decoder_structure.global_tokens == 0):
        problems.append("a sparse attention structure")
    return problems
