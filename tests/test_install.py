"""A real install, as a new user makes one: build the wheel from a copy of the checkout, install it (not
editable) into a fresh virtual environment without network, and run `tformer` from a folder outside the
checkout. This is what an editable install cannot show: that the wheel holds everything the commands need
(the YAML recipes, the explorer page), so `tformer demo` and `--config copy` work from anywhere.

The fresh environment has no pip and downloads nothing: the wheel goes in with the test environment's pip
(`pip --python`), and the dependencies (torch, numpy, sentencepiece, ...) are the test environment's, made
visible by a .pth file (see `share_dependencies`).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import site
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.slow  # integration runs of whole commands: `pytest -m "not slow"` skips them

ROOT = Path(__file__).resolve().parents[1]
SKIP_AT_ROOT = {".git", ".venv", "runs", "build", "dist", "test-artifacts", ".hypothesis", ".pytest_cache"}
SKIP_ANYWHERE = ("__pycache__", "*.egg-info", "*.pyc")
# The demo, made a few seconds long: a small model, a small copy task of short sequences, 30 updates.
QUICK = ["train.max_steps=30", "data.train_size=200", "data.valid_size=20", "data.test_size=20",
         "data.symbols=6", "data.length_mean=5", "data.max_len=8", "train.eval_every=10", "model.d_model=32",
         "model.d_ff=64", "train.attention_examples=0", "train.threads=1", "train.max_hours=0"]


def version_of(dist: str) -> tuple[int, int] | None:
    try:
        found = re.match(r"(\d+)\.(\d+)", metadata.version(dist))
    except metadata.PackageNotFoundError:
        return None
    return (int(found[1]), int(found[2])) if found else None


def need_build_tools() -> None:
    """The wheel is built without build isolation (no download of setuptools), which needs setuptools with
    bdist_wheel built in (70.1); `pip --python` needs pip 22.3. Both come with the test extra."""
    setuptools, pip = version_of("setuptools"), version_of("pip")
    if setuptools is None or setuptools < (70, 1):
        pytest.skip(f"setuptools >= 70.1 is needed to build the wheel offline (found {setuptools}): "
                    "pip install 'setuptools>=70.1' (in the test extra)")
    if pip is None or pip < (22, 3):
        pytest.skip(f"pip >= 22.3 (--python) is needed to install into a venv without pip (found {pip})")


def user_env(tmp: Path) -> dict[str, str]:
    """The environment of a new user's shell: nothing pointing into the checkout, no pip prompts, a cache of
    its own."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}
    return {**env, "PIP_NO_INPUT": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1", "TFORMER_CACHE": str(tmp / "cache"),
            "MPLCONFIGDIR": str(tmp / "mpl")}


def run(cmd: list, cwd: Path, env: dict[str, str], what: str, timeout: int = 180,
        stdin: str | None = None) -> subprocess.CompletedProcess:
    """Runs `cmd`; fails the test, with the command, its exit status, stdout and stderr, unless it exits 0."""
    cmd = [str(c) for c in cmd]
    try:
        r = subprocess.run(cmd, cwd=cwd, env=env, input=stdin, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{what}: no answer after {timeout}s\n$ {shlex.join(cmd)}\n--- stdout\n{e.stdout}\n"
                    f"--- stderr\n{e.stderr}", pytrace=False)
    if r.returncode != 0:
        pytest.fail(f"{what} failed (exit {r.returncode})\n$ {shlex.join(cmd)}  (in {cwd})\n"
                    f"--- stdout\n{r.stdout[-6000:]}\n--- stderr\n{r.stderr[-6000:]}", pytrace=False)
    return r


def copy_checkout(dest: Path) -> Path:
    """The working tree as a user would download it: sources, tracked or new, without environments, runs,
    build outputs and caches (so the build never writes into the checkout others work in)."""
    def ignore(folder: str, names: list[str]) -> set[str]:
        skipped = set(shutil.ignore_patterns(*SKIP_ANYWHERE)(folder, names))
        return skipped | (SKIP_AT_ROOT & set(names) if Path(folder) == ROOT else set())

    shutil.copytree(ROOT, dest, ignore=ignore, symlinks=True)
    return dest


def share_dependencies(venv_site: Path) -> None:
    """Makes the test environment's site-packages (torch, numpy, ...) importable in the new venv, offline.

    A path line in a .pth file appends that folder to sys.path and nothing more: site.py processes the .pth
    files of site-packages folders it scans (the venv's own), not those of a folder a path line names. The
    test environment's editable tformer is exactly such a .pth file (`__editable__.tformer-*.pth`, which
    imports and installs a finder pointing into the checkout), so it stays inert: the venv's `import tformer`
    finds the installed wheel, in the venv's own site-packages, which also comes first on sys.path.
    test_wheel_installs_and_runs_outside_the_checkout asserts this (tformer.__file__ lies inside the venv).
    """
    outer = [p for p in site.getsitepackages() if Path(p).is_dir()]
    (venv_site / "_test_environment_dependencies.pth").write_text("".join(p + "\n" for p in outer))


