"""The import graph keeps the layers one-way, has no cycles, and only clock.py reads the system clock.

A small reader over `ast` (no import runs): every `import` and `from ... import` in
`feedlog/` and `server/` (installed as `feedlog_server`) counts, at module level, inside
functions (lazy imports) and under `if TYPE_CHECKING`, since each one ties two modules
together whether or not it runs at import time. Three rules:

- layers, bottom to top: the foundation (`errors`, `clock`, `extras`, `failpoints`, `pb`, `rpc`, `version`) <
  `log` < `replication` | `delta` (side by side: neither imports the other) < `lake` <
  the server package < `console` < `cli` < `feedlog/__init__.py` and `feedlog/__main__.py`.
  A module imports its own component or a lower layer, never a higher or sideways one;
  every module belongs to a layer (a new top-level module must be placed here).
- no cycles between modules. An import names the module it reads: `from .x import y` is an
  edge to `.x` (or to `.x.y` if that is a submodule), never to the packages above it, so a
  package `__init__` that re-exports its submodules is not a cycle by itself, while a
  submodule that imports its own package (`from . import z` where `z` is not a submodule)
  depends on that `__init__`, which is.
- the clock rule (SlateDB's): `time.time`, `time.time_ns`, `datetime.datetime.now`,
  `.utcnow`, `.today` and `datetime.date.today` appear only in `feedlog/clock.py`;
  everything else is handed a `feedlog.clock.Clock`. (ruff's banned-api list enforces the
  same rule while editing; this test keeps it true in the suite.)

Each failure names the file, the line and the rule.
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: (import name, directory): the server package lives in server/ and installs as feedlog_server
PACKAGES = (("feedlog", ROOT / "feedlog"), ("feedlog_server", ROOT / "server"))

#: bottom to top; each layer maps a component's name to the module prefixes it holds.
#: Components of one layer are independent of each other.
LAYERS: tuple[Mapping[str, tuple[str, ...]], ...] = (
    {
        "foundation": (
            "feedlog.errors",
            "feedlog.clock",
            "feedlog.extras",
            "feedlog.failpoints",
            "feedlog.leave",
            "feedlog.metrics",
            "feedlog.pb",
            "feedlog.rpc",
            "feedlog.version",
        )
    },
    {"log": ("feedlog.log",)},
    {"replication": ("feedlog.replication",), "delta": ("feedlog.delta",)},
    {"lake": ("feedlog.lake",)},
    {"server": ("feedlog_server",)},
    {"console": ("feedlog.console",)},
    {"cli": ("feedlog.cli",)},
    {"top": ("feedlog.__main__", "feedlog")},
)
#: prefixes that name one module, not its submodules: `feedlog` is the package's own __init__
#: (its submodules are placed by their own prefixes above)
EXACT = frozenset({"feedlog"})

CLOCK_MODULE = "feedlog.clock"
#: what reads the system's wall clock (monotonic and performance counters are not wall time)
CLOCK_READS = frozenset(
    {
        "time.time",
        "time.time_ns",
        "datetime.datetime.now",
        "datetime.datetime.utcnow",
        "datetime.datetime.today",
        "datetime.date.today",
    }
)


@dataclass(frozen=True)
class Module:
    name: str
    path: Path
    is_package: bool  # an __init__.py

    @property
    def package(self) -> str:
        """The package relative imports start from."""
        return self.name if self.is_package else self.name.rpartition(".")[0]


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    path: Path
    line: int
    how: str  # "module level", "lazy" (inside a function) or "TYPE_CHECKING"

    def where(self) -> str:
        return f"{self.path.relative_to(ROOT) if self.path.is_relative_to(ROOT) else self.path}:{self.line}"


@dataclass(frozen=True)
class Violation:
    path: Path
    line: int
    rule: str
    detail: str

    def __str__(self) -> str:
        where = self.path.relative_to(ROOT) if self.path.is_relative_to(ROOT) else self.path
        return f"{where}:{self.line}: [{self.rule}] {self.detail}"


def discover(packages: Iterable[tuple[str, Path]] = PACKAGES) -> dict[str, Module]:
    modules = {}
    for top, directory in packages:
        for path in sorted(directory.rglob("*.py")):
            parts = list(path.relative_to(directory).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts.pop()
            name = ".".join([top, *parts])
            modules[name] = Module(name, path, is_package)
    return modules


def _resolve(name: str, modules: Mapping[str, Module]) -> str | None:
    """The longest known module `name` starts with (an import of a missing submodule names its package)."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


