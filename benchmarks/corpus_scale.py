"""Corpus scale (issue 21): prepare a corpus once, train from it by mmap. Wall time and peak memory of
`tformer prepare`, then of the first updates of `tformer train data.prepared=...`, on synthetic corpora of
growing size; the loader alone against the model; optionally torchrun and the code before the change.

    python benchmarks/corpus_scale.py [--sizes 200000 1000000 4500000] [--work /tmp/tformer-corpus-scale]
        [--torchrun-sizes N ...] [--before [--before-sizes N ...]] [--keep] [--cleanup] [--record]
    python benchmarks/corpus_scale.py --quick      # sizes 20000 and 50000: trying the script

Corpus (WORK/corpus_N, built once: seeded, reused while its marker corpus.json is there): every line of
train.en / train.de holds a length drawn around 25 words (normal, sd 6; the German side that length x
exp(N(0, 0.1))), cut from a stream of randomly drawn real sentences: English from multi30k, newstest2013/14,
IWSLT14 and the English side of fra-eng, German from multi30k, newstest2013/14 and IWSLT14 (../shared/data;
every sentence of those files, de-duplicated, the 500 held out below excepted). valid = newstest2013's first
500 lines, test = newstest2014's first 500.

Per size, each step a subprocess (TFORMER_CACHE inside WORK) whose process tree is sampled from /proc every
0.1 s: peak RSS of the tree (summed over its processes: pages shared by forked processes count in each, so
an upper bound) and of its largest process; the largest VmHWM (the kernel's own high-water mark, read at each
sample, so up to 0.1 s before the exit) is the cross-check that the samples did not miss a short peak.

1. prepare   `tformer prepare --config multi30k_en_de data.dir=CORPUS ... data.vocab_size=32000 --out
             WORK/prepared_N` (the folder removed first unless --keep): wall time, training pairs/s.
2. train     `tformer train --config multi30k_en_de data.prepared=WORK/prepared_N train.max_steps=20 ...`
             (fresh run folder): seconds from the process start to its `step 1` log line, and the model's
             tokens/s, the median of metrics.jsonl's tok_per_s over steps 5-20. The run ends with one
             validation (train.eval_every=0: at the end), inside the measured peak.
3. torchrun  (--torchrun-sizes, default the largest size) the same training under `torch.distributed.run
             --standalone --nproc-per-node 2`: peak RSS of each rank (told apart by their RANK) and of the
             launcher.
4. loader    in a fresh process of this script: `Batches` over the prepared training examples with the
             recipe's max_tokens, collated batches only, for 300 updates or 20 s: source+target tokens/s
             (real tokens, as the trainer's tok_per_s counts them) and that over the model's tokens/s.
5. before    (--before, sizes --before-sizes, default the smallest) the code of 750d7a9, which tokenises
             inside `tformer train` (data.dir=CORPUS, an empty TFORMER_CACHE), from a git worktree at
             /tmp/tformer-before (made once, kept; --cleanup removes it), run with PYTHONPATH pointing at it.

Raw measurements go to WORK/results.json and each step's log to WORK/logs/. Targets are judged on what was
measured: the largest size prepared in 15 minutes, train peak RSS of the larger sizes within 10% of the
smallest's and under 2 GB, the first update within 30 s, the loader at least 10x the model.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import gzip
import json
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
from common import RESULTS, SHARED_DATA, machine  # noqa: E402

TITLE = "Corpus scale: prepare once, train by mmap (issue 21)"
BEFORE_REV = "750d7a9"
BEFORE_TREE = Path("/tmp/tformer-before")
SEED = 21
CORPUS_RECIPE = 1  # bump when the corpus construction changes: older corpora are rebuilt
HELD_OUT = 500  # valid / test lines from newstest2013 / newstest2014, kept out of the training text
TRAIN_FLAGS = ["train.max_steps=20", "train.eval_every=0", "train.epochs=1000", "train.log_every=1",
               "train.attention_examples=0"]
CORPUS_FLAGS = ["data.valid_prefix=valid", "data.test_prefix=test", "data.vocab_size=32000"]
STEP_1 = re.compile(r"\bstep 1\s+epoch\b")
MIB = 1024  # KiB per MiB


# ------------------------------------------------------------------------------------------ the corpora


def read_lines(path: Path, column: int | None = None) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        lines = [ln.rstrip("\n") for ln in f]
    return [ln.split("\t")[column] for ln in lines] if column is not None else lines


class Pool:
    """Sentences of one language as word ids: `ids` (all words back to back), each sentence's start and length."""

    def __init__(self, sentences: list[str]) -> None:
        words = [s.split() for s in dict.fromkeys(sentences)]
        words = [w for w in words if w]
        index: dict[str, int] = {}
        self.ids = np.fromiter((index.setdefault(t, len(index)) for w in words for t in w), dtype=np.int64)
        self.lens = np.array([len(w) for w in words], dtype=np.int64)
        self.starts = np.cumsum(self.lens) - self.lens
        self.vocab = np.array(list(index), dtype=object)
        self.sentences = len(words)

    def lines(self, lengths: np.ndarray, rng: np.random.Generator) -> list[str]:
        """One line per entry of `lengths` (in words), cut in order from a stream of random sentences."""
        need, picks, have = int(lengths.sum()), [], 0
        while have < need:  # about enough sentences at once, more if short
            k = rng.integers(0, self.sentences, size=int((need - have) / self.lens.mean() * 1.1) + 16)
            picks.append(k)
            have += int(self.lens[k].sum())
        k = np.concatenate(picks)
        lens = self.lens[k]
        at = np.cumsum(lens) - lens  # where each drawn sentence starts in the stream
        stream = (np.repeat(self.starts[k] - at, lens) + np.arange(int(lens.sum())))[:need]
        words = self.vocab[self.ids[stream]].tolist()
        ends = np.cumsum(lengths).tolist()
        return [" ".join(words[a:b]) for a, b in zip([0] + ends[:-1], ends)]


