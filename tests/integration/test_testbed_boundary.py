"""The simulated rack is a rehearsal tool outside the product package (docs/development.md, design: "Testbed").

- `provisioner_testbed/` is its own top-level package; `provisioner/` holds no testbed code.
- The testbed imports the product (`provisioner.errors`, `provisioner.INVENTORIES`), never the other way round: the
  one module of `provisioner/` that names it is the thin CLI command `provisioner/commands/testbed.py`, and only
  inside functions (lazily), never at import time. Checked statically (ast, every file) and at run time (every
  product module imported, the whole CLI built: `provisioner_testbed` stays out of sys.modules).
- Where `provisioner_testbed` is not importable, `provision testbed ...` says so in one line and exits 2.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PRODUCT = REPO / "provisioner"
TESTBED = "provisioner_testbed"
#: the only product module allowed to name the testbed (inside functions only)
CLI_COMMAND = PRODUCT / "commands" / "testbed.py"


def _is_testbed(name: str | None) -> bool:
    # provisioner.testbed was the old home (inside the product package): naming it is as wrong as an import
    return bool(name) and any(name == m or name.startswith(m + ".") for m in (TESTBED, "provisioner.testbed"))


def _testbed_refs(tree: ast.AST) -> list[tuple[ast.AST, str]]:
    """(node, module) for every import of the testbed: import/from-import statements, and importlib.import_module()
    or __import__() with a literal (or f-string) module name."""
    found: list[tuple[ast.AST, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node, a.name) for a in node.names if _is_testbed(a.name)]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and _is_testbed(node.module):
                found.append((node, node.module or ""))
            elif node.level == 0 and node.module == "provisioner":
                found += [(node, f"provisioner.{a.name}") for a in node.names if a.name == "testbed"]
        elif isinstance(node, ast.Call) and node.args:
            f = node.func
            fname = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            if fname not in ("import_module", "__import__"):
                continue
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                text = arg.value
            elif isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
                text = str(arg.values[0].value)
            else:
                continue
            if _is_testbed(text.rstrip(".")):
                found.append((node, text))
    return found


def _function_lines(tree: ast.AST) -> set[int]:
    """Line numbers that lie inside a function body."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            lines.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    return lines


def test_the_product_package_does_not_import_the_testbed() -> None:
    offenders: list[str] = []
    files = sorted(PRODUCT.rglob("*.py"))
    assert len(files) > 20, files  # walked the real package
    for path in files:
        if "__pycache__" in path.parts:
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        refs = _testbed_refs(tree)
        if path == CLI_COMMAND:
            lazy = _function_lines(tree)
            refs = [(n, m) for n, m in refs if n.lineno not in lazy]  # module level: imported with the CLI
        offenders += [f"{path.relative_to(REPO)}:{n.lineno}: {m}" for n, m in refs]
    assert not offenders, "provisioner/ must not import the testbed (only commands/testbed.py, lazily):\n" + \
        "\n".join(offenders)


def test_the_guard_sees_what_it_must() -> None:
    """The ast walk above catches each way of naming the testbed (so an empty result means something)."""
    src = ("import provisioner_testbed\nfrom provisioner_testbed import rack\nfrom provisioner_testbed.hwsim import x\n"
           "import provisioner_testbed.repo as r\nfrom provisioner import testbed\nfrom provisioner.testbed import y\n"
           "import importlib\nimportlib.import_module('provisioner_testbed.rack')\n"
           "importlib.import_module(f'provisioner_testbed.{m}')\n__import__('provisioner_testbed')\n"
           "import provisioner_testbedx\nfrom provisioner import errors\nimportlib.import_module('provisioner.cli')\n")
    assert [n.lineno for n, _ in _testbed_refs(ast.parse(src))] == list(range(1, 7)) + [8, 9, 10]
    lazy = "def f():\n    from provisioner_testbed import rack\n"
    tree = ast.parse(lazy)
    assert [n.lineno for n, _ in _testbed_refs(tree)] == [2] and 2 in _function_lines(tree)


def test_the_command_module_names_the_testbed_only_lazily() -> None:
    tree = ast.parse(CLI_COMMAND.read_text())
    refs = _testbed_refs(tree)
    assert refs, "commands/testbed.py should reach the testbed (lazily)"
    assert all(n.lineno in _function_lines(tree) for n, _ in refs)


def test_no_testbed_code_is_left_inside_the_product_package() -> None:
    tracked = subprocess.run(["git", "ls-files", "provisioner/testbed"], cwd=REPO, capture_output=True, text=True,
                             check=True).stdout.split()
    assert tracked == []
    assert (REPO / TESTBED / "__init__.py").is_file() and (REPO / TESTBED / "packages" / "packages.toml").is_file()


def test_importing_the_whole_product_leaves_the_testbed_out() -> None:
    """Every module of provisioner/ imported, and the CLI with every command registered: no provisioner_testbed."""
    code = (
        "import importlib, pkgutil, sys, provisioner, provisioner.cli as cli\n"
        "mods = [m.name for m in pkgutil.walk_packages(provisioner.__path__, 'provisioner.')]\n"
        "for m in mods: importlib.import_module(m)\n"
        "cli.build_app()\n"
        "bad = sorted(m for m in sys.modules if m == 'provisioner_testbed' or m.startswith('provisioner_testbed.'))\n"
        "assert len(mods) > 20, mods\n"
        "print(len(mods), bad)\n"
        "sys.exit(1 if bad else 0)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr


#: `provision ARGS` where provisioner_testbed cannot be found: the product imported first, then the directory that
#: holds both packages (the checkout, via the editable install's .pth) taken off sys.path.
_WITHOUT_TESTBED = (
    "import sys\n"
    "from pathlib import Path\n"
    "import provisioner, provisioner.cli, provisioner.commands\n"
    "root = Path(provisioner.__file__).resolve().parents[1]\n"
    "sys.path[:] = [p for p in sys.path if Path(p or '.').resolve() != root]\n"
    "sys.path_importer_cache.clear()\n"
    "try:\n"
    "    import provisioner_testbed\n"
    "    sys.exit('provisioner_testbed still importable: ' + provisioner_testbed.__file__)\n"
    "except ModuleNotFoundError:\n"
    "    pass\n"
    "sys.argv = ['provision', *sys.argv[1:]]\n"
    "provisioner.cli.main()\n"
)


@pytest.mark.parametrize("args", [
    ("testbed", "status"),
    ("testbed", "list"),
    ("testbed", "fault", "node02", "xid=79"),
    ("testbed", "ssh", "node01", "true"),
])
def test_testbed_command_without_the_testbed_is_one_line_and_exit_2(args: tuple[str, ...], tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-c", _WITHOUT_TESTBED, *args], capture_output=True, text=True, timeout=120,
                       cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stdout + r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "the simulated rack is not installed: " in lines[0], r.stderr
    assert "no module named 'provisioner_testbed'" in lines[0]


def test_testbed_help_works_without_the_testbed(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-c", _WITHOUT_TESTBED, "testbed", "--help"], capture_output=True, text=True,
                       timeout=120, cwd=tmp_path)
    assert r.returncode == 0 and "simulated rack" in r.stdout, r.stdout + r.stderr
