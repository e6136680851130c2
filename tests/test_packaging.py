"""pyproject.toml says what the code needs: every third-party module meshlm imports is declared (a dependency or an
extra), and requires-python admits no interpreter the code cannot run on (tomllib is in the standard library from
3.11)."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib

from helpers import ROOT

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _name(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[(]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _imported_top_level() -> set[str]:
    names = set()
    for path in (ROOT / "meshlm").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return {n for n in names if n != "meshlm" and n not in sys.stdlib_module_names}


def test_every_imported_package_is_declared():
    declared = {_name(r) for r in PYPROJECT["dependencies"]}
    declared |= {_name(r) for extra in PYPROJECT["optional-dependencies"].values() for r in extra}
    distributions = importlib.metadata.packages_distributions()
    missing = {}
    for module in sorted(_imported_top_level()):
        candidates = {d.lower().replace("_", "-") for d in distributions.get(module, [module])}
        if not candidates & declared:
            missing[module] = sorted(candidates)
    assert not missing, f"imported by meshlm but not declared in pyproject.toml: {missing}"


def test_requires_python_admits_only_interpreters_with_tomllib():
    assert any("import tomllib" in p.read_text() for p in (ROOT / "meshlm").rglob("*.py"))
    oldest = re.fullmatch(r">=\s*3\.(\d+)", PYPROJECT["requires-python"].split("#")[0].strip())
    assert oldest and int(oldest.group(1)) >= 11, PYPROJECT["requires-python"]
