"""Mutation testing of the mathematical core: each module against the tests that exercise it (mutmut 3).

    python benchmarks/mutation.py                       # every module below, one after another
    python benchmarks/mutation.py masks decode --jobs 2 # some modules; 2 mutants at a time
    python benchmarks/mutation.py --record              # append the table to benchmarks/RESULTS.md
    python benchmarks/mutation.py decode --again --match x_sample__mutmut_4  # rerun one survivor after a new test

For each module, a scratch copy of the package and the tests is made under build/mutation/<module>/, with a
`[tool.mutmut]` section naming the file(s) to mutate and the test files to run. mutmut collects which test
touches which function once, then runs each mutant against only those tests, in a forked worker (the fork
server mode, since torch is not fork-safe after it has started threads).

A mutant that no test kills is either a gap in the tests (write a test that kills it) or equivalent: it
cannot change behaviour. Equivalent mutants are listed, each with its mutated line and the reason, in
benchmarks/mutation_equivalent.yaml; the score leaves them out. An entry whose line no longer matches the
mutant of that name is reported as stale and does not count. Survivors are written, with their diffs, to
build/mutation/<module>/survivors.md.

The score is (killed + timed out) / (mutants - equivalent); a mutant whose tests die of a signal (mutmut's
"segfault") counts as killed, since the tests did not pass. A mutant no selected test reaches counts as
surviving. This is not part of .ci/run: a full run takes about an hour on this 2-core machine.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import resource
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import SHARED_DATA, report  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "build" / "mutation"
EQUIVALENT = ROOT / "benchmarks" / "mutation_equivalent.yaml"


@dataclass(frozen=True)
class Target:
    name: str
    mutate: tuple[str, ...]  # globs of files to mutate, relative to the repository root
    tests: tuple[str, ...]  # pytest arguments choosing the tests that exercise them


TARGETS = [
    Target("masks", ("tformer/masks.py",),
           ("tests/test_masks.py", "tests/attention/test_attention.py", "tests/attention/test_graph.py",
            "tests/model/test_model.py", "tests/model/test_tupe.py", "tests/model/test_universal_graph.py")),
    Target("positions", ("tformer/positions.py",),
           ("tests/model/test_positions.py", "tests/model/test_position_schemes.py", "tests/model/test_tupe.py",
            "tests/model/test_model.py", "tests/convert/test_import_marian.py")),
    Target("attention", ("tformer/attention/*",),
           ("tests/attention/test_attention_kernels.py", "tests/attention/test_attention.py",
            "tests/decode/test_decode_kernels.py", "tests/attention/test_graph.py", "tests/model/test_tupe.py",
            # of test_blocks.py (whole models, ~1 min), only the QK-norm formula: the rest is left out for time
            "tests/model/test_blocks.py::test_qk_norm_attention_is_its_formula")),
    Target("decode", ("tformer/decode/*",),
           ("tests/decode/test_search.py", "tests/decode/test_decode.py", "tests/decode/test_beam.py",
            "tests/decode/test_decode_kernels.py", "tests/decode/test_prefix.py", "tests/decode/test_constraints.py",
            "tests/test_shortlist.py", "tests/decode/test_avoid.py")),
    Target("act", ("tformer/model/act.py",),
           ("tests/model/test_act.py", "tests/model/test_universal.py", "tests/model/test_universal_graph.py")),
    Target("loss", ("tformer/training/loss.py",),
           ("tests/training/test_loss_schedule.py",
            "tests/data/test_speech_frontend.py::test_ctc_loss_equals_the_forward_recursion_over_each_utterance",
            "tests/data/test_speech_frontend.py::test_a_target_longer_than_its_frames_costs_nothing_in_ctc")),
    Target("schedule", ("tformer/training/schedule.py",),
           ("tests/training/test_loss_schedule.py",)),
    Target("batching", ("tformer/data/batching.py",),
           ("tests/data/test_batching.py", "tests/data/test_data.py", "tests/test_properties.py")),
    Target("specaugment", ("tformer/data/specaugment.py",),
           ("tests/data/test_specaugment.py",
            "tests/data/test_speech_frontend.py::test_spec_augment_masks_stay_in_bounds_and_are_seeded",
            ("tests/data/test_speech_frontend.py::"
             "test_training_with_spec_augment_resumes_exactly_and_evaluation_never_masks"))),
    Target("markup", ("tformer/documents/markup.py",),
           ("tests/documents/test_markup.py", "tests/documents/test_documents.py")),
    Target("metrics", ("tformer/metrics.py",),
           ("tests/test_metrics.py", "tests/test_bleu_lowercase.py", "tests/data/test_translation.py",
            "tests/data/test_wmt14.py")),
]
KILLED = {"killed", "timeout", "segfault"}  # the tests failed, hung or crashed
TIMEOUT_MULTIPLIER = 60  # mutmut's default is 15


def toml_list(items) -> str:
    return "[" + ", ".join(f'"{x}"' for x in items) + "]"


def sandbox(target: Target) -> Path:
    """A fresh copy of the package and tests with a pyproject whose [tool.mutmut] names this target."""
    work = WORK / target.name
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for part in ("tformer", "tests"):
        shutil.copytree(ROOT / part, work / part, ignore=ignore)
    write_pyproject(work, target)
    return work


def write_pyproject(work: Path, target: Target) -> None:
    missing = [t for t in target.tests if not (ROOT / t.split("::")[0]).exists()]
    assert not missing, f"{target.name}: no such test file {missing}"
    pyproject = (ROOT / "pyproject.toml").read_text()
    pyproject = re.sub(r"(?m)^addopts = .*$", "", pyproject)  # xdist's --dist has no place inside mutmut
    pyproject += (
        "\n[tool.mutmut]\n"
        'source_paths = ["tformer"]\n'
        f"only_mutate = {toml_list(target.mutate)}\n"
        'pytest_add_cli_args = ["-q", "-p", "no:cacheprovider", "-p", "no:randomly"]\n'
        f"pytest_add_cli_args_test_selection = {toml_list(target.tests)}\n"
        'process_isolation = "forkserver"\n'
        "use_git_change_detection = false\n"
        # a mutant that makes the tests hang is killed by timing out; the bound is generous (TIMEOUT_MULTIPLIER
        # times the tests' own time, wall clock) so that a loaded machine does not pass slowness off as a kill
        f"timeout_multiplier = {TIMEOUT_MULTIPLIER}\n"
    )
    (work / "pyproject.toml").write_text(pyproject)


# Address space of each mutmut process (its forked workers inherit it): a mutant whose loop never ends can grow
# until it takes the machine's memory (one decode mutant reached 23 GiB of 24); bounded, it fails with a
# MemoryError, which fails its tests. The tests themselves stay far below it.
MEMORY_LIMIT = 6 * 2**30


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def mutmut(work: Path, *args: str, log=None) -> str:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TFORMER_SHARED_DATA=str(SHARED_DATA),
               PYTHONHASHSEED="0")
    exe = [sys.executable, "-m", "mutmut", *args]
    if log is not None:
        subprocess.run(exe, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT, check=True,
                       preexec_fn=_limit_memory)
        return ""
    return subprocess.run(exe, cwd=work, env=env, capture_output=True, text=True, check=True).stdout


def mutated_line(diff: str) -> str:
    """The first added line of a mutant's diff, stripped: what the equivalents file records."""
    for line in diff.splitlines():
        if line.startswith("+") and not line.startswith("+++"):
            return line[1:].strip()
    return ""


