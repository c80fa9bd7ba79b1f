"""The results as records (benchmarks/records.py) and the pages rendered from them (benchmarks/render.py):
a bad record is refused naming its file and field, `compare` tells a move from noise, rendering is a function
of the records alone, headings are unique across the topic pages, the pages on disk are the records' rendering,
every archive record names a section that exists in benchmarks/RESULTS.md, and the headline's links keep
reaching their sections when a new record or a new benchmark's section is added."""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import catalogue, records as R, render  # noqa: E402
from helpers.markdown import anchors  # noqa: E402

ZEN4 = R.Cpu("AMD EPYC", "AMD Zen 4", ("avx2", "avx512f"))


def record(benchmark="train", value=100.0, date="2026-12-01T10:00Z", cpu=ZEN4, spread=None, mode="full", **kw):
    topic = catalogue.BENCHMARKS[benchmark].topic
    figure = R.Figure("tokens/s vs torch.nn.Transformer, small, fp32", value, "x", True, spread=spread)
    return R.Record(benchmark, topic, mode, "python -m benchmarks run train --full", "abc1234", date, cpu, 2,
                    "2.13.0+cpu", (figure,), **kw)


def write(tmp_path: Path, obj: dict, topic: str = "training") -> Path:
    path = tmp_path / topic / "x.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))
    return path


# ------------------------------------------------------------------------------------------------ validation

@pytest.mark.parametrize("change, field", [
    (lambda o: o.update(topic="speed"), "'topic'"),
    (lambda o: o.pop("figures"), "'figures'"),
    (lambda o: o.update(threads="2"), "'threads'"),
    (lambda o: o.update(date="2026-12-01 10:00"), "'date'"),
    (lambda o: o["figures"][0].update(value="fast"), "'value'"),
    (lambda o: o["figures"][0].update(target={"op": ">=", "value": 200.0, "met": True}), "'met'"),
    (lambda o: o.update(commit=None), "'commit'"),
    (lambda o: o.update(extra=1), "'extra'"),
])
def test_a_bad_record_is_refused_naming_its_file_and_field(tmp_path, change, field):
    obj = R.to_dict(record())
    R.from_dict(obj)  # the good one passes
    change(obj)
    path = write(tmp_path, obj, topic=obj["topic"])  # in its topic's folder: the field itself is checked
    with pytest.raises(R.RecordError) as e:
        R.load(path)
    assert str(path) in str(e.value) and field in str(e.value), str(e.value)


def test_a_record_in_another_topics_folder_is_refused(tmp_path):
    path = write(tmp_path, R.to_dict(record()), topic="serving")
    with pytest.raises(R.RecordError, match=r"x\.json: field 'topic'.*serving/"):
        R.load(path)


def test_records_round_trip_and_never_share_a_file_name(tmp_path):
    a, b = record(value=1.0), record(value=1.01)
    pa, pb = R.save(a, tmp_path), R.save(b, tmp_path)
    assert pa != pb and R.load(pa) == a and R.load(pb) == b
    with pytest.raises(R.RecordError, match="exists already"):
        R.save(a, tmp_path)


def test_cpu_kind_from_cpuinfo():
    info = "vendor_id\t: {}\ncpu family\t: {}\nmodel\t\t: {}\nmodel name\t: X\nflags\t\t: {}\n\nprocessor : 1\n"
    zen4 = R.this_cpu(info.format("AuthenticAMD", 25, 17, "fpu avx2 avx512f avx512_bf16"))
    assert zen4 == R.Cpu("X", "AMD Zen 4", ("avx2", "avx512f", "avx512_bf16"))
    assert R.this_cpu(info.format("AuthenticAMD", 25, 1, "avx2")).kind == "AMD Zen 3"
    assert R.this_cpu(info.format("GenuineIntel", 6, 143, "avx2 amx_tile")).kind == "Intel Sapphire Rapids"
    assert R.this_cpu(info.format("GenuineIntel", 6, 250, "avx2 avx512f")).kind == "Intel family 6 model 250 (AVX-512)"


# --------------------------------------------------------------------------------------------------- compare

def test_compare_flags_a_move_beyond_noise_and_not_one_within():
    last = record(value=100.0, date="2026-12-01T10:00Z")
    older = record(value=50.0, date="2026-11-01T10:00Z")
    other_cpu = record(value=10.0, date="2026-12-02T10:00Z", cpu=R.Cpu("Xeon", "Intel Sapphire Rapids"))
    quick = record(value=10.0, date="2026-12-02T11:00Z", mode="quick")
    history = [older, last, other_cpu, quick]

    up = R.compare(record(value=106.0, date="2026-12-03T10:00Z"), history)
    assert up.last is last and [m.figure for m in up.moved] == [last.figures[0].name] and up.moved[0].better
    assert up.moved[0].change == pytest.approx(0.06) and up.moved[0].band == pytest.approx(0.05)
    down = R.compare(record(value=90.0, date="2026-12-03T10:00Z"), history)
    assert down.moved and not down.moved[0].better
    within = R.compare(record(value=104.0, date="2026-12-03T10:00Z"), history)
    assert within.moved == [] and within.steady == [last.figures[0].name]
    # a run's own spread widens the band: 6% within a 10% spread is noise
    assert R.compare(record(value=106.0, date="2026-12-03T10:00Z", spread=0.10), history).moved == []
    # nothing like it before: nothing compared
    first = R.compare(record(value=1.0, cpu=R.Cpu("?", "AMD Zen 5")), history)
    assert first.last is None and "nothing to compare" in R.describe(first)


