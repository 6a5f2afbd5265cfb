"""The layers of docs/architecture.md, held by the imports: each layer imports only the ones below it.

Read statically (`ast`, every import at any depth, lazy ones inside functions included), so a rule
holds for code paths no test runs. The table below is the doc's module diagram written out; a
failure names the file, the line and the import that breaks it. Three more rules: the torch-free
packages import no torch or transformers (directly, or through what they import at module level),
and no two modules import each other, by any path: module-level, lazy (inside a function) and
`if TYPE_CHECKING:` imports all count. A lazy or type-only import hides a circle from the
interpreter, not from the reader: the two modules still cannot be understood, tested or moved apart.
`tests/unit/gateway/test_torch_free.py` checks the same torch rule at run time.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("omnistream", "gateway", "services")
HEAVY = ("torch", "transformers")

# Module prefix -> layer (the longest prefix wins). The generated stubs belong to the wire format.
LAYER_OF = {
    "omnistream.cli": "cli",
    "omnistream.bench": "bench",
    "omnistream.client": "client",
    "gateway": "gateway",
    "services": "services",
    "omnistream.pipeline": "pipeline",
    "omnistream.pipeline_links": "pipeline",
    "omnistream.chain": "chain",
    "omnistream.models": "models",
    "omnistream.service": "service",
    "omnistream.engine": "engine",
    "omnistream.wire": "wire",
    "omnistream.proto": "wire",
    "omnistream.request": "request",
    "omnistream.audio": "audio",
}
BELOW_ENTRY = {
    "gateway",
    "services",
    "pipeline",
    "chain",
    "models",
    "service",
    "engine",
    "wire",
    "request",
    "audio",
}
# Layer -> the other layers it may import. The entry points (cli, bench) start and drive everything,
# each other included (the bench reuses the launcher; `omnistream bench` is a CLI command).
MAY_IMPORT: dict[str, set[str]] = {
    "cli": BELOW_ENTRY | {"bench", "client"},
    "bench": BELOW_ENTRY | {"cli", "client"},
    "client": {"service", "wire", "request", "audio"},
    "gateway": {"chain", "service", "wire", "request", "audio"},
    "services": {"service", "models", "engine", "wire", "request", "audio"},
    "pipeline": {"chain", "models", "engine", "wire", "request", "audio"},
    "chain": {"request", "audio"},
    "models": {"engine", "wire", "request", "audio"},
    "service": {"engine", "wire", "request", "audio"},
    "engine": {"request"},
    "wire": {"request"},
    "request": {"audio"},
    "audio": {"request"},
}
# The torch-free layers reach into the service scaffolding only for these modules (gRPC server
# helpers, TLS and keys, ports, the step-time model a stage reports in its Info, which the
# gateway's admission reads back, the settings table its flags and YAML are read through, the
# tracing setup and trace-context propagation every process shares, and the start-up heap's
# freeze): the servicer base drives an engine and so imports torch.
TORCH_FREE_SERVICE = {
    "omnistream.service.gc_freeze",
    "omnistream.service.server",
    "omnistream.service.settings",
    "omnistream.service.security",
    "omnistream.service.ports",
    "omnistream.service.step_model",
    "omnistream.service.tracing",
}
TORCH_FREE_LAYERS = {"gateway", "chain", "client", "request", "audio", "wire"}
# Crossings allowed by name: none left. The request model names no model's voice or sample rate
# (an empty speaker is the talker's default voice; audio events carry the stage's rate), and the
# gateway learns both from the stages' Info (the talker's `default_voice`, the code2wav's rate).
CROSSINGS: set[tuple[str, str]] = set()
# Torch imported inside a function of a torch-free layer: only on paths a stage process takes.
LAZY_TORCH = {
    "omnistream.request.sampling_params",  # the sampling generator, made by an engine
    "omnistream.request.stage_chain",  # merging held codec frames (a stage's sequential mode)
    "omnistream.wire.tensors",  # proto <-> torch tensors at a stage; the gateway uses the numpy paths
}


@dataclass(frozen=True)
class Import:
    source: str  # importing module
    path: str  # its file, relative to the repository
    line: int
    target: str  # imported module (a `from a import b` of a submodule names `a.b`)
    text: str  # the import as written
    module_level: bool  # runs at import time (not in a function, not under TYPE_CHECKING): the torch rule
    # reads it (what loads at import); the cycle rule counts every import


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for file in sorted((ROOT / package).rglob("*.py")):
            parts = file.relative_to(ROOT).with_suffix("").parts
            if parts[:2] == ("omnistream", "proto"):
                continue  # generated
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = file
    return found


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports_of(module: str, file: Path, known: set[str], root: Path = ROOT) -> list[Import]:
    tree = ast.parse(file.read_text(), filename=str(file))
    lines = file.read_text().splitlines()
    path = file.relative_to(root).as_posix()
    package = module if file.name == "__init__.py" else module.rpartition(".")[0]
    found: list[Import] = []

    def visit(node: ast.AST, module_level: bool) -> None:
        for child in ast.iter_child_nodes(node):
            runs_later = isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            type_only = isinstance(child, ast.If) and _is_type_checking(child)
            level = module_level and not (runs_later or type_only)
            if isinstance(child, ast.Import | ast.ImportFrom):
                text = lines[child.lineno - 1].strip()
                for target in _targets(child, package, known):
                    found.append(Import(module, path, child.lineno, target, text, level))
            visit(child, level)

    visit(tree, True)
    return found


def _targets(node: ast.Import | ast.ImportFrom, package: str, known: set[str]) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:  # relative: resolved against the importing package
        parent = package.split(".")[: len(package.split(".")) - (node.level - 1)]
        base = ".".join([*parent, *([base] if base else [])])
    targets = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in known]
    return targets or [base]


def _layer(module: str) -> str | None:
    best = max((p for p in LAYER_OF if module == p or module.startswith(p + ".")), key=len, default=None)
    return LAYER_OF[best] if best else None


def _all_imports() -> list[Import]:
    modules = _modules()
    known = set(modules)
    return [imp for name, file in modules.items() for imp in _imports_of(name, file, known)]


def _where(imp: Import) -> str:
    return f"{imp.path}:{imp.line}: {imp.text}"


def test_every_module_has_a_layer():
    unplaced = sorted(m for m in _modules() if _layer(m) is None and m not in PACKAGES)
    assert not unplaced, f"modules in no layer (add them to LAYER_OF and the doc): {unplaced}"


def test_layers_import_only_downward():
    wrong = []
    for imp in _all_imports():
        source, target = _layer(imp.source), _layer(imp.target)
        if source is None or target is None or source == target:
            continue
        if (imp.source, imp.target) in CROSSINGS:
            continue
        if target not in MAY_IMPORT[source]:
            allowed = ", ".join(sorted(MAY_IMPORT[source]))
            wrong.append(f"{_where(imp)}  ({source} may not import {target}; it may import: {allowed})")
        elif target == "service" and source in TORCH_FREE_LAYERS and imp.target not in TORCH_FREE_SERVICE:
            wrong.append(f"{_where(imp)}  ({source} may import only {sorted(TORCH_FREE_SERVICE)} of service)")
    assert not wrong, "imports against the layers of docs/architecture.md:\n" + "\n".join(wrong)


def test_torch_free_layers_import_no_torch():
    """No torch/transformers import in a torch-free layer's modules (lazy ones only where listed),
    nor any reachable through what they import at module level."""
    imports = _all_imports()
    by_source: dict[str, list[Import]] = {}
    for imp in imports:
        if imp.module_level:
            by_source.setdefault(imp.source, []).append(imp)
    wrong = []
    for imp in imports:
        if _layer(imp.source) not in TORCH_FREE_LAYERS or imp.target.split(".")[0] not in HEAVY:
            continue
        if not imp.module_level and imp.source in LAZY_TORCH:
            continue
        wrong.append(f"{_where(imp)}  ({_layer(imp.source)} is torch-free)")
    for module in sorted({i.source for i in imports if _layer(i.source) in TORCH_FREE_LAYERS}):
        chain = _path_to_heavy(module, by_source)
        if chain:
            wrong.append(
                f"{module} loads {chain[-1].target.split('.')[0]} at import: "
                + " -> ".join(_where(step) for step in chain)
            )
    assert not wrong, "torch in a torch-free layer:\n" + "\n".join(wrong)


def _path_to_heavy(start: str, by_source: dict[str, list[Import]]) -> list[Import]:
    """The chain of module-level imports from `start` to torch/transformers, if any."""
    seen = {start}
    stack: list[tuple[str, list[Import]]] = [(start, [])]
    while stack:
        module, chain = stack.pop()
        for imp in by_source.get(module, []):
            if imp.target.split(".")[0] in HEAVY:
                return [*chain, imp]
            for target in _with_parents(imp.target):
                if target in by_source and target not in seen:
                    seen.add(target)
                    stack.append((target, [*chain, imp]))
    return []


def _with_parents(module: str) -> list[str]:
    """Importing a.b.c runs a/__init__, a/b/__init__ and a/b/c."""
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def _import_graph(imports: list[Import], modules: set[str]) -> dict[str, list[Import]]:
    """Module -> its imports of other modules of the project: every one, lazy and type-only too."""
    graph: dict[str, list[Import]] = {}
    for imp in imports:
        if imp.target in modules and imp.target != imp.source:
            graph.setdefault(imp.source, []).append(imp)
    return graph


def _cycle_report(graph: dict[str, list[Import]]) -> str:
    """'' for no cycle; else each cycle's imports, one a line (file:line: the import as written)."""
    cycles = [c for c in _cycles(graph) if c]
    return "\n\n".join("\n".join(_where(step) for step in cycle) for cycle in cycles)