def pools() -> tuple[Pool, Pool]:
    d = SHARED_DATA
    en, de = [], []
    for lang, out in (("en", en), ("de", de)):
        for name in ("train", "val", "test2016"):
            out += read_lines(d / "multi30k" / f"{name}.{lang}.gz")
        for name in ("newstest2013", "newstest2014"):
            out += read_lines(d / "wmt14" / f"{name}.{lang}.gz")[HELD_OUT:]
        for name in ("valid", "test"):
            out += read_lines(d / "iwslt14" / f"{name}.{lang}.gz")
    en += read_lines(d / "fra-eng" / "fra.txt.gz", column=0)
    return Pool(en), Pool(de)


_POOLS: list[tuple[Pool, Pool]] = []


def build_corpus(n: int, folder: Path) -> dict:
    """WORK/corpus_N (see the module docstring); an existing one is reused when its marker matches."""
    marker = folder / "corpus.json"
    if marker.exists():
        info = json.loads(marker.read_text())
        if info.get("pairs") == n and info.get("recipe") == CORPUS_RECIPE and info.get("seed") == SEED:
            return info
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    tic = time.perf_counter()
    if not _POOLS:
        _POOLS.append(pools())
    en, de = _POOLS[0]
    rng = np.random.default_rng([SEED, n])
    words = [0, 0]
    with open(folder / "train.en", "w", encoding="utf-8") as fe, open(folder / "train.de", "w", encoding="utf-8") as fd:
        for first in range(0, n, 100_000):
            m = min(100_000, n - first)
            src = np.clip(np.rint(rng.normal(25, 6, m)), 4, 64).astype(np.int64)
            tgt = np.clip(np.rint(src * np.exp(rng.normal(0, 0.1, m))), 3, 80).astype(np.int64)
            fe.write("\n".join(en.lines(src, rng)) + "\n")
            fd.write("\n".join(de.lines(tgt, rng)) + "\n")
            words[0] += int(src.sum())
            words[1] += int(tgt.sum())
    d = SHARED_DATA / "wmt14"
    for split, name in (("valid", "newstest2013"), ("test", "newstest2014")):
        for lang in ("en", "de"):
            (folder / f"{split}.{lang}").write_text("\n".join(read_lines(d / f"{name}.{lang}.gz")[:HELD_OUT]) + "\n",
                                                   encoding="utf-8")
    info = {"pairs": n, "recipe": CORPUS_RECIPE, "seed": SEED, "seconds": round(time.perf_counter() - tic, 1),
            "words_per_line": [round(w / n, 2) for w in words],
            "pool": {"en": [en.sentences, len(en.vocab)], "de": [de.sentences, len(de.vocab)]}}
    marker.write_text(json.dumps(info))  # last: the corpus is whole
    return info


