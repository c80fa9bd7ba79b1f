"""tformer recipes: the YAML recipes that ship with tformer, each with what it is for; or one of them, whole."""

from __future__ import annotations

import argparse


def add_parser(sub) -> None:
    sp = sub.add_parser("recipes", help="list the packaged recipes (--config NAME), or print one",
                        description="Without NAME: every packaged recipe with what it is for. With NAME: the recipe "
                        "itself (its header says the command that runs it); copy it to ./configs/NAME.yaml to edit "
                        "it, since --config looks there first.")
    sp.add_argument("name", nargs="?", metavar="NAME", help="a recipe to print")
    sp.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tformer.recipes import HERE, RECIPES, find_recipe, summary

    if args.name:
        print(find_recipe(args.name).read_text(encoding="utf-8"), end="")
        return 0
    width = max(map(len, RECIPES))
    for name in RECIPES:
        print(f"{name:<{width}}  {summary(name)}")
    print(f"\n{len(RECIPES)} recipes in {HERE}; run one with: tformer train --config NAME --run-dir runs/NAME "
          "(a first model: tformer data multi30k --out data/multi30k, then multi30k_quick with data.dir=data/multi30k)")
    return 0
