"""Counts two measures of meshlm's import structure (issue 21): function-local imports of meshlm's own modules,
and pairs of meshlm packages (meshlm/<room>/) that import each other, at module level or inside functions.

    python scripts/import_graph.py [--list]

A function-local import is an ``import meshlm...`` / ``from meshlm... import`` (or a relative one) inside a
``def``; imports under ``if TYPE_CHECKING:`` are not counted anywhere (they never run). Top-level modules
(``meshlm/errors.py``, ``meshlm/fileio.py``, ``meshlm/plots.py``) count as their own rooms.
"""

from __future__ import annotations

import argparse
import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "meshlm"


def room_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imported_modules(node: ast.AST, here: str, is_package: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.startswith("meshlm")]
    if isinstance(node, ast.ImportFrom):
        if node.level:
            base = here.split(".") if is_package else here.split(".")[:-1]
            base = base[:len(base) - node.level + 1]
            name = ".".join(base + ([node.module] if node.module else []))
        else:
            name = node.module or ""
        return [name] if name.startswith("meshlm") else []
    return []


def is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def scan(path: Path) -> tuple[list[str], list[tuple[str, int]]]:
    """(every meshlm module imported at run time, [(module, line) of those imported inside a function])."""
    here, is_package = module_name(path), path.name == "__init__.py"
    try:
        tree = ast.parse(path.read_text(), str(path))
    except SyntaxError as exc:  # a file being edited: say so, count the rest
        print(f"skipped {path.relative_to(ROOT.parent)}: {exc.msg} (line {exc.lineno})")
        return [], []
    every: list[str] = []
    local: list[tuple[str, int]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and is_type_checking(child):
                for sub in child.orelse:
                    visit(sub, in_function)
                continue
            names = imported_modules(child, here, is_package)
            every.extend(names)
            if in_function:
                local.extend((n, child.lineno) for n in names)
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(tree, False)
    return every, local


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="also list the mutual pairs' imports")
    args = parser.parse_args()
    edges: dict[tuple[str, str], list[str]] = defaultdict(list)
    num_local = 0
    for path in sorted(ROOT.rglob("*.py")):
        here = module_name(path)
        every, local = scan(path)
        num_local += len(local)
        for name in every:
            a, b = room_of(here), room_of(name)
            if a != b:
                edges[(a, b)].append(f"{here} -> {name}")
    pairs = sorted({tuple(sorted(e)) for e in edges if (e[1], e[0]) in edges})
    print(f"function-local imports of meshlm modules: {num_local}")
    print(f"package pairs that import each other: {len(pairs)}")
    for a, b in pairs:
        print(f"  {a} <-> {b}")
        if args.list:
            for line in sorted(set(edges[(a, b)] + edges[(b, a)])):
                print(f"      {line}")


if __name__ == "__main__":
    main()
