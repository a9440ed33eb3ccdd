"""The Python layers' dependencies point one way (docs/architecture.md), read from the sources' import statements.

The user API (core/symmetric_memory) imports no framework and no handler (it reaches the chosen handler through
``_framework.handler()``, by name); a handler imports nothing of the other; the modules every handler shares import
no framework.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

import hyper_parallel

_PACKAGE = pathlib.Path(hyper_parallel.__file__).parent


def _for_type_checkers(node: ast.AST) -> bool:
    """``if TYPE_CHECKING:``: imports a type checker reads and the interpreter never runs (the user API's functions
    are annotated with torch's types there, for torch's users)."""
    if not isinstance(node, ast.If):
        return False
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _run_time_nodes(tree: ast.AST):
    """Every node of ``tree`` but those under ``if TYPE_CHECKING:``."""
    pending = [tree]
    while pending:
        node = pending.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if _for_type_checkers(child):
                pending.extend(child.orelse)
            else:
                pending.append(child)


def _imports(path: pathlib.Path) -> set:
    """The modules a source file imports when it runs (absolute names; relative imports resolved against its
    package)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = ".".join(("hyper_parallel", *path.relative_to(_PACKAGE).parent.parts))
    found = set()
    for node in _run_time_nodes(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:   # relative: from the package, node.level - 1 levels up
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            found.update(f"{base}.{alias.name}" for alias in node.names)
            found.add(base)
    return found


def _offending(folder: str, forbidden: tuple) -> dict:
    found = {}
    for path in sorted((_PACKAGE / folder).glob("*.py")):
        bad = sorted(m for m in _imports(path) if any(m == f or m.startswith(f + ".") for f in forbidden))
        if bad:
            found[path.name] = bad
    return found


_FRAMEWORKS = ("torch", "mindspore", "numpy")


def test_the_user_api_imports_no_framework_and_no_handler():
    assert _offending("core/symmetric_memory", _FRAMEWORKS + ("hyper_parallel.platform",
                                                             "hyper_parallel.core.multicore.shmem")) == {}


@pytest.mark.parametrize("folder,forbidden", [
    ("platform/torch", ("mindspore", "hyper_parallel.platform.mindspore")),
    ("platform/mindspore", ("torch", "hyper_parallel.platform.torch", "hyper_parallel.core.multicore.shmem")),
])
def test_a_handler_imports_nothing_of_the_other(folder, forbidden):
    assert _offending(folder, forbidden) == {}


def test_the_shared_runtime_modules_import_no_framework():
    shared = {"errors.py", "snapshot.py", "c_runtime.py", "call_site.py", "runtime_logs.py"}
    found = {name: bad for name, bad in _offending("core/multicore", _FRAMEWORKS).items() if name in shared}
    assert found == {}
    assert shared <= {p.name for p in (_PACKAGE / "core/multicore").glob("*.py")}


def test_the_phases_across_nodes_import_no_framework():
    """Both handlers run them; numpy is their array, which each framework's tensors share memory with."""
    assert _offending("core/multicore", ("torch", "mindspore", "hyper_parallel.core.multicore.shmem",
                                         "hyper_parallel.platform")).get("hierarchy.py") is None
    assert (_PACKAGE / "core/multicore/hierarchy.py").is_file()


def test_the_check_reads_imports():
    """The reader above sees what a forbidden import looks like (so that an empty result means something)."""
    found = _offending("platform/torch", ("torch",))
    assert "tensors.py" in found and "torch" in found["tensors.py"]


def test_imports_for_type_checkers_only_are_not_run_time_imports():
    source = _PACKAGE / "core/symmetric_memory/__init__.py"
    assert "torch" not in _imports(source)
    tree = ast.parse(source.read_text(encoding="utf-8"))
    typing_only = [n for n in ast.walk(tree) if _for_type_checkers(n)]
    assert typing_only and any(isinstance(n, ast.Import) and n.names[0].name == "torch"
                               for block in typing_only for n in ast.walk(block))
