"""One module writes the process's environment (attnlab.environment): the interpreter and Triton's cache folder are
set there, explicitly, and nowhere else in the package; the rest reads them or is passed what they decide."""
import ast
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "attnlab"
WRITER = ROOT / "environment.py"
MUTATORS = {"setdefault", "update", "pop", "popitem", "clear", "__setitem__", "__delitem__"}


def _is_environ(node) -> bool:
    """os.environ, or environ as `from os import environ` binds it."""
    return (isinstance(node, ast.Attribute) and node.attr == "environ" and isinstance(node.value, ast.Name)
            and node.value.id == "os") or (isinstance(node, ast.Name) and node.id == "environ")


def writes(path: Path) -> list[int]:
    """The lines of a file that write the environment: an assignment to or deletion of os.environ[...], a call of one
    of its mutating methods, os.putenv or os.unsetenv."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        targets = []
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        elif isinstance(node, ast.Delete):
            targets = node.targets
        if any(isinstance(t, ast.Subscript) and _is_environ(t.value) for t in targets):
            found.append(node.lineno)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            f = node.func
            if (f.attr in MUTATORS and _is_environ(f.value)) or (
                    f.attr in ("putenv", "unsetenv") and isinstance(f.value, ast.Name) and f.value.id == "os"):
                found.append(node.lineno)
    return sorted(found)


def test_only_the_environment_module_writes_the_environment():
    writers = {str(p.relative_to(ROOT.parent)): lines for p in sorted(ROOT.rglob("*.py")) if (lines := writes(p))}
    assert set(writers) == {str(WRITER.relative_to(ROOT.parent))}, writers


def test_the_scan_sees_each_way_of_writing(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("import os\nfrom os import environ\nos.environ['A'] = '1'\nos.environ.setdefault('B', '1')\n"
                   "os.putenv('C', '1')\ndel os.environ['A']\nenviron.update(D='1')\nos.environ.get('E')\n"
                   "x = os.environ['F']\n")
    assert writes(src) == [3, 4, 5, 6, 7]


def test_the_interpreter_and_the_cache_folder_are_set_on_import_of_the_kernels():
    """attnlab.triton's import ran attnlab.environment.configure (tests/conftest.py sets the interpreter first)."""
    import attnlab.triton  # noqa: F401

    assert os.environ.get("TRITON_INTERPRET") == "1"
    assert os.environ.get("TRITON_CACHE_DIR")