class _Reader(ast.NodeVisitor):
    """Collects the imports of one module (with where they sit) and its wall-clock reads."""

    def __init__(self, module: Module, modules: Mapping[str, Module]) -> None:
        self.module = module
        self.modules = modules
        self.edges: list[Edge] = []
        self.clock_reads: list[tuple[int, str]] = []
        self._aliases: dict[str, str] = {}  # local name -> dotted name it stands for
        self._depth = 0  # inside a function
        self._type_checking = 0

    def _how(self) -> str:
        if self._type_checking:
            return "TYPE_CHECKING"
        return "lazy" if self._depth else "module level"

    def _edge(self, target: str | None, line: int) -> None:
        # one edge per statement and target: `from .x import a, b` is one import of .x
        if target is not None and not any(e.target == target and e.line == line for e in self.edges[-8:]):
            self.edges.append(Edge(self.module.name, target, self.module.path, line, self._how()))

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> None:
        self._depth += 1
        self.generic_visit(node)
        self._depth -= 1

    visit_AsyncFunctionDef = visit_FunctionDef
    visit_Lambda = visit_FunctionDef

    def visit_If(self, node: ast.If) -> None:
        test = node.test
        guarded = (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
            isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
        )
        self.visit(node.test)
        if guarded:
            self._type_checking += 1
        for child in node.body:
            self.visit(child)
        if guarded:
            self._type_checking -= 1
        for child in node.orelse:
            self.visit(child)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._edge(_resolve(alias.name, self.modules), node.lineno)
            if alias.asname:
                self._aliases[alias.asname] = alias.name
            else:
                top = alias.name.partition(".")[0]
                self._aliases[top] = top
            self._check_clock(alias.name, node.lineno)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            base = self.module.package
            for _ in range(node.level - 1):
                base = base.rpartition(".")[0]
            base = f"{base}.{node.module}" if node.module else base
        else:
            base = node.module or ""
        for alias in node.names:
            full = f"{base}.{alias.name}"
            # `from pkg import sub` reads the submodule; `from pkg import name` reads pkg itself
            self._edge(full if full in self.modules else _resolve(base, self.modules), node.lineno)
            if alias.name != "*":
                self._aliases[alias.asname or alias.name] = full
            self._check_clock(full, node.lineno)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        dotted = self._dotted(node)
        if dotted is not None:
            self._check_clock(dotted, node.lineno)
            return  # the inner names of a chain are not reads of their own
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        full = self._aliases.get(node.id)
        if full is not None and full in CLOCK_READS:
            self._check_clock(full, node.lineno)

    def _dotted(self, node: ast.expr) -> str | None:
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name) or node.id not in self._aliases:
            return None
        return ".".join([self._aliases[node.id], *reversed(parts)])

    def _check_clock(self, dotted: str, line: int) -> None:
        if dotted in CLOCK_READS:
            self.clock_reads.append((line, dotted))


@dataclass
class Graph:
    modules: dict[str, Module]
    edges: list[Edge]
    clock_reads: list[tuple[Module, int, str]]


def read_graph(modules: dict[str, Module]) -> Graph:
    edges: list[Edge] = []
    clock_reads: list[tuple[Module, int, str]] = []
    for module in modules.values():
        reader = _Reader(module, modules)
        reader.visit(ast.parse(module.path.read_bytes(), str(module.path)))
        edges += reader.edges
        clock_reads += [(module, line, what) for line, what in reader.clock_reads]
    return Graph(modules, edges, clock_reads)


def component_of(module: str) -> tuple[int, str] | None:
    """(layer index, component) of a module: the longest prefix that names it wins."""
    best: tuple[int, int, str] | None = None
    for index, layer in enumerate(LAYERS):
        for component, prefixes in layer.items():
            for prefix in prefixes:
                names_it = module == prefix or (prefix not in EXACT and module.startswith(prefix + "."))
                if names_it and (best is None or len(prefix) > best[0]):
                    best = (len(prefix), index, component)
    return None if best is None else (best[1], best[2])


