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


def _imports(path: pathlib.Path) -> set:
    """The modules a source file imports (absolute names; relative imports resolved against its package)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = ".".join(("hyper_parallel", *path.relative_to(_PACKAGE).parent.parts))
    found = set()
    for node in ast.walk(tree):
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
    shared = {"errors.py", "snapshot.py", "c_runtime.py", "call_site.py"}
    found = {name: bad for name, bad in _offending("core/multicore", _FRAMEWORKS).items() if name in shared}
    assert found == {}
    assert shared <= {p.name for p in (_PACKAGE / "core/multicore").glob("*.py")}


def test_the_check_reads_imports():
    """The reader above sees what a forbidden import looks like (so that an empty result means something)."""
    found = _offending("platform/torch", ("torch",))
    assert "tensors.py" in found and "torch" in found["tensors.py"]
