"""Imports flow one way (docs/architecture.md): no module of fastnsq imports one that imports it back.

The import graph is read from the sources (``ast``), with the imports made only for
type checking counted too: a cycle there is a cycle in the design, even when Python
never runs it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import fastnsq

PACKAGE = Path(fastnsq.__file__).resolve().parent


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(path: Path, modules: set[str]) -> set[str]:
    """The fastnsq modules ``path`` imports (a package only when a name of its own is imported)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                if f"{target}.{alias.name}" in modules:
                    found.add(f"{target}.{alias.name}")
                elif target in modules:
                    found.add(target)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in modules)
    found.discard(name)
    return found


def import_graph() -> dict[str, set[str]]:
    paths = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    modules = set(paths)
    return {name: imported_modules(path, modules) for name, path in paths.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_graph_is_read() -> None:
    graph = import_graph()
    # A few edges that must be there, so that an empty graph cannot pass.
    assert "fastnsq.testing._nsqd_queue" in graph["fastnsq.testing._nsqd_client"]
    assert "fastnsq.testing._lookupd_core" in graph["fastnsq.testing._lookupd_ha"]
    assert "fastnsq.testing._lookupd_ha" in graph["fastnsq.testing.lookupd"]


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_fastnsq_has_no_import_cycle() -> None:
    assert cycles(import_graph()) == []


# ---- the one-way rules (docs/architecture.md) ---------------------------------------------------

#: The rooms that face the user; nothing below them may import them.
TOP = ("fastnsq.consumer", "fastnsq.producer", "fastnsq.sync", "fastnsq.cli", "fastnsq.spark", "fastnsq.demo",
       "fastnsq.benchmark", "fastnsq.testing", "fastnsq.metrics", "fastnsq.otel", "fastnsq.options",
       "fastnsq.runner", "fastnsq.apps")
#: Below the clients: the wire, one connection, discovery, RDY and backoff, the shared figures.
BELOW_THE_CLIENTS = ("fastnsq.codec", "fastnsq._frame_py", "fastnsq._delivery_py", "fastnsq._coalesce_py", "fastnsq._blocking_py",
                     "fastnsq.conn", "fastnsq.compression", "fastnsq.config", "fastnsq.errors",
                     "fastnsq.lookupd", "fastnsq.topology", "fastnsq.sharding", "fastnsq.rdy", "fastnsq.backoff",
                     "fastnsq.stats", "fastnsq.tracing", "fastnsq.loop", "fastnsq.bodies", "fastnsq.nsqd_http", "fastnsq.ext",
                     "fastnsq.recovery", "fastnsq.optionspec")
#: Pure state machines: no sockets, no HTTP, no event loop objects of their own.
PURE = ("fastnsq.rdy", "fastnsq.backoff", "fastnsq.sharding", "fastnsq.stats")
#: The C extensions (and their twins) that consumers and producers hand their messages to.
FAST_LANES = ("_delivery", "_coalesce", "_frame", "_blocking")


def in_room(module: str, rooms: tuple[str, ...]) -> bool:
    return any(module == room or module.startswith(room + ".") for room in rooms)


def offending_edges(importers: tuple[str, ...], forbidden: tuple[str, ...]) -> list[str]:
    graph = import_graph()
    return sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        if in_room(module, importers)
        for target in targets
        if in_room(target, forbidden) and not in_room(target, importers)
    )


def test_nothing_below_the_clients_imports_them() -> None:
    assert offending_edges(BELOW_THE_CLIENTS, TOP) == []


def test_topology_is_below_both_clients_and_they_share_it() -> None:
    assert offending_edges(("fastnsq.topology", "fastnsq.sharding"), TOP) == []
    users = {module for module, targets in import_graph().items() if "fastnsq.topology" in targets}
    assert "fastnsq.consumer.consumer" in users
    assert any(module.startswith("fastnsq.producer.") for module in users)
    # Nothing else asks lookupd for routes: the clients go through the topology.
    lookupd_users = {
        m for m, targets in import_graph().items() if any(in_room(t, ("fastnsq.lookupd",)) for t in targets)
    }
    assert not [m for m in lookupd_users if in_room(m, ("fastnsq.consumer", "fastnsq.producer"))]


