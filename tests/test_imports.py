"""The package's shape, read from the source with `ast` (nothing is imported but tformer itself): no import
cycles; the sides that read the run folder (inference, import, export) stand on tformer.checkpoint and never
on training; no module over 500 lines.

Every `import` and `from ... import` counts, at module level or inside a function, relative ones resolved
against the module's package; those under `if TYPE_CHECKING:` never run and are skipped. `from p import y`
is an edge to `p.y` when that is a module, else to `p`. A module's edges to its own ancestor packages are
dropped: a submodule importing its parent while the parent's `__init__` imports the submodule is the normal
package pattern, not a cycle. An edge to any other package is kept, because its `__init__` really runs.
"""

import ast
from pathlib import Path

import tformer


def _module_names(package_dir: Path, package_name: str) -> dict[str, Path]:
    names = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = path.relative_to(package_dir).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join((package_name, *parts))] = path
    return names


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(node: ast.AST):
    """The import nodes under `node`, leaving out the bodies of `if TYPE_CHECKING:`."""
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        yield node
    children = node.orelse if isinstance(node, ast.If) and _is_type_checking(node.test) else ast.iter_child_nodes(node)
    for child in children:
        yield from _imports(child)


def import_graph(package_dir: Path, package_name: str) -> dict[str, set[str]]:
    """Each module of the package -> the modules of the package it imports (see the module docstring)."""
    modules = _module_names(package_dir, package_name)

    def known(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in _imports(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.Import):
                targets.update(known(alias.name) for alias in node.names)
                continue
            base = node.module or ""
            if node.level:
                prefix = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{prefix}.{base}" if base else prefix
            for alias in node.names:
                full = f"{base}.{alias.name}"
                targets.add(full if full in modules else known(base))
        graph[name] = {t for t in targets if t is not None and not name.startswith(t + ".")}
    return graph


def _strong_components(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm."""
    index, low, stack, on_stack, components = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return components


def _shortest_path(graph: dict[str, set[str]], within: set[str], start: str, goal) -> list[str]:
    """The shortest path (by edges inside `within`) from `start` to the first node where `goal` holds."""
    parents, frontier = {start: None}, [start]
    while frontier:
        following = []
        for v in frontier:
            for w in sorted(graph[v] & within):
                if goal(w):
                    path = [w, v]
                    while parents[path[-1]] is not None:
                        path.append(parents[path[-1]])
                    return path[::-1]
                if w not in parents:
                    parents[w] = v
                    following.append(w)
        frontier = following
    raise AssertionError(f"no path from {start} inside {sorted(within)}")


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One closed walk through every strongly connected component of more than one module, and each self-loop.

    A walk starts and ends on the component's first module and visits all of its members: `[a, b, a]`.
    """
    found = []
    for component in _strong_components(graph):
        members = set(component)
        if len(component) == 1 and component[0] not in graph.get(component[0], ()):
            continue
        walk, unseen = [component[0]], members - {component[0]}
        while unseen:
            walk += _shortest_path(graph, members, walk[-1], lambda w: w in unseen)[1:]
            unseen -= set(walk)
        walk += _shortest_path(graph, members, walk[-1], lambda w: w == component[0])[1:]
        found.append(walk)
    return found


def test_no_import_cycles_in_tformer():
    found = cycles(import_graph(Path(tformer.__file__).parent, "tformer"))
    assert not found, "import cycles in tformer:\n" + "\n".join(" -> ".join(c) for c in found)


def _package(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / "pkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root / "pkg"


def test_function_level_import_makes_a_cycle(tmp_path):
    pkg = _package(tmp_path, {"__init__.py": "", "a.py": "import os\n\ndef f():\n    import pkg.b\n",
                              "b.py": "from pkg.a import f\n"})
    assert import_graph(pkg, "pkg") == {"pkg": set(), "pkg.a": {"pkg.b"}, "pkg.b": {"pkg.a"}}
    assert cycles(import_graph(pkg, "pkg")) == [["pkg.a", "pkg.b", "pkg.a"]]


def test_type_checking_imports_are_skipped(tmp_path):
    pkg = _package(tmp_path, {"__init__.py": "", "b.py": "from pkg.a import f\n", "c.py": "",
                              "a.py": "import typing\nfrom typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
                                      "    import pkg.b\nif typing.TYPE_CHECKING:\n    from pkg import b\n"
                                      "else:\n    import pkg.c\n\ndef f():\n    pass\n"})
    assert import_graph(pkg, "pkg")["pkg.a"] == {"pkg.c"}
    assert cycles(import_graph(pkg, "pkg")) == []


def test_relative_imports_are_resolved(tmp_path):
    pkg = _package(tmp_path, {"__init__.py": "from . import a\n", "a.py": "from . import b\nfrom .sub import x\n",
                              "b.py": "", "sub/__init__.py": "from .c import y\nx = 1\n",
                              "sub/c.py": "from .. import b\nfrom ..a import z\ny = 2\n"})
    assert import_graph(pkg, "pkg") == {"pkg": {"pkg.a"}, "pkg.a": {"pkg.b", "pkg.sub"}, "pkg.b": set(),
                                        "pkg.sub": {"pkg.sub.c"}, "pkg.sub.c": {"pkg.a", "pkg.b"}}
    assert cycles(import_graph(pkg, "pkg")) == [["pkg.a", "pkg.sub", "pkg.sub.c", "pkg.a"]]


def test_importing_the_parent_package_is_no_cycle(tmp_path):
    pkg = _package(tmp_path, {"__init__.py": "from pkg.sub.a import f\n", "sub/__init__.py": "from .a import f\n",
                              "sub/a.py": "import pkg\nfrom pkg.sub import g\n\ndef f():\n    from pkg import sub\n"})
    assert import_graph(pkg, "pkg") == {"pkg": {"pkg.sub.a"}, "pkg.sub": {"pkg.sub.a"}, "pkg.sub.a": set()}
    assert cycles(import_graph(pkg, "pkg")) == []


def test_importing_another_package_whose_init_imports_back_is_a_cycle(tmp_path):
    pkg = _package(tmp_path, {"__init__.py": "", "a.py": "from pkg.sub import g\n",
                              "sub/__init__.py": "from pkg.sub.c import g\n", "sub/c.py": "import pkg.a\n"})
    assert cycles(import_graph(pkg, "pkg")) == [["pkg.a", "pkg.sub", "pkg.sub.c", "pkg.a"]]


def test_self_loops_and_components_are_reported_once(tmp_path):
    pkg = _package(tmp_path, {"__init__.py": "", "a.py": "import pkg.b\nimport pkg.c\n", "b.py": "import pkg.a\n",
                              "c.py": "import pkg.a\n", "d.py": "import pkg.d\nimport pkg.a\n"})
    assert cycles(import_graph(pkg, "pkg")) == [["pkg.a", "pkg.b", "pkg.a", "pkg.c", "pkg.a"], ["pkg.d", "pkg.d"]]


# ------------------------------------------------------------------------------------------ boundaries

# The modules that read (or write) the run folder without training a model: they stand on tformer.checkpoint,
# the format itself among them, and import nothing of tformer.training, not even inside a function.
TRAINING_FREE = ("tformer.checkpoint", "tformer.convert", "tformer.export", "tformer.api", "tformer.inference")


def _within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def imports_into(graph: dict[str, set[str]], sources: tuple[str, ...], target: str) -> list[str]:
    """'a imports b' for every module a of `sources` (packages with all their modules) whose edges reach into
    `target` (the module or package b, or one of its modules)."""
    return sorted(f"{m} imports {t}" for m, targets in graph.items() if _within(m, sources)
                  for t in targets if _within(t, (target,)))


def test_inference_import_and_export_never_import_training():
    found = imports_into(import_graph(Path(tformer.__file__).parent, "tformer"), TRAINING_FREE, "tformer.training")
    assert not found, ("the run-folder readers must stand on tformer.checkpoint, not on training (move what both "
                       "need below them):\n" + "\n".join(found))


def test_imports_into_finds_a_function_level_import_anywhere_in_a_package(tmp_path):
    pkg = _package(tmp_path, {"__init__.py": "", "training/__init__.py": "", "training/start.py": "",
                              "checkpoint.py": "", "training/loop.py": "from pkg import checkpoint\n",
                              "convert/__init__.py": "from pkg import checkpoint\n",
                              "convert/deep.py": "def f():\n    from ..training import start\n",
                              "api.py": "import pkg.training\n"})
    graph = import_graph(pkg, "pkg")
    assert imports_into(graph, ("pkg.convert", "pkg.api", "pkg.checkpoint"), "pkg.training") == [
        "pkg.api imports pkg.training", "pkg.convert.deep imports pkg.training.start"]
    assert imports_into(graph, ("pkg.training",), "pkg.convert") == []


# ------------------------------------------------------------------------------------------ size

MAX_LINES = 500  # a module longer than this wants splitting by responsibility (STYLE.md)

def long_modules(package_dir: Path, limit: int) -> dict[str, int]:
    """Each module of the package with more than `limit` lines (path from the package's parent, '/'-separated)
    -> its number of lines."""
    out = {}
    for path in sorted(package_dir.rglob("*.py")):
        n = len(path.read_text(encoding="utf-8").splitlines())
        if n > limit:
            out[path.relative_to(package_dir.parent).as_posix()] = n
    return out


def test_no_module_is_over_500_lines():
    found = long_modules(Path(tformer.__file__).parent, MAX_LINES)
    assert not found, (f"modules over {MAX_LINES} lines; split them where their responsibilities part (STYLE.md): "
                       + ", ".join(f"{p} ({n})" for p, n in found.items()))


def test_long_modules_counts_lines_in_subpackages(tmp_path):
    pkg = _package(tmp_path, {"__init__.py": "", "a.py": "x = 1\n" * 3, "sub/__init__.py": "",
                              "sub/b.py": "y = 2\n" * 4 + "z = 3"})
    assert long_modules(pkg, 3) == {"pkg/sub/b.py": 5}
    assert long_modules(pkg, 5) == {}
