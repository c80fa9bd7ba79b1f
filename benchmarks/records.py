"""Benchmark results as records: one JSON file per run, under benchmarks/records/<topic>/.

A record says what ran (benchmark, mode, the exact command, commit), when (UTC), where (the CPU's model name, its
kind, the flags that decide which kernels run, threads, torch) and what it measured (figures: name, value, unit,
which direction is better, optionally a ratio to a peer, the spread over rounds and a target met or missed).
`python -m benchmarks render` turns the records into the topic pages of docs/results/; `python -m benchmarks run`
writes one with --record. Mode "archive" marks a figure transcribed from benchmarks/RESULTS.md: its `source` names
the RESULTS.md heading (and anchor) it came from, and what the archive did not state (commit, threads) is null.

Comparison rule (`compare`): a figure moved when its relative change exceeds the noise band, the larger of 5% and
the relative spread recorded with either run (`spread`: (max - min) / median over the rounds of one run).
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
RECORDS = HERE / "records"
TOPICS = ("quality", "decoding", "training", "serving", "reliability", "interop")
MODES = ("quick", "full", "archive")
FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8")
NOISE = 0.05  # the least relative change that counts as a move


class RecordError(ValueError):
    """A record file (or a record about to be saved) that does not follow the format; the message names the file
    and the field."""


# ---------------------------------------------------------------------------------------------------- the format

@dataclass(frozen=True)
class Target:
    op: str           # ">=" or "<="
    value: float
    met: bool
    text: str = ""    # the target as the archive words it, when a number alone would lose something


@dataclass(frozen=True)
class Figure:
    name: str
    value: float
    unit: str                     # "x", "BLEU", "s", "min", "%", "tokens/s", ...
    higher_is_better: bool
    peer: str | None = None       # what `value` is a ratio to, when it is one (e.g. "CTranslate2 4.8.5 fp32")
    spread: float | None = None   # relative spread over the run's rounds, (max - min) / median
    target: Target | None = None


@dataclass(frozen=True)
class Cpu:
    model: str                    # /proc/cpuinfo's model name
    kind: str                     # "AMD Zen 4", "Intel Sapphire Rapids", ...: what records are compared within
    flags: tuple[str, ...] = ()   # those of FLAGS the CPU has


@dataclass(frozen=True)
class Record:
    benchmark: str
    topic: str
    mode: str
    command: str
    commit: str | None            # short sha; null only in archive records that did not state it
    date: str                     # UTC, "YYYY-MM-DDTHH:MMZ" (archive records may give the day alone)
    cpu: Cpu
    threads: int | None
    torch: str | None
    figures: tuple[Figure, ...]
    source: str | None = None     # archive records: the RESULTS.md heading and anchor the figures came from
    notes: str = ""


# ------------------------------------------------------------------------------------------------- validation

_FIELDS = {"benchmark": str, "topic": str, "mode": str, "command": str, "commit": (str, type(None)), "date": str,
           "cpu": dict, "threads": (int, type(None)), "torch": (str, type(None)), "figures": list,
           "source": (str, type(None)), "notes": str}
_OPTIONAL = {"source": None, "notes": ""}
_NAME = re.compile(r"^[a-z0-9][a-z0-9-]*$")
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}(T\d{2}:\d{2}Z)?$")


def _need(cond: bool, where: str, key: str, what: str) -> None:
    if not cond:
        raise RecordError(f"{where}: field '{key}': {what}")


def _typed(obj: dict, key: str, types, where: str, optional: dict | None = None):
    if key not in obj:
        _need(optional is not None and key in optional, where, key, "missing")
        return optional[key]
    value = obj[key]
    ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in _as_tuple(types))
    _need(ok, where, key, f"expected {' or '.join(t.__name__ for t in _as_tuple(types))}, got {value!r}")
    return value


def _as_tuple(types) -> tuple:
    return types if isinstance(types, tuple) else (types,)


def _figure(obj, where: str, i: int) -> Figure:
    key = f"figures[{i}]"
    _need(isinstance(obj, dict), where, key, "expected an object")
    unknown = set(obj) - {"name", "value", "unit", "higher_is_better", "peer", "spread", "target"}
    _need(not unknown, where, f"{key}.{sorted(unknown)[0] if unknown else ''}", "unknown field")
    sub = f"{where}: {key}"
    name = _typed(obj, "name", str, sub)
    value = float(_typed(obj, "value", (int, float), sub))
    unit = _typed(obj, "unit", str, sub)
    higher = _typed(obj, "higher_is_better", bool, sub)
    peer = _typed(obj, "peer", (str, type(None)), sub, {"peer": None})
    spread = _typed(obj, "spread", (int, float, type(None)), sub, {"spread": None})
    target = None
    if obj.get("target") is not None:
        t = _typed(obj, "target", dict, sub)
        op = _typed(t, "op", str, f"{sub}.target")
        _need(op in (">=", "<="), f"{sub}.target", "op", f"expected '>=' or '<=', got {op!r}")
        tv = float(_typed(t, "value", (int, float), f"{sub}.target"))
        met = _typed(t, "met", bool, f"{sub}.target")
        _need(met == (value >= tv if op == ">=" else value <= tv), f"{sub}.target", "met",
              f"says {met} but {value} {op} {tv} is {not met}")
        target = Target(op, tv, met, _typed(t, "text", str, f"{sub}.target", {"text": ""}))
    return Figure(name, value, unit, higher, peer, None if spread is None else float(spread), target)


def from_dict(obj, where: str = "record") -> Record:
    """A Record from its JSON form, or RecordError naming `where` (the file) and the field at fault."""
    _need(isinstance(obj, dict), where, "(top level)", "expected a JSON object")
    unknown = set(obj) - set(_FIELDS)
    _need(not unknown, where, sorted(unknown)[0] if unknown else "", "unknown field")
    v = {k: _typed(obj, k, t, where, _OPTIONAL) for k, t in _FIELDS.items()}
    _need(bool(_NAME.match(v["benchmark"])), where, "benchmark", f"lowercase letters, digits and '-': {v['benchmark']!r}")
    _need(v["topic"] in TOPICS, where, "topic", f"one of {', '.join(TOPICS)}; got {v['topic']!r}")
    _need(v["mode"] in MODES, where, "mode", f"one of {', '.join(MODES)}; got {v['mode']!r}")
    _need(bool(_DATE.match(v["date"])), where, "date", f"YYYY-MM-DD or YYYY-MM-DDTHH:MMZ (UTC); got {v['date']!r}")
    _need(v["mode"] == "archive" or v["commit"] is not None, where, "commit", "null is for archive records only")
    _need(v["mode"] != "archive" or bool(v["source"]), where, "source", "an archive record names its RESULTS.md heading")
    _need(bool(v["figures"]), where, "figures", "a record holds at least one figure")
    cpu = v["cpu"]
    model = _typed(cpu, "model", str, f"{where}: cpu")
    kind = _typed(cpu, "kind", str, f"{where}: cpu")
    _need(bool(kind.strip()), where, "cpu.kind", "empty")
    flags = _typed(cpu, "flags", list, f"{where}: cpu", {"flags": []})
    figures = tuple(_figure(f, where, i) for i, f in enumerate(v["figures"]))
    names = [f.name for f in figures]
    dup = sorted({n for n in names if names.count(n) > 1})
    _need(not dup, where, "figures", f"figure names repeat: {dup}")
    return Record(v["benchmark"], v["topic"], v["mode"], v["command"], v["commit"], v["date"],
                  Cpu(model, kind, tuple(flags)), v["threads"], v["torch"], figures, v["source"], v["notes"])


def to_dict(record: Record) -> dict:
    out = dataclasses.asdict(record)
    out["cpu"]["flags"] = list(record.cpu.flags)
    out["figures"] = list(out["figures"])
    for f in out["figures"]:
        for k in ("peer", "spread", "target"):
            if f[k] is None:
                del f[k]
        if f.get("target") and not f["target"]["text"]:
            del f["target"]["text"]
    if out["source"] is None:
        del out["source"]
    if not out["notes"]:
        del out["notes"]
    return out


# ------------------------------------------------------------------------------------------------- load, save

def load(path: Path) -> Record:
    try:
        obj = json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise RecordError(f"{path}: not JSON (line {e.lineno}: {e.msg})") from None
    record = from_dict(obj, str(path))
    _need(Path(path).parent.name == record.topic, str(path), "topic",
          f"{record.topic!r}, but the file lies in {Path(path).parent.name}/")
    return record


def load_all(root: Path = RECORDS) -> list[Record]:
    """Every record under `root`, oldest first (date, then file name)."""
    paths = sorted(Path(root).glob("*/*.json"))
    return sorted((load(p) for p in paths), key=lambda r: r.date)


def file_name(record: Record) -> str:
    """`<benchmark>.<date>.<cpu kind>.<mode>.<8 hex of the content>.json`: two records never share a name."""
    stamp = record.date.replace("-", "").replace(":", "")
    kind = re.sub(r"[^a-z0-9]+", "-", record.cpu.kind.lower()).strip("-")
    digest = hashlib.sha256(json.dumps(to_dict(record), sort_keys=True).encode()).hexdigest()[:8]
    return f"{record.benchmark}.{stamp}.{kind}.{record.mode}.{digest}.json"


def save(record: Record, root: Path = RECORDS) -> Path:
    from_dict(to_dict(record), f"record of {record.benchmark}")  # what is written must read back
    path = Path(root) / record.topic / file_name(record)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        raise RecordError(f"{path}: exists already (the same record saved twice?)")
    path.write_text(json.dumps(to_dict(record), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


# --------------------------------------------------------------------------------------------------- this run

_AMD = {  # family 25 (0x19) / 26 (0x1a): model ranges
    25: [(range(0x00, 0x10), "AMD Zen 3"), (range(0x20, 0x30), "AMD Zen 3"), (range(0x40, 0x60), "AMD Zen 3"),
         (range(0x10, 0x20), "AMD Zen 4"), (range(0x60, 0x80), "AMD Zen 4"), (range(0xA0, 0xB0), "AMD Zen 4")],
    23: [(range(0x00, 0x30), "AMD Zen 1/Zen+"), (range(0x30, 0x100), "AMD Zen 2")],
    26: [(range(0x00, 0x100), "AMD Zen 5")],
}
_INTEL = {85: "Intel Skylake/Cascade Lake", 106: "Intel Ice Lake", 108: "Intel Ice Lake",
          143: "Intel Sapphire Rapids", 207: "Intel Emerald Rapids", 173: "Intel Granite Rapids",
          174: "Intel Granite Rapids"}


def cpu_kind(vendor: str, family: int, model: int, flags: set[str]) -> str:
    """A CPU's kind from /proc/cpuinfo's vendor, family and model; unknown models fall back to what the flags
    say (records are only compared within one kind, so a coarse kind is safe, a wrong one is not)."""
    if vendor == "AuthenticAMD":
        for models, kind in _AMD.get(family, []):
            if model in models:
                return kind
    if vendor == "GenuineIntel" and family == 6 and model in _INTEL:
        return _INTEL[model]
    isa = "AMX" if "amx_tile" in flags else "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "x86"
    name = {"AuthenticAMD": "AMD", "GenuineIntel": "Intel"}.get(vendor, vendor or "unknown")
    return f"{name} family {family} model {model} ({isa})"


def this_cpu(cpuinfo: str | None = None) -> Cpu:
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        if not line.strip():
            break  # the first processor is enough
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    flags = set(fields.get("flags", "").split())
    kind = cpu_kind(fields.get("vendor_id", ""), int(fields.get("cpu family", 0) or 0),
                    int(fields.get("model", 0) or 0), flags)
    return Cpu(fields.get("model name", "unknown CPU"), kind, tuple(f for f in FLAGS if f in flags))


def this_commit() -> str:
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=HERE,
                               capture_output=True, text=True, check=True).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ")


def new_record(benchmark: str, topic: str, mode: str, command: str, figures: list[Figure], threads: int,
               notes: str = "") -> Record:
    import torch  # only a run needs it
    return Record(benchmark, topic, mode, command, this_commit(), now(), this_cpu(), threads, torch.__version__,
                  tuple(figures), None, notes)


# ---------------------------------------------------------------------------------------------------- compare

@dataclass(frozen=True)
class Move:
    figure: str
    before: float
    after: float
    change: float     # relative, (after - before) / |before|
    band: float       # the noise band it was held against
    better: bool


@dataclass(frozen=True)
class Comparison:
    last: Record | None
    moved: list[Move] = field(default_factory=list)
    steady: list[str] = field(default_factory=list)    # figures within the band
    unmatched: list[str] = field(default_factory=list)  # figures the last record did not have


def last_like(new: Record, history: list[Record]) -> Record | None:
    """The latest record of the same benchmark, mode and CPU kind as `new` (not `new` itself)."""
    same = [r for r in history if r is not new and r.benchmark == new.benchmark and r.mode == new.mode
            and r.cpu.kind == new.cpu.kind and r.date <= new.date]
    return max(same, key=lambda r: r.date, default=None)


def compare(new: Record, history: list[Record]) -> Comparison:
    """Each figure of `new` against the last record like it (`last_like`): moved when |relative change| exceeds
    max(5%, either run's recorded spread)."""
    last = last_like(new, history)
    if last is None:
        return Comparison(None, unmatched=[f.name for f in new.figures])
    before = {f.name: f for f in last.figures}
    out = Comparison(last)
    for f in new.figures:
        b = before.get(f.name)
        if b is None or b.unit != f.unit:
            out.unmatched.append(f.name)
            continue
        band = max(NOISE, f.spread or 0.0, b.spread or 0.0)
        change = (f.value - b.value) / abs(b.value) if b.value else (0.0 if f.value == b.value else float("inf"))
        if abs(change) > band:
            out.moved.append(Move(f.name, b.value, f.value, change, band, (change > 0) == f.higher_is_better))
        else:
            out.steady.append(f.name)
    return out


def describe(comparison: Comparison) -> str:
    c = comparison
    if c.last is None:
        return "no earlier record of this benchmark, mode and CPU kind: nothing to compare with"
    lines = [f"against {c.last.date} ({c.last.commit}, {c.last.cpu.kind}):"]
    for m in c.moved:
        lines.append(f"  moved {'better' if m.better else 'worse'}: {m.figure} {m.before:g} -> {m.after:g} "
                     f"({m.change:+.1%}, noise band {m.band:.0%})")
    if c.steady:
        lines.append(f"  within noise: {', '.join(c.steady)}")
    if c.unmatched:
        lines.append(f"  not in the last record: {', '.join(c.unmatched)}")
    return "\n".join(lines)


def root_from_env() -> Path:
    """Where records live: $TFORMER_RECORDS (tests, trial runs) or benchmarks/records."""
    return Path(os.environ.get("TFORMER_RECORDS", RECORDS))