# ------------------------------------------------------------------------------------------ measuring a process tree


@dataclass
class Run:
    name: str
    seconds: float = 0.0
    peak_sum: int = 0  # KiB: the tree's summed RSS at its largest
    peak_largest: int = 0  # KiB: the largest single process's RSS
    peak_anon_sum: int = 0  # KiB: the same sum of anonymous pages only (RssAnon: no mapped files)
    hwm: int = 0  # KiB: the largest VmHWM (the kernel's high-water mark) read from any process of the tree
    first_line: float | None = None  # seconds from the start to the first line matching the pattern
    ranks: dict = field(default_factory=dict)  # RANK -> peak RSS KiB (torchrun workers)
    launcher: int = 0  # KiB: the root process's peak RSS
    samples: int = 0


def _stat(pid: str) -> tuple[int, str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
        return int(rest[1]), rest[0]
    except (OSError, IndexError):
        return None


def _tree(root: int) -> list[int]:
    """`root` and its descendants now, from the parent ids in /proc."""
    children: dict[int, list[int]] = collections.defaultdict(list)
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            st = _stat(pid)
            if st is not None and st[1] != "Z":
                children[st[0]].append(int(pid))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


def _memory(pid: int) -> dict[str, int] | None:
    """VmRSS, VmHWM, RssAnon ... of a live process in KiB (None once it is gone or a zombie)."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return None
    out = {k: int(v.split()[0]) for k, _, v in (ln.partition(":") for ln in lines) if v.strip().endswith(" kB")}
    return out if "VmRSS" in out else None


def _rank(pid: int) -> str | None:
    """The RANK a torchrun worker runs as (from its environment), else None."""
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    if b"tformer" not in cmd or b"torch.distributed.run" in cmd:
        return None
    for item in env:
        if item.startswith(b"RANK="):
            return item[5:].decode()
    return None


def measure(name: str, cmd: list[str], env: dict, cwd: Path, logs: Path, timeout: float) -> Run:
    """Run `cmd` in a new session, sampling its process tree; a failure prints its stderr tail and exits."""
    logs.mkdir(parents=True, exist_ok=True)
    run, tail = Run(name), collections.deque(maxlen=40)
    ranks: dict[int, str | None] = {}
    tic = time.perf_counter()
    with open(logs / f"{name}.out", "w") as out, open(logs / f"{name}.err", "w") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.PIPE, env=env, cwd=cwd, text=True,
                                start_new_session=True)

        def read_stderr() -> None:
            for line in proc.stderr:
                if run.first_line is None and STEP_1.search(line):
                    run.first_line = time.perf_counter() - tic
                err.write(line)
                tail.append(line)

        reader = threading.Thread(target=read_stderr, daemon=True)
        reader.start()
        try:
            while True:
                total = anon = 0
                for pid in _tree(proc.pid):
                    mem = _memory(pid)
                    if mem is None:
                        continue
                    rss = mem["VmRSS"]
                    total, anon = total + rss, anon + mem.get("RssAnon", 0)
                    run.peak_largest = max(run.peak_largest, rss)
                    run.hwm = max(run.hwm, mem.get("VmHWM", 0))
                    if pid == proc.pid:
                        run.launcher = max(run.launcher, rss)
                    elif ranks.get(pid) is None:
                        ranks[pid] = _rank(pid)
                    if ranks.get(pid) is not None:
                        run.ranks[ranks[pid]] = max(run.ranks.get(ranks[pid], 0), rss)
                run.peak_sum, run.peak_anon_sum = max(run.peak_sum, total), max(run.peak_anon_sum, anon)
                run.samples += 1
                pid, status = os.waitpid(proc.pid, os.WNOHANG)
                if pid:
                    break
                if time.perf_counter() - tic > timeout:
                    raise TimeoutError(f"{name} ran past {timeout:.0f} s")
                time.sleep(0.1)
        except BaseException:
            os.killpg(proc.pid, signal.SIGTERM)  # the session this call started, nothing else
            proc.wait()
            raise
        run.seconds = time.perf_counter() - tic
        proc.returncode = os.waitstatus_to_exitcode(status)
        reader.join(timeout=30)
    if proc.returncode:
        sys.stderr.write(f"\n{name} failed (exit {proc.returncode}): {shlex.join(cmd)}\n--- stderr tail ---\n"
                         + "".join(tail))
        sys.exit(f"{name} failed; logs in {logs}")
    return run


def check_code(env: dict, cwd: Path, want: Path) -> str:
    """The file `import tformer` loads under `env` in `cwd`; exits unless it lies under `want`."""
    out = subprocess.run([sys.executable, "-c", "import tformer; print(tformer.__file__)"], env=env, cwd=cwd,
                         capture_output=True, text=True)
    where = out.stdout.strip()
    if out.returncode or not Path(where).resolve().is_relative_to(want.resolve()):
        sys.exit(f"expected tformer from {want}, got {where or out.stderr[-2000:]!r}")
    return where


# ------------------------------------------------------------------------------------------ the steps


def model_tok_s(run_dir: Path) -> float | None:
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    values = [r["tok_per_s"] for r in recs if r.get("kind") == "train" and 5 <= r.get("step", 0) <= 20]
    return statistics.median(values) if values else None


def loader_child(prepared: str, updates: int, seconds: float) -> dict:
    """The trainer's batches over a prepared corpus, collated and thrown away (called in a fresh child)."""
    from tformer.config import Config
    from tformer.data.prepared import PreparedCorpus
    from tformer.training.distributed import Context
    from tformer.training.loop import Batches

    cfg = Config.from_yaml("multi30k_en_de", [f"data.prepared={prepared}"])
    tic = time.perf_counter()
    examples = PreparedCorpus.open(prepared).examples("train")
    batches = Batches(examples, cfg, Context())
    plan = time.perf_counter() - tic
    n = tokens = epoch = 0
    tic = time.perf_counter()
    while n < updates and time.perf_counter() - tic < seconds:
        for update in batches.updates(epoch, 0):
            tokens += sum(b.n_src_tokens + b.n_tgt_tokens for b in update)
            n += 1
            if n >= updates or time.perf_counter() - tic >= seconds:
                break
        epoch += 1
    took = time.perf_counter() - tic
    return {"plan_seconds": plan, "updates": n, "seconds": took, "tokens": tokens, "tok_per_s": tokens / took,
            "max_tokens": cfg.train.max_tokens}


def ensure_before_tree() -> None:
    if not (BEFORE_TREE / "tformer" / "__init__.py").exists():
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(BEFORE_TREE), BEFORE_REV],
                       check=True)
    head = subprocess.run(["git", "-C", str(BEFORE_TREE), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    if not head.startswith(BEFORE_REV):
        sys.exit(f"{BEFORE_TREE} is at {head}, not {BEFORE_REV}: remove it (git worktree remove --force) and rerun")


# ------------------------------------------------------------------------------------------ the report


def label(n: int) -> str:
    return f"{n / 1e6:g}M" if n >= 100_000 else f"{n / 1e3:g}k"


def mib(kib: int) -> str:
    return f"{kib / MIB:,.0f} MiB"


def fmt(x: float | None, spec: str = ",.0f", unit: str = "") -> str:
    return "n/a" if x is None else f"{x:{spec}}{unit}"


def judge(ok: bool | None) -> str:
    return "not measured" if ok is None else ("met" if ok else "missed")


def table(res: dict, sizes: list[int]) -> list[str]:
    rows = ["| pairs | prepare wall | prepare pairs/s | prepare peak RSS (sum / largest) | train peak RSS (sum / "
            "largest) | first update | model tok/s | loader tok/s | loader / model |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for n in sizes:
        r = res["sizes"][str(n)]
        p, t, lo = r.get("prepare"), r["train"], r["loader"]
        prep = (["kept (not run)"] * 3 if p is None else
                [f"{p['seconds']:,.0f} s", f"{n / p['seconds']:,.0f}",
                 f"{mib(p['peak_sum'])} / {mib(p['peak_largest'])}"])
        ratio = lo["tok_per_s"] / r["model_tok_s"] if r["model_tok_s"] else None
        rows.append(f"| {label(n)} | " + " | ".join(prep) + f" | {mib(t['peak_sum'])} / {mib(t['peak_largest'])} | "
                    f"{fmt(t['first_line'], '.1f', ' s')} | {fmt(r['model_tok_s'])} | {lo['tok_per_s']:,.0f} | "
                    f"{fmt(ratio, '.1f', 'x')} |")
    for n, r in res["torchrun"].items():
        ranks = " / ".join(f"rank {k} {mib(v)}" for k, v in sorted(r["ranks"].items()))
        rows.append(f"| {label(int(n))}, torchrun 2 processes | | | | {ranks} / launcher {mib(r['launcher'])} "
                    f"(tree sum {mib(r['peak_sum'])}) | {fmt(r['first_line'], '.1f', ' s')} | "
                    f"{fmt(r['model_tok_s'])} | | |")
    for n, r in res["before"].items():
        rows.append(f"| {label(int(n))}, before ({BEFORE_REV}: tokenises in train) | | | | {mib(r['peak_sum'])} / "
                    f"{mib(r['peak_largest'])} | {fmt(r['first_line'], '.1f', ' s')} | {fmt(r['model_tok_s'])} | | |")
    return rows


def targets(res: dict, sizes: list[int]) -> list[str]:
    per = {n: res["sizes"][str(n)] for n in sizes}
    small, big = sizes[0], sizes[-1]
    out = []
    p = per[big].get("prepare")
    if big == 4_500_000 and p is not None:
        out.append(f"- 4.5M prepared <= 15 min: {p['seconds'] / 60:.1f} min ({judge(p['seconds'] <= 900)})")
    else:
        out.append(f"- 4.5M prepared <= 15 min: not measured (largest size {label(big)}: "
                   + ("kept, not run" if p is None else f"{p['seconds'] / 60:.1f} min") + ")")
    base = per[small]["train"]["peak_sum"]
    growth = {n: per[n]["train"]["peak_sum"] / base - 1 for n in sizes[1:]}
    out.append(f"- train peak RSS flat: {' and '.join(label(n) for n in growth)} within 10% of {label(small)}: "
               + " / ".join(f"{g:+.1%}" for g in growth.values())
               + f" ({judge(all(abs(g) <= 0.10 for g in growth.values()) if growth else None)})")
    peak = max(per[n]["train"]["peak_sum"] for n in sizes)
    out.append(f"- train peak RSS < 2 GB: largest {mib(peak)} ({judge(peak * 1024 < 2e9)})")
    first = [per[n]["train"]["first_line"] for n in sizes]
    worst = None if None in first else max(first)
    out.append(f"- first update <= 30 s: slowest {fmt(worst, '.1f', ' s')} "
               f"({judge(None if worst is None else worst <= 30)})")
    ratios = [per[n]["loader"]["tok_per_s"] / per[n]["model_tok_s"] for n in sizes if per[n]["model_tok_s"]]
    out.append(f"- loader >= 10x model: lowest {fmt(min(ratios) if ratios else None, '.1f', 'x')} "
               f"({judge(min(ratios) >= 10 if ratios else None)})")
    return out


def notes(res: dict) -> str:
    gaps = [((r["hwm"] - r["peak_largest"]) / r["peak_largest"], name, r) for name, r in res["runs"].items()
            if r["peak_largest"]]
    gap, name, r = max(gaps, key=lambda g: g[0])
    corpora = "; ".join(f"{label(int(n))} {c['seconds']:.0f} s" for n, c in res["corpora"].items())
    c = next(iter(res["corpora"].values()))
    return (f"Synthetic corpora (this script, seed {SEED}): ~25 words a side cut from random real sentences "
            f"(English pool {c['pool']['en'][0]:,} sentences / {c['pool']['en'][1]:,} word types, German "
            f"{c['pool']['de'][0]:,} / {c['pool']['de'][1]:,}); valid/test newstest2013/2014's first {HELD_OUT} lines. "
            f"multi30k_en_de recipe with data.vocab_size=32000, the defaults otherwise (data.tokenizer_sample "
            f"1,000,000, data.workers one per core); train: {' '.join(TRAIN_FLAGS)}. RSS sampled from /proc every "
            "0.1 s over the whole process tree (sum, and the largest process); first update = process start to the "
            "`step 1` log line; model tok/s = median of steps 5-20; loader = `Batches` alone in a fresh process "
            f"({res['loader_budget']}). The sum counts pages shared between processes (forked "
            "encoding workers) in each of them: an upper bound. Cross-check: the kernel's high-water mark (VmHWM, "
            f"read at each sample) of the largest process exceeds the sampled peak by at most {gap:.0%} on every "
            f"step (largest gap: {name}, {mib(r['hwm'])} vs {mib(r['peak_largest'])} sampled). Corpus build time "
            f"(not part of any step): {corpora}.")


def ram_gib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) / 1024 ** 2
    return float("nan")


def record(rows: list[str], text: str) -> None:
    command = "python " + shlex.join(sys.argv)
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    with open(RESULTS, "a", encoding="utf-8") as f:
        f.write(f"\n## {TITLE}\n\n- command: `{command}`\n- machine: {machine()}, {ram_gib():.0f} GiB RAM\n"
                f"- date: {when}\n\n" + "\n".join(rows) + f"\n\n{text}\n")
    print(f"appended to {RESULTS}")


# ------------------------------------------------------------------------------------------ main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[200_000, 1_000_000, 4_500_000])
    ap.add_argument("--work", type=Path, default=Path("/tmp/tformer-corpus-scale"))
    ap.add_argument("--torchrun-sizes", type=int, nargs="*", help="default: the largest size")
    ap.add_argument("--before", action="store_true", help=f"also train with the code of {BEFORE_REV}")
    ap.add_argument("--before-sizes", type=int, nargs="+", help="default: the smallest size")
    ap.add_argument("--keep", action="store_true", help="reuse a prepared folder already there (prepare not measured)")
    ap.add_argument("--cleanup", action="store_true", help=f"at the end, remove the worktree {BEFORE_TREE}")
    ap.add_argument("--quick", action="store_true", help="sizes 20000 and 50000 only")
    ap.add_argument("--record", action="store_true")
    ap.add_argument("--loader-updates", type=int, default=300)
    ap.add_argument("--loader-seconds", type=float, default=20.0)
    ap.add_argument("--child-loader", metavar="PREPARED", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child_loader:
        print(json.dumps(loader_child(args.child_loader, args.loader_updates, args.loader_seconds)))
        return
    sizes = sorted([20_000, 50_000] if args.quick else args.sizes)
    torchrun_sizes = sizes[-1:] if args.torchrun_sizes is None else args.torchrun_sizes
    before_sizes = (args.before_sizes or sizes[:1]) if args.before else []
    if not set(torchrun_sizes) <= set(sizes):
        ap.error("--torchrun-sizes must be among the sizes (they train from the prepared corpus)")
    work = args.work.resolve()
    logs = work / "logs"
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "TFORMER_CACHE": str(work / "cache"), "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    code = check_code(env, REPO, REPO / "tformer")
    print(f"new code: {code}; work folder {work}", flush=True)
    res: dict = {"sizes": {}, "torchrun": {}, "before": {}, "corpora": {}, "runs": {},
                 "loader_budget": f"{args.loader_updates} updates or {args.loader_seconds:g} s"}
    tformer = [sys.executable, "-m", "tformer"]

    def keep(run: Run) -> dict:
        res["runs"][run.name] = d = asdict(run)
        print(f"  {run.name}: {run.seconds:.1f} s, peak RSS {mib(run.peak_sum)} sum / {mib(run.peak_largest)} "
              f"largest (anonymous sum {mib(run.peak_anon_sum)}, VmHWM {mib(run.hwm)})"
              + (f", step 1 at {run.first_line:.1f} s" if run.first_line is not None else "")
              + "".join(f", rank {k} {mib(v)}" for k, v in sorted(run.ranks.items())), flush=True)
        return d

    def corpus(n: int) -> Path:
        folder = work / f"corpus_{n}"
        tic = time.perf_counter()
        res["corpora"][str(n)] = info = build_corpus(n, folder)
        print(f"corpus {label(n)}: {folder} ({time.perf_counter() - tic:.1f} s now; built in {info['seconds']} s; "
              f"{info['words_per_line'][0]} / {info['words_per_line'][1]} words per line)", flush=True)
        return folder

    def train_cmd(prefix: list[str], data: list[str], run_dir: Path) -> list[str]:
        shutil.rmtree(run_dir, ignore_errors=True)
        return [*prefix, "train", "--config", "multi30k_en_de", *data, *TRAIN_FLAGS, "--run-dir", str(run_dir),
                "--no-progress"]

    for n in sizes:
        folder, prepared = corpus(n), work / f"prepared_{n}"
        r = res["sizes"][str(n)] = {}
        if args.keep and (prepared / "manifest.json").exists():
            print(f"  prepare {label(n)}: kept {prepared} (not measured)", flush=True)
            r["prepare"] = None
        else:
            shutil.rmtree(prepared, ignore_errors=True)
            cmd = [*tformer, "prepare", "--config", "multi30k_en_de", f"data.dir={folder}", *CORPUS_FLAGS,
                   "--out", str(prepared), "--no-progress"]
            r["prepare"] = keep(measure(f"prepare_{n}", cmd, env, REPO, logs, 6 * 3600))
        run_dir = work / f"run_{n}"
        cmd = train_cmd(tformer, [f"data.prepared={prepared}"], run_dir)
        r["train"] = keep(measure(f"train_{n}", cmd, env, REPO, logs, 3600))
        r["model_tok_s"] = model_tok_s(run_dir)
        cmd = [sys.executable, __file__, "--child-loader", str(prepared), "--loader-updates", str(args.loader_updates),
               "--loader-seconds", str(args.loader_seconds)]
        r["loader_run"] = keep(measure(f"loader_{n}", cmd, env, REPO, logs, 3600))
        r["loader"] = json.loads((logs / f"loader_{n}.out").read_text().strip().splitlines()[-1])
        print(f"  model {fmt(r['model_tok_s'])} tok/s, loader {r['loader']['tok_per_s']:,.0f} tok/s "
              f"({r['loader']['updates']} updates in {r['loader']['seconds']:.1f} s; plan built in "
              f"{r['loader']['plan_seconds']:.1f} s)", flush=True)
        (work / "results.json").write_text(json.dumps(res, indent=1))

    for n in torchrun_sizes:
        run_dir = work / f"run_torchrun_{n}"
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                    "-m", "tformer"]
        cmd = train_cmd(launcher, [f"data.prepared={work / f'prepared_{n}'}"], run_dir)
        d = res["torchrun"][str(n)] = keep(measure(f"torchrun_{n}", cmd, env, REPO, logs, 3600))
        if len(d["ranks"]) != 2:
            sys.exit(f"torchrun_{n}: expected 2 ranks among the launcher's children, found {d['ranks']}")
        d["model_tok_s"] = model_tok_s(run_dir)
        (work / "results.json").write_text(json.dumps(res, indent=1))

    if before_sizes:
        ensure_before_tree()
        for n in before_sizes:
            folder, cache = corpus(n), work / f"cache_before_{n}"
            shutil.rmtree(cache, ignore_errors=True)
            cache.mkdir()
            old = {**env, "TFORMER_CACHE": str(cache), "PYTHONPATH": str(BEFORE_TREE)}
            print(f"old code: {check_code(old, work, BEFORE_TREE / 'tformer')}", flush=True)
            run_dir = work / f"run_before_{n}"
            cmd = train_cmd(tformer, [f"data.dir={folder}", *CORPUS_FLAGS], run_dir)
            d = res["before"][str(n)] = keep(measure(f"before_{n}", cmd, old, work, logs, 6 * 3600))
            d["model_tok_s"] = model_tok_s(run_dir)
        (work / "results.json").write_text(json.dumps(res, indent=1))

    rows, text = table(res, sizes), notes(res)
    print("\n" + "\n".join(rows) + "\n\n" + "\n".join(targets(res, sizes)) + "\n\n" + text)
    if args.record:
        record(rows, "\n".join(targets(res, sizes)) + "\n\n" + text)
    if args.cleanup and BEFORE_TREE.exists():
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(BEFORE_TREE)], check=True)
        print(f"removed the worktree {BEFORE_TREE}")


if __name__ == "__main__":
    main()
