"""The rooms of docs/architecture.md, read from the code with ``ast``.

* party A and party B never import each other: each institution deploys its own side;
* no service package (party_a, party_b, accountant, common, proto) imports the
  coordinator, the benchmarks or the auditor; common imports no party;
* the auditor is the only package that reads both parties' records (it may import both);
* the coordinator imports the benchmarks and the auditor only inside commands, so ``vesper``
  (the CLI) does not load them until their commands run;
* no hand-written Python module over 600 lines, no function over 80 (generated code excepted);
* every package folder is one pyproject.toml installs (a non-editable install would miss it).
"""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("party_a", "party_b", "accountant", "common", "proto", "coordinator", "benchmarks", "auditor")
SERVICES = ("party_a", "party_b", "accountant", "common", "proto")
TOOLS = ("coordinator", "benchmarks", "auditor")
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80


def _generated(path: Path) -> bool:
    return path.name.endswith(("_pb2.py", "_pb2_grpc.py"))


def _modules(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py") if not _generated(p))


def _imported_packages(path: Path, top_level_only: bool = False) -> dict[str, int]:
    """The vesper packages ``path`` imports (anywhere in it, lazily or not, unless
    ``top_level_only``), with a line of each."""
    tree = ast.parse(path.read_text(), str(path))
    found: dict[str, int] = {}
    for node in tree.body if top_level_only else ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        for name in names:
            parts = name.split(".")
            if parts[0] == "vesper" and len(parts) > 1:
                found.setdefault(parts[1], node.lineno)
    return found


def _violations(folders: tuple[str, ...], forbidden: tuple[str, ...], top_level_only: bool = False) -> list[str]:
    return [
        f"{path.relative_to(ROOT)}:{line} imports vesper.{package}"
        for path in _modules(*folders)
        for package, line in _imported_packages(path, top_level_only).items()
        if package in forbidden
    ]


def test_the_parties_never_import_each_other() -> None:
    assert _violations(("party_a",), ("party_b",)) == []
    assert _violations(("party_b",), ("party_a",)) == []


def test_no_service_package_imports_the_coordinator_the_benchmarks_or_the_auditor() -> None:
    assert _violations(SERVICES, TOOLS) == []


def test_common_imports_no_party_and_no_service() -> None:
    assert _violations(("common", "proto"), ("party_a", "party_b", "accountant")) == []


def test_the_accountant_imports_no_party() -> None:
    assert _violations(("accountant",), ("party_a", "party_b")) == []


def test_the_coordinator_imports_the_benchmarks_and_the_auditor_only_inside_their_commands() -> None:
    """coordinator/ registers ``bench`` and ``audit`` by name and imports what a command runs
    inside that command, never when a module loads (a service never pulls them in)."""
    assert _violations(("coordinator",), ("benchmarks", "auditor"), top_level_only=True) == []


def test_the_cli_loads_neither_the_benchmarks_nor_the_auditor_at_start() -> None:
    probe = (
        "import sys, vesper.coordinator.cli as cli; "
        "print(sorted({m.split('.')[1] for m in sys.modules if m.startswith('vesper.')}))"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert "benchmarks" not in loaded and "auditor" not in loaded, loaded


def test_the_layering_check_sees_a_forbidden_import(tmp_path: Path) -> None:
    """The reader is not blind: a lazy import inside a function counts too."""
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from vesper.party_b.session import LabelSession\n    import vesper.auditor.run_audit\n")
    assert set(_imported_packages(module)) == {"party_b", "auditor"}
    assert _imported_packages(module, top_level_only=True) == {}


@pytest.mark.parametrize("folders", [PACKAGES, ("tests",)], ids=["package", "tests"])
def test_no_module_over_600_lines_and_no_function_over_80(folders: tuple[str, ...]) -> None:
    long_modules, long_functions = [], []
    for path in _modules(*folders):
        text = path.read_text()
        lines = len(text.splitlines())
        if lines > MAX_MODULE_LINES:
            long_modules.append(f"{path.relative_to(ROOT)}: {lines} lines")
        for node in ast.walk(ast.parse(text, str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long_functions.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {length} lines")
    assert long_modules == [], f"split these modules (at most {MAX_MODULE_LINES} lines)"
    assert long_functions == [], f"split these functions (at most {MAX_FUNCTION_LINES} lines)"


def test_every_package_folder_is_installed() -> None:
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    installed = set(setuptools["packages"])
    folders = {
        "vesper." + ".".join(init.parent.relative_to(ROOT).parts)
        for top in PACKAGES for init in (ROOT / top).rglob("__init__.py")
    }
    assert folders - installed == set(), "add these to [tool.setuptools] packages in pyproject.toml"
    assert {f"vesper.{top}" for top in PACKAGES} <= set(setuptools["package-dir"])
