"""The house's size and shape rules, read from the source with ``ast`` (no import runs):

- a module holds at most ``MODULE_LINES`` lines, a function at most ``FUNCTION_LINES``;
- no import circle between the project's modules (lazy imports inside functions count: a
  circle is one whichever line it starts from);
- no two modules of ``UNIQUE_NAMES``' packages share a file name (``__init__`` aside), so a
  module's name says which one it is;
- no module outside the engine package (``core.engine``, where lakecdc chooses its storage
  engine once) imports both storage engines (``deltalake``, and ``pyspark`` or ``delta``);
- outside it, only the listed places choose by the engine they are handed, each once
  (``WRITER_KIND``: a stage's own faster path on delta-rs, or the SQL engine's choice).

What breaks a rule today is listed below, with its size now: the lists only shrink. A
listed module or function that grows fails, and so does one that shrank (list it at its new
size) or no longer breaks the rule (take it off the list), so the house cannot get worse
while it gets better.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("core", "bronze", "silver", "gold", "pipelines", "infra", "bench")
MODULE_LINES = 500
FUNCTION_LINES = 80
ENGINES = ({"deltalake"}, {"pyspark", "delta"})
UNIQUE_NAMES = ("core", "bronze", "silver", "gold", "pipelines")

# Today's exceptions: name -> lines now.
LONG_MODULES: dict[str, int] = {}
LONG_FUNCTIONS: dict[str, int] = {}
CIRCLES: list[set[str]] = []
ENGINE_PACKAGE = "core.engine"
BOTH_ENGINES: set[str] = set()
# A choice by engine: an isinstance test, its name compared, or the writer setting read.
CHOICE = re.compile(r'isinstance\([^()]*,\s*\(?(DeltaRs|SparkDelta)\b'
                    r'|\bname\s*[!=]=\s*"(delta-rs|spark)"|\bspark_writes\b')
WRITER_KIND = {
    "bronze.spark_table": 1,               # bronze's pre-written data files (delta-rs)
    "silver.writer": 1,                    # a batch read from bronze's local files
    "silver.mirrors.store": 1,             # the mirrors' tail (delta-rs handles)
    "gold.view": 1,                        # a push read from one pinned delta-rs handle
    "pipelines.source.mirror_baseline": 1,  # a baseline streamed chunk by chunk
    "pipelines.observe.query_rs": 1,       # DataFusion answers SQL only on delta-rs
    "pipelines.run.pipeline": 1,           # gold takes the shipper's steps: appends of ms
}


class House:
    """The project's modules (dotted name -> parsed source) and what they import."""

    def __init__(self, root: Path = ROOT) -> None:
        self.sources: dict[str, str] = {}
        self.packages: set[str] = set()
        for package in PACKAGES:
            for path in sorted((root / package).rglob("*.py")):
                parts = list(path.relative_to(root).with_suffix("").parts)
                if parts[-1] == "__init__":
                    parts.pop()
                    self.packages.add(".".join(parts))
                self.sources[".".join(parts)] = path.read_text()
        self.trees = {name: ast.parse(text) for name, text in self.sources.items()}

    def lines(self, module: str) -> int:
        return self.sources[module].count("\n")

    def functions(self, module: str):
        """(qualified name, lines) of every function and method of ``module``."""
        def walk(node, prefix):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    name = f"{prefix}.{child.name}"
                    yield name, child.end_lineno - child.lineno + 1
                    yield from walk(child, name)
                elif isinstance(child, ast.ClassDef):
                    yield from walk(child, f"{prefix}.{child.name}")
        yield from walk(self.trees[module], module)

    def same_names(self) -> dict[str, list[str]]:
        """File name -> the modules of ``UNIQUE_NAMES``' packages that share it (two or
        more; a package's ``__init__`` is not a module here)."""
        by_name: dict[str, list[str]] = {}
        for module in sorted(self.sources):
            if module not in self.packages and module.split(".")[0] in UNIQUE_NAMES:
                by_name.setdefault(module.rpartition(".")[2], []).append(module)
        return {name: found for name, found in by_name.items() if len(found) > 1}

    def _project(self, name: str) -> str | None:
        """The project module ``name`` is, or is inside (None: not the project's)."""
        while name and name not in self.sources:
            name = name.rpartition(".")[0]
        return name or None

    def imports(self, module: str) -> tuple[set[str], set[str]]:
        """(the project's modules ``module`` imports, the top-level names it imports)."""
        ours, top = set(), set()
        is_package = module in self.packages
        for node in ast.walk(self.trees[module]):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = module.split(".")[:len(module.split(".")) - node.level
                                               + (1 if is_package else 0)]
                    base = ".".join([*parent, *([base] if base else [])])
                # ``from package import module``: that module, not the package's __init__
                names = [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            for name in names:
                top.add(name.split(".")[0])
                found = self._project(name)
                if found and found != module:
                    ours.add(found)
        return ours, top

    def circles(self) -> list[set[str]]:
        """The import circles: strongly connected sets of two modules or more (Tarjan)."""
        graph = {m: self.imports(m)[0] for m in self.sources}
        index: dict[str, int] = {}
        low: dict[str, int] = {}
        stack: list[str] = []
        found: list[set[str]] = []

        def visit(v: str) -> None:
            index[v] = low[v] = len(index)
            stack.append(v)
            for w in graph[v]:
                if w not in index:
                    visit(w)
                    low[v] = min(low[v], low[w])
                elif w in stack:
                    low[v] = min(low[v], index[w])
            if low[v] == index[v]:
                circle = set()
                while True:
                    w = stack.pop()
                    circle.add(w)
                    if w == v:
                        break
                if len(circle) > 1:
                    found.append(circle)

        for v in graph:
            if v not in index:
                visit(v)
        return found


@pytest.fixture(scope="module")
def house() -> House:
    return House()


def _over(measured: dict[str, int], limit: int, listed: dict[str, int]) -> list[str]:
    """What breaks the rule beyond the list, and the list's entries that moved."""
    wrong = [f"{name}: {n} lines (at most {limit})" for name, n in measured.items()
             if n > limit and n > listed.get(name, limit)]
    wrong += [f"{name}: {measured.get(name, 0)} lines now, listed at {n}: take it off the "
              f"list" for name, n in listed.items() if measured.get(name, 0) <= limit]
    wrong += [f"{name}: {measured[name]} lines now, listed at {n}: list it at "
              f"{measured[name]}" for name, n in listed.items()
              if limit < measured.get(name, 0) < n]
    return wrong


def test_no_module_is_longer_than_500_lines(house):
    assert _over({m: house.lines(m) for m in house.sources}, MODULE_LINES, LONG_MODULES) == []


def test_no_function_is_longer_than_80_lines(house):
    measured = dict(f for m in house.sources for f in house.functions(m))
    assert _over(measured, FUNCTION_LINES, LONG_FUNCTIONS) == []


def test_no_import_circle(house):
    circles = house.circles()
    assert [c for c in circles if c not in CIRCLES] == []
    assert [c for c in CIRCLES if c not in circles] == []       # gone: take it off the list


def test_no_module_imports_both_engines(house):
    both = {m for m in house.sources
            if all(engine & house.imports(m)[1] for engine in ENGINES)
            and not m.startswith(ENGINE_PACKAGE + ".")}
    assert both - BOTH_ENGINES == set()
    assert BOTH_ENGINES - both == set()                          # gone: take it off the list


def test_module_names_are_unique(house):
    assert house.same_names() == {}


def test_only_the_listed_places_choose_by_engine(house):
    found = {m: len(CHOICE.findall(text)) for m, text in house.sources.items()
             if not m.startswith(ENGINE_PACKAGE + ".") and m != "core.config"}
    assert {m: n for m, n in found.items() if n} == WRITER_KIND
    assert sum(WRITER_KIND.values()) <= 10
    assert CHOICE.search("if engine.name == \"spark\":") and CHOICE.search(
        "isinstance(e, DeltaRs)") and CHOICE.search("config.spark_writes")


def test_each_rule_catches_what_breaks_it(tmp_path):
    """Negative controls: a long module, a long function, a circle, both engines in one
    module and two modules of one name, in a house of their own."""
    (tmp_path / "core").mkdir()
    (tmp_path / "core" / "__init__.py").write_text("")
    body = "\n".join(f"    x{i} = {i}" for i in range(FUNCTION_LINES))
    (tmp_path / "core" / "a.py").write_text(
        "import deltalake\nfrom core import b\n\n\ndef long():\n" + body + "\n"
        + "\n" * MODULE_LINES)
    (tmp_path / "core" / "b.py").write_text("def f():\n    from core.a import long\n")
    (tmp_path / "core" / "c.py").write_text("import deltalake\n\n\ndef f():\n"
                                            "    from pyspark.sql import Row\n")
    for package in PACKAGES[1:]:
        (tmp_path / package).mkdir()
    (tmp_path / "gold" / "__init__.py").write_text("")
    (tmp_path / "gold" / "a.py").write_text("")              # named as core.a
    (tmp_path / "bench" / "b.py").write_text("")             # bench's names are its own
    small = House(tmp_path)
    assert small.lines("core.a") > MODULE_LINES
    assert dict(small.functions("core.a"))["core.a.long"] > FUNCTION_LINES
    assert small.circles() == [{"core.a", "core.b"}]
    assert [m for m in small.sources
            if all(engine & small.imports(m)[1] for engine in ENGINES)] == ["core.c"]
    assert small.same_names() == {"a": ["core.a", "gold.a"]}


def test_the_lists_only_shrink():
    listed = {"a": 600}
    assert _over({"a": 600, "b": 10}, 500, listed) == []
    assert _over({"a": 601}, 500, listed) == ["a: 601 lines (at most 500)"]
    assert _over({"a": 590}, 500, listed) == ["a: 590 lines now, listed at 600: list it at 590"]
    assert _over({"a": 400}, 500, listed) == [
        "a: 400 lines now, listed at 600: take it off the list"]
    assert _over({"c": 501}, 500, listed) == ["c: 501 lines (at most 500)",
                                              "a: 0 lines now, listed at 600: take it off the "
                                              "list"]


def test_the_wheel_takes_every_package():
    """The bundle's wheel holds what ``[tool.setuptools.packages.find]`` includes: a
    sub-package left out imports on this machine (the tests run from the repository) and
    fails on a cluster."""
    import tomllib

    from setuptools import find_packages

    found = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "packages"]["find"]
    shipped = set(find_packages(str(ROOT), include=found["include"]))
    wanted = {".".join(p.relative_to(ROOT).parent.parts)
              for package in ("core", "bronze", "silver", "gold", "pipelines", "infra")
              for p in (ROOT / package).rglob("__init__.py")}
    assert wanted - shipped == set()
