"""The documentation site builds as the README says, offline, with every tutorial executed; the built HTML loads
nothing from outside the site, every internal link and anchor resolves, and a real browser shows the pages with
their figures. One build per test session (module fixture): about five minutes on one core."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

slow = pytest.mark.slow  # builds the site and trains its models: `pytest -m "not slow"` skips them

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "test-artifacts" / "docs"
TUTORIALS = sorted(p.stem for p in (ROOT / "docs" / "tutorials").glob("[0-9]*.md"))
EXECUTED = {"index", "start/first-model", "reference/api", *(f"tutorials/{t}" for t in TUTORIALS)}
BUILD_BUDGET_S = 600  # the budget for the docs part of CI on this machine


def build_command(out: Path) -> list[str]:
    """The documented docs command (`python -m sphinx -W --keep-going -b html docs OUT`), read from the install
    page (docs/start/install.md) so that the two cannot differ."""
    page = (ROOT / "docs" / "start" / "install.md").read_text(encoding="utf-8")
    block = page[page.index("**Build this site**"):]
    line = re.search(r"```bash\n(.*?)\n```", block, re.S).group(1).strip()
    sphinx = line.split("&&")[-1].split()
    assert sphinx[:3] == [".venv/bin/python", "-m", "sphinx"] and sphinx[-2:] == ["docs", "docs/_build/html"], line
    assert "-W" in sphinx, "warnings must be errors"
    return [sys.executable, *sphinx[1:-1], str(out)]


@pytest.fixture(scope="module")
def site(tmp_path_factory, shared_data) -> Path:
    out = tmp_path_factory.mktemp("docs") / "html"
    env = {**os.environ, "TFORMER_DOCS_WORK": str(out.parent / "work"), "TFORMER_SHARED_DATA": str(shared_data)}
    start = time.perf_counter()
    r = subprocess.run(build_command(out), cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500)
    seconds = time.perf_counter() - start
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "build.log").write_text(r.stdout + r.stderr, encoding="utf-8")
    assert r.returncode == 0, f"docs build failed (log: {ARTIFACTS / 'build.log'}):\n{r.stderr[-6000:]}"
    (ARTIFACTS / "build_seconds.txt").write_text(f"{seconds:.0f}\n", encoding="utf-8")
    return out


@slow
def test_every_notebook_page_executed(site):
    report = json.loads((site / "_tformer" / "execution.json").read_text(encoding="utf-8"))
    assert len(TUTORIALS) == 8, TUTORIALS
    assert set(report) == EXECUTED
    for page, row in report.items():
        assert row["succeeded"] and row["method"] == "force" and row["seconds"] >= 0.5, (page, row)
    # the pages show what their cells printed and drew: outputs and figures are in the HTML
    for page in EXECUTED:
        html = (site / f"{page}.html").read_text(encoding="utf-8")
        assert html.count('class="cell_output') >= 1 or (page == "index" and "<img" in html), page  # the landing
        # page shows its cell's figure beside the example (glued), not below the cell
    figures = {p: (site / f"tutorials/{p}.html").read_text(encoding="utf-8").count("<img") for p in TUTORIALS}
    assert all(n >= 1 for n in figures.values()), figures


class _Links(HTMLParser):
    """Every id/name a page defines, every link it makes and every asset it loads."""

    ASSET_TAGS = {"script": "src", "img": "src", "iframe": "src", "source": "src", "video": "src", "audio": "src",
                  "embed": "src", "object": "data"}

    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.links: list[str] = []
        self.assets: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        for key in ("id", "name"):
            if a.get(key):
                self.ids.add(a[key])
        if tag == "a" and a.get("href"):
            self.links.append(a["href"])
        if tag == "link" and a.get("href"):
            self.assets.append(a["href"])  # stylesheets, icons, preloads: all loaded by the browser
        if tag in self.ASSET_TAGS and a.get(self.ASSET_TAGS[tag]):
            self.assets.append(a[self.ASSET_TAGS[tag]])
        if a.get("srcset"):
            self.assets += [part.split()[0] for part in a["srcset"].split(",")]


def parse_site(site: Path) -> dict[Path, _Links]:
    pages = {}
    for path in site.rglob("*.html"):
        parser = _Links()
        parser.feed(path.read_text(encoding="utf-8"))
        pages[path] = parser
    return pages


def external(url: str) -> bool:
    return bool(urlsplit(url).scheme in ("http", "https") or url.startswith("//"))


def outside_assets(site: Path) -> list:
    """Whatever the built site would load from the network: scripts, stylesheets, images, fonts, MathJax."""
    found = sorted({(p.relative_to(site).as_posix(), u) for p, links in parse_site(site).items()
                    for u in links.assets if external(u)})
    for css in site.rglob("*.css"):  # fonts and images that stylesheets pull in
        text = css.read_text(encoding="utf-8", errors="replace")
        urls = re.findall(r"url\(\s*['\"]?([^'\")]+)", text) + re.findall(r"@import\s+['\"]([^'\"]+)", text)
        found += [(css.relative_to(site).as_posix(), u) for u in urls if external(u)]
    for js in site.rglob("*.js"):  # no script fetches from a CDN (MathJax, fonts, analytics)
        text = js.read_text(encoding="utf-8", errors="replace")
        found += [(js.relative_to(site).as_posix(), m) for m in
                  re.findall(r"https?://(?:cdn|fonts\.|www\.googletagmanager|unpkg)[^\s'\"]*", text)]
    found += [(p.relative_to(site).as_posix(), "MathJax") for p in site.rglob("*mathjax*")]
    return found


def broken_links(site: Path) -> tuple[list, int]:
    """Internal links and assets whose file or anchor does not exist, and how many links were looked at."""
    pages = parse_site(site)
    broken, n = [], 0
    for page, links in pages.items():
        for url in links.links + links.assets:
            parts = urlsplit(url)
            if parts.scheme or url.startswith(("//", "mailto:", "javascript:", "data:")):
                continue
            n += 1
            target = (page.parent / unquote(parts.path)).resolve() if parts.path else page
            if target.is_dir():
                target = target / "index.html"
            if not target.is_file() or site.resolve() not in target.parents:
                broken.append((page.relative_to(site).as_posix(), url, "no such file"))
            elif parts.fragment and target.suffix == ".html" and unquote(parts.fragment) not in pages[target].ids:
                broken.append((page.relative_to(site).as_posix(), url, "no such anchor"))
    return broken, n


@slow
def test_no_asset_is_loaded_from_outside_the_site(site):
    found = outside_assets(site)
    assert not found, found[:20]


@slow
def test_every_internal_link_and_anchor_resolves(site):
    broken, n = broken_links(site)
    assert n > 1000, n  # the check looked at the whole site
    assert not broken, broken[:30]


@slow
def test_the_checks_catch_what_they_look_for(tmp_path):
    """The link and asset checks above find a broken anchor, a missing page and a CDN script, and nothing else."""
    (tmp_path / "a.html").write_text('<p id="x"></p><a href="b.html#y">b</a><a href="c.html">c</a>'
                                     '<a href="b.html#z">fine</a><a href="https://example.org">a link, fine</a>'
                                     '<script src="https://cdn.example.org/m.js"></script>', encoding="utf-8")
    (tmp_path / "b.html").write_text('<h1 id="z">b</h1><a href="a.html#x">a</a>', encoding="utf-8")
    assert outside_assets(tmp_path) == [("a.html", "https://cdn.example.org/m.js")]
    assert broken_links(tmp_path) == ([("a.html", "b.html#y", "no such anchor"), ("a.html", "c.html", "no such file")],
                                      4)


@pytest.fixture(scope="module")
def served(site):
    """The built site over loopback HTTP, as a reader's browser gets it."""
    import functools
    import http.server
    import threading

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