def test_no_import_cycles():
    report = _cycle_report(_import_graph(_all_imports(), set(_modules())))
    assert not report, "import cycles (lazy and TYPE_CHECKING imports count):\n" + report


def test_the_cycle_check_counts_lazy_and_type_checking_imports(tmp_path):
    """A circle closed only by a lazy import, and one closed only under TYPE_CHECKING, both fail
    the check, which names every import of each circle."""
    sources = {
        "a": "import b\n",
        "b": "def later():\n    import a\n",
        "c": "import d\n",
        "d": "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    import c\n",
        "e": "import a\n",  # imports into a circle, but is in none
    }
    for name, text in sources.items():
        (tmp_path / f"{name}.py").write_text(text)
    known = set(sources)
    imports = [imp for name in sources for imp in _imports_of(name, tmp_path / f"{name}.py", known, tmp_path)]
    report = _cycle_report(_import_graph(imports, known))
    assert report.split("\n\n") == [
        "a.py:1: import b\nb.py:2: import a",
        "c.py:1: import d\nd.py:4: import c",
    ]


def _cycles(graph: dict[str, list[Import]]) -> list[list[Import]]:
    """One cycle per strongly connected component of more than one module (Tarjan), as its edges."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for edge in graph.get(node, []):
            if edge.target not in index:
                connect(edge.target)
                low[node] = min(low[node], low[edge.target])
            elif edge.target in on_stack:
                low[node] = min(low[node], index[edge.target])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(component)

    for node in sorted(graph):
        if node not in index:
            connect(node)
    cycles = []
    for component in components:
        start = min(component)
        path: list[Import] = []
        node, visited = start, set()
        while node not in visited:  # walk inside the component until a module repeats
            visited.add(node)
            edge = next(e for e in graph[node] if e.target in component)
            path.append(edge)
            node = edge.target
        cycles.append(path[[e.source for e in path].index(node) :])
    return cycles
