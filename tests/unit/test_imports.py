"""The package's import rules (shared/DESIGN.md): arrows point down, nothing imports train/, no
package reaches into another's private modules. Checked on the source, every import statement
(also those inside functions). The side-effect-free imports are in ``test_envs.py``.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "rppo_td"

# python -m rppo_td.evaluate: the rppo-eval command's shim over rppo_td.train
TRAIN_SHIMS = {"evaluate.py", "_entry.py"}  # the -m module and the console scripts
# (file, imported module) still to fix; each entry must still be there (like xfail_strict)
KNOWN: set[tuple[str, str]] = set()


def _imports() -> list[tuple[str, str]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE).as_posix()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.append((name, node.module))
            elif isinstance(node, ast.Import):
                found.extend((name, alias.name) for alias in node.names)
    return [(name, module) for name, module in found if module.split(".")[0] == "rppo_td"]


def _package(file: str) -> str | None:
    """The subpackage a file belongs to (``transforms``), None for the root's own modules."""
    parts = file.split("/")
    return parts[0] if len(parts) > 1 else None


def test_the_scan_finds_imports() -> None:
    assert ("train/_loop.py", "rppo_td.train._evaluate") in _imports()


def test_nothing_imports_train() -> None:
    bad = [
        (file, module)
        for file, module in _imports()
        if module.startswith("rppo_td.train")
        and _package(file) != "train"
        and file not in TRAIN_SHIMS
    ]
    assert not bad, f"modules outside rppo_td/train import it: {bad}"
    # and no cycle: the trainer never imports its shims back
    shims = {"rppo_td." + shim.removesuffix(".py") for shim in TRAIN_SHIMS}
    back = [(file, module) for file, module in _imports() if module in shims]
    assert not back, f"import cycle through the command shims: {back}"


def test_no_private_module_of_another_package() -> None:
    # rppo_td._keys, _validation, _layout ... are the root's shared internals, imported downward
    crossing = set()
    for file, module in _imports():
        parts = module.split(".")
        if len(parts) < 3 or not any(part.startswith("_") for part in parts[2:]):
            continue
        if parts[1] != _package(file):
            crossing.add((file, module))
    new = crossing - KNOWN
    assert not new, f"import the package (its __init__), not its private modules: {new}"
    assert crossing >= KNOWN, f"fixed: remove {KNOWN - crossing} from KNOWN"