# ---------------------------------------------------------------------------------------------------- render

def headings(markdown: str) -> list[str]:
    return [m.group(1) for m in re.finditer(r"^#{1,6} (.+)$", markdown, re.M)]


def test_rendering_is_deterministic_and_the_pages_are_the_records_rendering():
    first = render.render(R.load_all())
    again = render.render(list(reversed(R.load_all())))
    assert first == again
    on_disk = {p.name: p.read_text(encoding="utf-8") for p in (ROOT / "docs" / "results").glob("*.md")}
    stale = sorted(n for n in first if on_disk.get(n) != first[n])
    assert not stale, f"docs/results/ differs from benchmarks/records/ in {stale}: run python -m benchmarks render"


def test_the_readme_and_the_landing_page_quote_the_headline_rows_of_the_records():
    records = R.load_all()
    for path, want in render.blocks(records).items():
        assert path.read_text(encoding="utf-8") == want, f"{path}: run python -m benchmarks render"
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    rows = [line for line in readme.split(render.OPEN)[1].split(render.CLOSE)[0].splitlines() if line]
    assert 3 <= len(rows) - 2 <= 8 and all("| AMD" in r or "| Intel" in r for r in rows[2:])  # <= 8, CPU named
    for target in re.findall(r"\]\((docs/results/[^)#]+)#([^)]+)\)", "\n".join(rows)):
        page = (ROOT / target[0]).read_text(encoding="utf-8")  # every link reaches a heading of its page
        assert target[1] in {catalogue.slug(h) for h in headings(page)}, target


def test_no_heading_repeats_across_the_topic_pages():
    pages = render.render(R.load_all())
    seen: dict[str, str] = {}
    for name, text in pages.items():
        for h in headings(text):
            s = catalogue.slug(h)
            assert s not in seen, f"heading {h!r} of {name} repeats one of {seen[s]}"
            seen[s] = name
    # every benchmark of the catalogue would get a heading of its own
    titles = [catalogue.slug(e.title) for e in catalogue.BENCHMARKS.values()]
    assert len(set(titles)) == len(titles)


def test_every_archive_record_names_a_section_of_results_md():
    archive = anchors((ROOT / "benchmarks" / "RESULTS.md").read_text(encoding="utf-8"))
    seeded = [r for r in R.load_all() if r.mode == "archive"]
    assert len(seeded) >= 15
    for r in seeded:
        anchor = re.search(r"\(#([^)]+)\)", r.source).group(1)
        assert anchor in archive, (r.benchmark, r.date, anchor)


def headline_links(pages: dict[str, str]) -> dict[str, str]:
    """Each headline link 'page#anchor' -> the heading it reaches on that page (missing: absent)."""
    found = {}
    for page, anchor in re.findall(r"\]\(([a-z]+\.md)#([^)]+)\)", pages["headline.md"]):
        by_anchor = {catalogue.slug(h): h for h in headings(pages[page])}
        assert anchor in by_anchor, f"headline link {page}#{anchor} reaches no heading"
        found[f"{page}#{anchor}"] = by_anchor[anchor]
    return found


def test_the_headline_links_survive_a_new_section_and_a_new_record():
    existing = R.load_all()
    before = render.render(existing)
    links = headline_links(before)
    assert len(links) == len(catalogue.HEADLINE) <= 8
    assert all(len(c.strip()) <= 120 for row in before["headline.md"].splitlines() for c in row.split("|"))
    # a section before every other on its page (a new benchmark), and a newer run of a headline benchmark
    new_section = dataclasses.replace(record(benchmark="quality", date="2026-12-05T10:00Z"),
                                      figures=(R.Figure("sacreBLEU test2016 greedy", 20.1, "BLEU", True),))
    catalogue_title = catalogue.BENCHMARKS["quality"].title
    newer = record(benchmark="train", value=1.31, date="2026-12-06T10:00Z")
    after = render.render([*existing, new_section, newer])
    assert catalogue_title in after["quality.md"] and "1.31x" in after["headline.md"]
    assert headline_links(after) == links
    # the explicit targets for cross-references stay too
    for name in {h.benchmark for h in catalogue.HEADLINE}:
        assert f"({catalogue.label(name)})=" in after[f"{catalogue.BENCHMARKS[name].topic}.md"]


def test_an_unknown_benchmark_is_refused_by_name():
    stray = dataclasses.replace(record(), benchmark="train-xl")
    with pytest.raises(R.RecordError, match="'train-xl'.*catalogue"):
        render.render([stray])