def layer_violations(graph: Graph) -> list[Violation]:
    out = []
    for name, module in sorted(graph.modules.items()):
        if component_of(name) is None:
            out.append(Violation(module.path, 1, "layers", f"{name} belongs to no layer: place it in LAYERS"))
    for e in graph.edges:
        src, dst = component_of(e.source), component_of(e.target)
        if src is None or dst is None or src[1] == dst[1] or dst[0] < src[0]:
            continue
        direction = "sideways" if dst[0] == src[0] else "upward"
        out.append(
            Violation(
                e.path,
                e.line,
                "layers",
                f"{direction} import ({e.how}): {e.source} ({src[1]}) imports {e.target} ({dst[1]})",
            )
        )
    return out


def _strongly_connected(nodes: Iterable[str], succ: Mapping[str, list[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative (no recursion limit to meet)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out = []
    for root in nodes:
        if root in index:
            continue
        work = [(root, iter(succ.get(root, ())))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(succ.get(child, ()))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    scc = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        scc.append(member)
                        if member == node:
                            break
                    out.append(sorted(scc))
    return out


def _shortest_cycle(start: str, members: set[str], succ: Mapping[str, list[str]]) -> list[str]:
    """The shortest path start -> ... -> start inside one strongly connected component."""
    parent: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for node in frontier:
            for child in succ.get(node, ()):
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(parent[path[-1]])
                    return [*reversed(path), start]
                if child in members and child not in parent:
                    parent[child] = node
                    nxt.append(child)
        frontier = nxt
    raise AssertionError(f"{start} is on no cycle")


def cycle_violations(graph: Graph) -> list[Violation]:
    first: dict[tuple[str, str], Edge] = {}
    for e in sorted(graph.edges, key=lambda e: (e.how != "module level", e.line)):
        if e.source != e.target:
            first.setdefault((e.source, e.target), e)
    succ: dict[str, list[str]] = {}
    for source, target in sorted(first):
        succ.setdefault(source, []).append(target)
    out = []
    for scc in _strongly_connected(sorted(graph.modules), succ):
        if len(scc) < 2:
            continue
        # one shortest cycle through each module no reported cycle has passed yet: every module
        # of the tangle is named, in cycles short enough to read
        covered: set[str] = set()
        for start in scc:
            if start in covered:
                continue
            cycle = _shortest_cycle(start, set(scc), succ)
            covered.update(cycle)
            steps = [first[(a, b)] for a, b in itertools.pairwise(cycle)]
            chain = "; ".join(f"{e.source} -> {e.target} ({e.where()}, {e.how})" for e in steps)
            out.append(Violation(steps[0].path, steps[0].line, "cycle", f"import cycle: {chain}"))
    return out


def clock_violations(graph: Graph) -> list[Violation]:
    return [
        Violation(module.path, line, "clock", f"{what} reads the system clock; take a feedlog.clock.Clock instead")
        for module, line, what in graph.clock_reads
        if module.name != CLOCK_MODULE
    ]


def report(violations: list[Violation]) -> str:
    return "\n" + "\n".join(str(v) for v in sorted(violations, key=lambda v: (str(v.path), v.line)))


# the rules, on the real tree

GRAPH = read_graph(discover())


def test_the_tree_is_read() -> None:
    # guards against a reader that silently sees nothing (a test that cannot fail)
    assert {"feedlog.clock", "feedlog.delta.table", "feedlog.cli", "feedlog_server.app"} <= set(GRAPH.modules)
    assert any(e.source == "feedlog.delta.table" and e.target.startswith("feedlog.delta.") for e in GRAPH.edges)
    assert any(m.name == CLOCK_MODULE for m, _line, _what in GRAPH.clock_reads)  # SystemClock itself


def test_layers_point_down() -> None:
    violations = layer_violations(GRAPH)
    assert not violations, report(violations)


def test_no_import_cycles() -> None:
    violations = cycle_violations(GRAPH)
    assert not violations, report(violations)


def test_only_clock_py_reads_the_system_clock() -> None:
    violations = clock_violations(GRAPH)
    assert not violations, report(violations)


# the checker itself, on small trees written here


def scratch(tmp_path: Path, files: Mapping[str, str]) -> Graph:
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for rel in files:  # every directory is a package
        for parent in (tmp_path / rel).parents:
            if parent == tmp_path:
                break
            (parent / "__init__.py").touch()
    return read_graph(discover([("feedlog", tmp_path / "feedlog"), ("feedlog_server", tmp_path / "server")]))


def messages(violations: list[Violation]) -> list[str]:
    return [f"{v.path.name}:{v.line}: [{v.rule}] {v.detail}" for v in violations]


def test_checker_finds_upward_and_sideways_imports_wherever_they_sit(tmp_path: Path) -> None:
    graph = scratch(
        tmp_path,
        {
            "feedlog/errors.py": "",
            "feedlog/log/core.py": "from ..errors import X\n",  # down: fine
            "feedlog/delta/table.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n"
                "    from ..lake import sink\n"  # upward, for types only
                "def f():\n"
                "    from feedlog.replication import client\n"  # sideways, lazy
            ),
            "feedlog/replication/client.py": "import feedlog.log.core\n",
            "feedlog/lake/sink.py": "import feedlog_server.app\n",  # upward
            "server/app.py": "from feedlog.cli import main\n",  # upward
            "feedlog/cli/main.py": "from feedlog_server import app\n",  # down: fine
        },
    )
    assert messages(layer_violations(graph)) == [
        "table.py:3: [layers] upward import (TYPE_CHECKING): feedlog.delta.table (delta) imports "
        "feedlog.lake.sink (lake)",
        "table.py:5: [layers] sideways import (lazy): feedlog.delta.table (delta) imports "
        "feedlog.replication.client (replication)",
        "sink.py:1: [layers] upward import (module level): feedlog.lake.sink (lake) imports "
        "feedlog_server.app (server)",
        "app.py:1: [layers] upward import (module level): feedlog_server.app (server) imports feedlog.cli.main (cli)",
    ]


def test_checker_places_every_module_in_a_layer(tmp_path: Path) -> None:
    graph = scratch(tmp_path, {"feedlog/demo.py": "", "feedlog/__main__.py": "from .demo import run\n"})
    assert messages(layer_violations(graph)) == [
        "demo.py:1: [layers] feedlog.demo belongs to no layer: place it in LAYERS"
    ]


def test_checker_finds_cycles_through_lazy_imports_and_package_inits(tmp_path: Path) -> None:
    graph = scratch(
        tmp_path,
        {
            # a package re-exporting its submodules: no cycle by itself
            "feedlog/log/__init__.py": "from .core import Core\nfrom .feed import Feed\n",
            "feedlog/log/core.py": "X = 1\n",
            "feedlog/log/feed.py": "from .core import X\n",
            # a lazy import closing a loop
            "feedlog/delta/table.py": "from .transaction import T\n",
            "feedlog/delta/transaction.py": "def f():\n    from .table import D\n",
            # a submodule importing its own package's __init__, which imports it
            "feedlog/lake/__init__.py": "from .sink import S\n",
            "feedlog/lake/sink.py": "from . import helper_name\n",
        },
    )
    assert messages(cycle_violations(graph)) == [
        "table.py:1: [cycle] import cycle: feedlog.delta.table -> feedlog.delta.transaction "
        f"({tmp_path}/feedlog/delta/table.py:1, module level); feedlog.delta.transaction -> feedlog.delta.table "
        f"({tmp_path}/feedlog/delta/transaction.py:2, lazy)",
        "__init__.py:1: [cycle] import cycle: feedlog.lake -> feedlog.lake.sink "
        f"({tmp_path}/feedlog/lake/__init__.py:1, module level); feedlog.lake.sink -> feedlog.lake "
        f"({tmp_path}/feedlog/lake/sink.py:1, module level)",
    ]


def test_checker_finds_every_spelling_of_a_clock_read(tmp_path: Path) -> None:
    graph = scratch(
        tmp_path,
        {
            "feedlog/clock.py": "import time\ndef now():\n    return time.time_ns()\n",  # the one allowed
            "feedlog/log/a.py": (
                "import time\n"
                "import datetime as dt\n"
                "from datetime import datetime, date as D\n"
                "from time import time_ns as ns\n"  # 4: the import itself
                "def f():\n"
                "    time.time()\n"  # 6
                "    dt.datetime.now(dt.UTC)\n"  # 7
                "    datetime.utcnow()\n"  # 8
                "    D.today()\n"  # 9
                "    ns()\n"  # 10
                "    g = time.time\n"  # 11: a reference is as good as a call
                "    time.monotonic(); datetime.fromtimestamp(0); dt.date(2026, 1, 1)\n"  # fine
            ),
        },
    )
    assert sorted((v.line, v.detail.split()[0]) for v in clock_violations(graph)) == [
        (4, "time.time_ns"),
        (6, "time.time"),
        (7, "datetime.datetime.now"),
        (8, "datetime.datetime.utcnow"),
        (9, "datetime.date.today"),
        (10, "time.time_ns"),
        (11, "time.time"),
    ]