PHONE, DESKTOP = 390, 1280  # viewport widths: a phone's, a laptop's


@slow
@pytest.mark.parametrize("page, figures, width", [
    ("index", 1, DESKTOP), ("index", 1, PHONE), ("tutorials/04-message-passing", 3, DESKTOP),
    ("tutorials/04-message-passing", 3, PHONE), ("tutorials/05-universal", 2, DESKTOP),
    ("tutorials/07-seeing-inside", 4, PHONE), ("reference/api", 0, DESKTOP)])
def test_pages_in_a_real_browser(served, page, figures, width):
    """Chromium opens the page from the site (nothing else reachable: any request off the loopback server fails
    the test), every image decodes, the page has its figures, no code block scrolls sideways on a laptop, the
    landing page shows its example, figure, headline table and cards on the first screen, and a screenshot at
    each width is kept for people to look at."""
    from helpers.browser import BROWSER_ARGS, CHROMIUM, _browser

    sync_playwright = _browser()
    requests, errors = [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS)
        try:
            tab = browser.new_page(viewport={"width": width, "height": 900 if width == DESKTOP else 844})
            tab.on("request", lambda r: requests.append(r.url))
            tab.on("pageerror", lambda e: errors.append(str(e)))
            response = tab.goto(f"{served}/{page}.html", wait_until="load")
            assert response.status == 200
            images = tab.eval_on_selector_all("article img", "xs => xs.map(x => [x.currentSrc, x.complete, "
                                              "x.naturalWidth])")
            assert len(images) >= figures, images
            assert all(complete and width > 0 for _, complete, width in images), images
            assert tab.locator("article h1").count() == 1
            if page == "reference/api":  # the generated reference: every public name has its entry
                import tformer

                ids = set(tab.eval_on_selector_all("dt[id]", "xs => xs.map(x => x.id)"))
                missing = [n for n in tformer.__all__[1:] if f"tformer.{n}" not in ids and not n.endswith("Config")]
                assert not missing, missing
            ARTIFACTS.mkdir(parents=True, exist_ok=True)  # the screenshots first: people look at them when a
            shot = ARTIFACTS / f"{page.replace('/', '_')}_{width}.png"  # check below fails
            tab.screenshot(path=str(shot), full_page=False)  # the top of the page
            if images:  # and its first figure, as a reader scrolling to it sees it
                tab.locator("article img").first.scroll_into_view_if_needed()
                tab.screenshot(path=str(shot.with_name(f"{shot.stem}_figure.png")), full_page=False)
                tab.evaluate("window.scrollTo(0, 0)")
            if width == DESKTOP:  # code fits its column: no code (what a cell or a block shows as written, not
                # what a cell printed) is wider than the space it is shown in
                wide = tab.eval_on_selector_all("article pre", "xs => xs.filter(x => !x.closest('.cell_output') && "
                                                "x.scrollWidth > x.clientWidth + 1).map(x => x.textContent.slice(0, "
                                                "60))")
                assert not wide, wide
            if page == "index" and width == DESKTOP:  # the first screen: example, figure, headline table, cards
                tops = {what: tab.eval_on_selector(selector, "x => x.getBoundingClientRect().top") for what, selector
                        in (("example", "article pre"), ("figure", "article img"), ("table", "article table"),
                            ("cards", "article .sd-card"))}
                assert all(top < 900 for top in tops.values()), tops
        finally:
            browser.close()
    assert not errors, errors
    assert all(u.startswith(served) or u.startswith("data:") for u in requests), requests