def test_consumer_and_producer_do_not_import_each_other() -> None:
    assert offending_edges(("fastnsq.consumer",), ("fastnsq.producer",)) == []
    assert offending_edges(("fastnsq.producer",), ("fastnsq.consumer",)) == []


def test_the_runner_sits_above_the_clients() -> None:
    """``fastnsq.runner`` (the worker's supervisor and children) uses the public Consumer; neither
    client, nor anything the clients stand on, nor the blocking facade imports it. Only the
    command line does."""
    assert offending_edges(("fastnsq.consumer", "fastnsq.producer", "fastnsq.sync", "fastnsq.metrics",
                            "fastnsq.options", "fastnsq.testing", "fastnsq.spark"), ("fastnsq.runner",)) == []
    graph = import_graph()
    assert "fastnsq.consumer" in graph["fastnsq.runner.child"]  # the rule is read from real edges
    users = {m for m, targets in graph.items() if any(in_room(t, ("fastnsq.runner",)) for t in targets)}
    # The command line's worker, the apps' bridge onto the runtime (rule 9), and the entry point,
    # which starts a group's first child before the command line is imported (spawning only).
    assert {m for m in users if not in_room(m, ("fastnsq.runner",))} <= {
        "fastnsq.cli.worker", "fastnsq.apps.hosting", "fastnsq.__main__"}
    assert {t for t in graph["fastnsq.__main__"] if in_room(t, ("fastnsq.runner",))} == {"fastnsq.runner.spawning"}
    # The runner reaches the Consumer through its package, never its insides.
    assert offending_edges(("fastnsq.runner",), ("fastnsq.consumer.",)) == []
    assert not [t for m, ts in graph.items() if in_room(m, ("fastnsq.runner",))
                for t in ts if t.startswith("fastnsq.consumer.")]


def test_the_apps_sit_above_the_runner() -> None:
    """``fastnsq.apps`` (to-file, to-nsq, to-http, to-postgres) stands on the runner and the public clients:
    the runner runs an app only by its import path (never an import), nothing but the command
    line imports an app, and the apps reach the clients through their packages."""
    graph = import_graph()
    assert "fastnsq.runner" in graph["fastnsq.apps.hosting"]  # the rule is read from real edges
    users = {m for m, targets in graph.items() if any(in_room(t, ("fastnsq.apps",)) for t in targets)}
    assert {m for m in users if not in_room(m, ("fastnsq.apps",))} <= {
        "fastnsq.cli.main", "fastnsq.cli.to_file", "fastnsq.cli.to_nsq", "fastnsq.cli.to_http", "fastnsq.cli.to_postgres",
        "fastnsq.cli._apps"}
    assert offending_edges(("fastnsq.runner",), ("fastnsq.apps",)) == []
    assert not [t for m, ts in graph.items() if in_room(m, ("fastnsq.apps",))
                for t in ts if t.startswith(("fastnsq.consumer.", "fastnsq.producer."))]
    # Only the bridge knows the runner: an app's handler is a plain object with hooks.
    assert {m for m in graph if in_room(m, ("fastnsq.apps",)) and any(
        in_room(t, ("fastnsq.runner",)) for t in graph[m])} == {"fastnsq.apps.hosting"}


def test_the_state_machines_know_no_connection_discovery_or_client() -> None:
    forbidden = ("fastnsq.conn", "fastnsq.lookupd", "fastnsq.topology", "fastnsq.compression", *TOP)
    assert offending_edges(PURE, forbidden) == []
    graph = import_graph()
    for module in PURE:
        source = (PACKAGE / (module.split(".")[-1] + ".py")).read_text()
        assert "import asyncio" not in source and "import aiohttp" not in source, module
        assert graph[module] <= {"fastnsq.errors", "fastnsq.codec", "fastnsq.backoff"}, (module, graph[module])