def load_equivalent() -> dict[str, dict]:
    if not EQUIVALENT.exists():
        return {}
    return yaml.safe_load(EQUIVALENT.read_text()) or {}


def results(work: Path) -> dict[str, str]:
    """Each mutant's status: killed, timeout, survived, no tests, ..."""
    statuses = {}
    for line in mutmut(work, "results", "--all", "true").splitlines():
        name, sep, status = line.strip().rpartition(": ")
        if sep:
            statuses[name] = status.strip()
    return statuses


def run_target(target: Target, jobs: int, equivalent: dict[str, dict], again: bool, report_only: bool,
               sample: int, match: tuple[str, ...] = ()) -> dict:
    """Mutate and test one target. With `again`, keep the last run's verdicts and run only the mutants it did not
    kill (or killed by timing out), against the tests as they are now (tests are only ever added or
    strengthened, so a killed mutant stays killed). With `sample` (and `again`, or `report_only`), only a
    uniform random sample of that many mutants (seed 0) is run and scored. With `match` (and `again`), only the
    mutants whose names contain one of those strings are run again; the others keep their last verdicts."""
    work = WORK / target.name
    names: list[str] = []
    chosen = None
    if sample and (work / "mutants").exists():
        every = sorted(results(work))
        chosen = set(random.Random(0).sample(every, min(sample, len(every))))
    if report_only:
        pass
    elif again and (work / "mutants").exists():
        names = [n for n, status in results(work).items()  # timeouts are tried again
                 if status != "killed" and (chosen is None or n in chosen)
                 and (not match or any(m in n for m in match))]
        write_pyproject(work, target)
        for part in ("tests", "mutants/tests"):
            shutil.rmtree(work / part)
            shutil.copytree(ROOT / "tests", work / part, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    else:
        work = sandbox(target)
    tic = time.perf_counter()
    if not report_only and (names or not again):
        with open(work / "mutmut.log", "a" if again else "w") as log:
            mutmut(work, "run", "--max-children", str(jobs), *names, log=log)
    seconds = time.perf_counter() - tic
    statuses = results(work)
    total = len(statuses)
    if chosen is not None:
        statuses = {n: s for n, s in statuses.items() if n in chosen}
    counts = {"mutants": len(statuses), "killed": 0, "timeout": 0, "equivalent": 0, "survived": 0, "no tests": 0,
              "stale": 0, "not run": 0}
    survivors = []
    for name, status in sorted(statuses.items()):
        if status == "not checked":  # the run was stopped before it reached this one: left out of the score
            counts["not run"] += 1
            continue
        if status in KILLED:
            counts["killed"] += 1
            counts["timeout"] += status == "timeout"
            continue
        diff = mutmut(work, "show", name)
        line = mutated_line(diff)
        entry = equivalent.get(name)
        if entry and entry.get("line", "").strip() == line:
            counts["equivalent"] += 1
            continue
        if entry:
            counts["stale"] += 1
        counts["no tests" if status == "no tests" else "survived"] += 1
        survivors.append(f"### {name} ({status}{', stale equivalence entry' if entry else ''})\n\n"
                         f"```diff\n{diff.strip()}\n```\n")
    (work / "survivors.md").write_text(f"# {target.name}: {len(survivors)} surviving mutants\n\n"
                                       + "\n".join(survivors))
    live = counts["mutants"] - counts["not run"] - counts["equivalent"]
    counts["score"] = counts["killed"] / live if live else 1.0
    counts["minutes"] = "-" if report_only else f"{seconds / 60:.1f}"
    run = len(statuses) - counts["not run"]
    counts["sampled"] = (f"{run} of {total}" if run < total else str(total)) + (" (sample)" if chosen else "")
    # a 95% interval for the score when it is estimated from a sample (normal approximation)
    counts["margin"] = (1.96 * (counts["score"] * (1 - counts["score"]) / live) ** 0.5
                        if chosen is not None and live else 0.0)
    return counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("modules", nargs="*", help=f"some of: {', '.join(t.name for t in TARGETS)} (default: all)")
    ap.add_argument("--jobs", type=int, default=2, help="mutants run at a time (default 2)")
    ap.add_argument("--again", action="store_true",
                    help="rerun only the mutants the last run of each module did not kill, with the current tests")
    ap.add_argument("--report", action="store_true", help="run nothing: tabulate the last runs' verdicts")
    ap.add_argument("--sample", type=int, default=0,
                    help="with --again or --report: run and score a uniform random sample of N mutants (seed 0)")
    ap.add_argument("--match", action="append", default=[], metavar="TEXT",
                    help="with --again: rerun only the mutants whose names contain TEXT (repeatable), e.g. the "
                         "survivors a new test is written for")
    ap.add_argument("--record", action="store_true", help="append the table to benchmarks/RESULTS.md")
    args = ap.parse_args()
    by_name = {t.name: t for t in TARGETS}
    unknown = [m for m in args.modules if m not in by_name]
    if unknown:
        ap.error(f"unknown module(s) {unknown}; choose from {sorted(by_name)}")
    targets = [by_name[m] for m in args.modules] if args.modules else TARGETS
    equivalent = load_equivalent()
    table = ["| module | files | mutants | killed (of which timed out) | equivalent | survived | no test reaches | score "
             "| minutes |", "|---|---|---|---|---|---|---|---|---|"]
    for target in targets:
        c = run_target(target, args.jobs, equivalent, args.again, args.report, args.sample, tuple(args.match))
        table.append(f"| {target.name} | {', '.join(target.mutate)} | {c['sampled']} | {c['killed']} ({c['timeout']}) | "
                     f"{c['equivalent']} | {c['survived']} | {c['no tests']} | {100 * c['score']:.1f}%"
                     + (f" ± {100 * c['margin']:.1f}" if c["margin"] else "") + " | "
                     f"{c['minutes']} |")
        print(table[-1] + (f"  ({c['stale']} stale equivalence entries)" if c["stale"] else ""), flush=True)
    notes = ("Score: (killed + timed out) / (mutants - equivalent); killed includes mutants whose tests died of a "
             "signal; a mutant no selected test reaches counts as surviving. Equivalent mutants, each with its reason: benchmarks/mutation_equivalent.yaml. "
             "Survivors with their diffs: build/mutation/<module>/survivors.md. Test selection per module: "
             "TARGETS in benchmarks/mutation.py.")
    report("Mutation testing: the mathematical core, mutmut", table, notes, args.record)


if __name__ == "__main__":
    main()