@slow
def test_the_reference_is_generated_from_the_code(site):
    """Every config key, every command and every packaged recipe has its entry, as the code has them now."""
    import dataclasses

    from tformer import config
    from tformer.cli import COMMANDS, build_parser

    text = (site / "reference" / "config.html").read_text(encoding="utf-8")
    assert "(no comment in the source)" not in text  # every key says what it means
    for section, cls in (("model", config.ModelConfig), ("data", config.DataConfig), ("train", config.TrainConfig),
                         ("decode", config.DecodeConfig)):
        for f in dataclasses.fields(cls):
            assert f"<code class=\"docutils literal notranslate\"><span class=\"pre\">{section}.{f.name}</span>" \
                   in text, f"{section}.{f.name}"
    cli = (site / "reference" / "cli.html").read_text(encoding="utf-8")
    commands = build_parser()._subparsers._group_actions[0].choices
    assert len(commands) == len(COMMANDS)
    for name in commands:
        assert f'<section id="tformer-{name}"' in cli, name
    recipes = (site / "reference" / "recipes.html").read_text(encoding="utf-8")
    for recipe in (ROOT / "tformer" / "recipes").glob("*.yaml"):
        assert f'id="recipe-{recipe.stem}"' in recipes, recipe.stem


@slow
def test_a_build_without_the_corpus_says_where_to_get_it(tmp_path):
    """No Multi30k where the build looks: it stops before executing anything, naming the folder and the fix."""
    env = {**os.environ, "TFORMER_SHARED_DATA": str(tmp_path / "nowhere"), "TFORMER_DOCS_WORK": str(tmp_path / "w")}
    r = subprocess.run(build_command(tmp_path / "html"), cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode != 0
    assert f"{tmp_path / 'nowhere'}/multi30k" in r.stderr and "tformer data multi30k" in r.stderr
    assert "Traceback" not in r.stderr and "sphinx-doc/sphinx/issues" not in r.stderr, r.stderr  # one line
    assert not (tmp_path / "w" / "runs").exists() or not any((tmp_path / "w" / "runs").iterdir())


PAGE_WIDTH = 88  # the widest code line a page shows without scrolling sideways inside its box
FENCE = re.compile(r"^\s*(`{3,}|~{3,})(.*)$")


def code_lines(text: str):
    """(line number, line) of every line inside a fenced block of a MyST page: code cells, ```bash, ```python,
    diagrams and sample outputs in plain fences, directives. A fence closes on a line of at least as many of its
    marks and nothing after them."""
    fence = None
    for number, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line)
        if fence is None:
            fence = m.group(1) if m else None
        elif m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) and not m.group(2).strip():
            fence = None
        else:
            yield number, line


def test_code_in_the_docs_fits_the_page():
    """No line inside a code block of docs/**/*.md is wider than the page (no build: the Markdown as written;
    files included from outside docs/, such as benchmarks/RESULTS.md, are not the pages' own code)."""
    sample = "text " + "x" * 99 + "\n```{code-cell} ipython3\nshort\n" + "y" * 89 + "\n```\n" + "z" * 99 + "\n"
    assert list(code_lines(sample)) == [(3, "short"), (4, "y" * 89)]
    docs = ROOT / "docs"
    pages = sorted(p for p in docs.rglob("*.md") if "_build" not in p.relative_to(docs).parts)
    assert len(pages) > 30, pages
    wide = [f"{page.relative_to(ROOT)}:{number}: {len(line)} columns"
            for page in pages for number, line in code_lines(page.read_text(encoding="utf-8"))
            if len(line) > PAGE_WIDTH]
    assert not wide, f"{len(wide)} code lines wider than {PAGE_WIDTH} columns:\n" + "\n".join(wide)