def pyx_imports(path: Path) -> set[str]:
    """The fastnsq modules a Cython source imports or cimports (relative imports only)."""
    found = set()
    for line in path.read_text().splitlines():
        match = re.match(r"\s*from\s+\.(\w*)\s+c?import\s+(.+)", line)
        if match:
            base = f"fastnsq.{match.group(1)}" if match.group(1) else "fastnsq"
            names = [n.strip().split(" as ")[0] for n in match.group(2).strip("()").split(",")]
            found.update(f"{base}.{n}" if not match.group(1) else base for n in names)
    return found


def test_the_fast_lanes_never_import_their_owners() -> None:
    for name in FAST_LANES:
        imported = pyx_imports(PACKAGE / f"{name}.pyx") | import_graph()[f"fastnsq.{name}_py"]
        assert not [m for m in imported if in_room(m, TOP + ("fastnsq.conn", "fastnsq.rdy"))], (name, imported)
    # The rule is read from real sources: _delivery.pyx does cimport the codec.
    assert "fastnsq._frame" in pyx_imports(PACKAGE / "_delivery.pyx")


def test_the_link_calls_its_owner_only_through_the_protocol() -> None:
    """The C link calls exactly the LinkOwner methods of _delivery.pyi, and the dispatcher has them all."""
    from fastnsq.consumer.dispatch import Dispatcher

    stub = (PACKAGE / "_delivery.pyi").read_text()
    protocol = stub[stub.index("class LinkOwner(Protocol):"):stub.index("class Link:")]
    declared = set(re.findall(r"def (\w+)\(", protocol))
    for source in ("_delivery.pyx", "_delivery_py.py"):
        called = set(re.findall(r"self\.owner\.(\w+)\(", (PACKAGE / source).read_text()))
        assert called and called <= declared, (source, called - declared)
    assert declared == {"on_message", "on_handler_failed", "on_finish", "on_requeue", "on_touch"}
    assert all(callable(getattr(Dispatcher, name, None)) for name in declared)


def test_every_module_has_a_docstring_that_says_its_job() -> None:
    missing = [
        module_name(path) for path in PACKAGE.rglob("*.py")
        if ast.get_docstring(ast.parse(path.read_text())) is None and path.name != "_version.py"
    ]
    assert missing == []


def test_modules_stay_small() -> None:
    """About 800 lines at most outside testing/, but for the codec twins (kept whole, as asyncpg
    keeps coreproto.pyx)."""
    whole = {"_frame.pyx", "_frame_py.py"}
    big = {
        str(path.relative_to(PACKAGE)): count
        for path in [*PACKAGE.rglob("*.py"), *PACKAGE.glob("*.pyx")]
        if "testing" not in path.relative_to(PACKAGE).parts and path.name not in whole
        and (count := len(path.read_text().splitlines())) > 800
    }
    assert big == {}


def test_the_ha_rooms_stay_apart() -> None:
    """The HA logic lives in rooms of its own: the body codec and nsqd's HTTP API below the clients
    (neither knows a connection), start positions and the rest of the HA consumer in
    ``consumer.positions`` / ``consumer.ha``, which the Consumer calls through a few hooks."""
    assert offending_edges(("fastnsq.bodies", "fastnsq.nsqd_http"), ("fastnsq.conn", "fastnsq.lookupd",
                                                                      "fastnsq.topology")) == []
    graph = import_graph()
    assert "fastnsq.consumer.ha" in graph["fastnsq.consumer.consumer"]
    assert "fastnsq.consumer.positions" in graph["fastnsq.consumer.ha"]
    assert "fastnsq.bodies" in graph["fastnsq.consumer.ha"]
    # The consumer module itself knows neither start positions nor bodies: only the hub.
    assert not graph["fastnsq.consumer.consumer"] & {"fastnsq.consumer.positions", "fastnsq.bodies"}
