"""The YAML recipes that ship with tformer (this folder), and how a `--config NAME` is found.

    find_recipe("copy")           a path as given, else ./configs/copy.yaml, else the packaged copy.yaml
    RECIPES                       the names of the packaged recipes
    summary("copy")               what a packaged recipe is for: the first sentence of its header comment

Each recipe starts with the command line that runs it. A folder `configs/` in the working directory (a
project's own recipes) is searched before the packaged ones, so a recipe copied there and edited wins.
"""

from __future__ import annotations

from pathlib import Path

from tformer.errors import ConfigError

HERE = Path(__file__).resolve().parent
RECIPES = tuple(sorted(p.stem for p in HERE.glob("*.yaml")))


def find_recipe(name: str | Path) -> Path:
    """A YAML file: `name` as a path if it exists, else NAME or NAME.yaml under ./configs, else the packaged
    recipe of that name. Raises ConfigError listing the packaged recipes."""
    path = Path(name)
    if path.is_file():
        return path
    for folder in (Path("configs"), HERE):
        for candidate in (folder / path, folder / f"{path}.yaml"):
            if candidate.is_file():
                return candidate
    stem = path.name.removesuffix(".yaml")
    hint = (f"; '{stem}' is a recipe that ships with tformer: --config {stem}" if stem in RECIPES and stem != str(name)
            else "")
    raise ConfigError(f"config file {name} does not exist{hint} (packaged recipes: {', '.join(RECIPES)}; or give "
                      "the path of a YAML file)")


def summary(name: str, width: int = 96) -> str:
    """The first sentence of a packaged recipe's header comment (at most `width` characters), leaving out the
    lines that are commands."""
    import re

    words: list[str] = []
    for line in (HERE / f"{name}.yaml").read_text(encoding="utf-8").splitlines():
        text = line.lstrip("# ").strip()
        if not line.startswith("#") or (words and (not text or text.startswith("tformer "))):
            break
        if text and not text.startswith(("tformer ", "(")):
            words.append(text)
    text = re.sub(r"(?<=\w)- (?=\w)", "-", " ".join(words))  # a word cut at a line's end, joined again
    first = re.split(r"(?<!\bal)\.\s+(?=[A-Z])", text, maxsplit=1)[0].rstrip(".:")
    if len(first) > width:
        first = first[: first.rfind(" ", 0, width - 3)].rstrip(",;:(") + " ..."
    return first + "." if first and not first.endswith("...") else first