def test_wheel_installs_and_runs_outside_the_checkout(tmp_path):
    need_build_tools()
    env = user_env(tmp_path)

    # 1. build the wheel from a copy of the checkout, with this interpreter, offline
    src = copy_checkout(tmp_path / "checkout")
    wheels = tmp_path / "wheels"
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", wheels,
         src], tmp_path, env, "building the wheel")
    built = sorted(wheels.glob("tformer-*.whl"))
    assert len(built) == 1, f"expected one tformer wheel in {wheels}, found {[p.name for p in wheels.iterdir()]}"
    wheel = built[0]
    version = wheel.name.split("-")[1]

    # 2. the wheel holds the package data the commands read, and only the package
    names = set(zipfile.ZipFile(wheel).namelist())
    recipes = sorted(p.stem for p in (src / "tformer" / "recipes").glob("*.yaml"))
    assert "copy" in recipes, recipes
    needed = {f"tformer/recipes/{r}.yaml" for r in recipes} | {"tformer/recipes/__init__.py",
                                                               "tformer/web/explorer.html"}
    assert not needed - names, (f"{wheel.name} lacks {sorted(needed - names)}: see "
                                "[tool.setuptools.package-data] in pyproject.toml")
    outside = sorted(n for n in names if not n.startswith(("tformer/", f"tformer-{version}.dist-info/")))
    assert not outside, f"{wheel.name} holds files outside the package: {outside}"

    # 3. a fresh venv without pip; the wheel goes in with this environment's pip, from the file only
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", venv], tmp_path, env, "creating the venv", timeout=120)
    python = venv / "bin" / "python"
    run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", wheel], tmp_path,
        env, "installing the wheel")
    venv_site = Path(run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], tmp_path, env,
                         "asking the venv for its site-packages").stdout.strip())
    share_dependencies(venv_site)

    # 4. from a folder outside the checkout: the library is the installed one, with its recipes
    work = tmp_path / "elsewhere"
    work.mkdir()
    r = run([python, "-c", "import tformer\nfrom tformer.recipes import RECIPES\n"
             "print(tformer.__file__)\nprint(tformer.__version__)\nprint(' '.join(RECIPES))"],
            work, env, "importing the installed tformer")
    where, got_version, got_recipes = r.stdout.splitlines()[-3:]
    assert Path(where).resolve().is_relative_to(venv_site.resolve()), (
        f"tformer was imported from {where}, not from the venv's {venv_site}: the test environment's editable "
        f"install leaks into the venv\n--- stderr\n{r.stderr}")
    assert got_version == version, f"tformer.__version__ is {got_version}, the wheel is {wheel.name}"
    assert got_recipes.split() == recipes, f"installed recipes: {got_recipes}; the checkout's: {recipes}"

    # 5. `--config copy` is the packaged recipe: every key it sets is what --print-config shows
    tformer = venv / "bin" / "tformer"
    r = run([tformer, "train", "--config", "copy", "--print-config"], work, env, "tformer train --print-config")
    shown = yaml.safe_load(r.stdout)
    recipe = yaml.safe_load((src / "tformer" / "recipes" / "copy.yaml").read_text())
    assert shown["data"]["task"] == "copy", r.stdout
    for section, values in recipe.items():
        for key, value in values.items():
            assert shown[section][key] == value, f"{section}.{key}: printed {shown[section][key]!r}, recipe {value!r}"

    # 6. the demo trains, evaluates on test and shows examples, into the run folder given
    demo = tmp_path / "demo-run"
    r = run([tformer, "demo", "--run-dir", demo, "--no-progress", *QUICK], work, env, "tformer demo", timeout=300)
    assert re.search(r"exact match\D*\d", r.stdout), f"no test exact match in the demo's output:\n{r.stdout}"
    assert re.search(r"test_uniform .*every length 1-8 alike\): exact match \d", r.stdout), r.stdout
    assert "->" in r.stdout, f"no decoded examples in the demo's output:\n{r.stdout}"
    assert (demo / "checkpoints" / "latest").is_file(), f"{demo} holds {sorted(p.name for p in demo.rglob('*'))}"
    assert not list(work.iterdir()), f"the demo wrote into its working folder: {list(work.iterdir())}"

    # 7. the Python API of the installed package on the demo's run, from the same outside folder: one
    # translation per input, the same as the installed command line writes
    code = (f"import tformer\nt = tformer.load({str(demo)!r}, device='cpu')\n"
            "print(tformer.api.__file__)\nfor x in t.translate(['a b c', 'f e d']): print(x.text)")
    r = run([python, "-c", code], work, env, "tformer.load(...).translate(...)")
    api_file, *texts = r.stdout.splitlines()
    assert Path(api_file).resolve().is_relative_to(venv_site.resolve()), api_file
    cli = run([tformer, "translate", "--checkpoint", demo], work, env, "tformer translate", stdin="a b c\nf e d\n")
    assert texts == cli.stdout.splitlines() and len(texts) == 2, (texts, cli.stdout)
