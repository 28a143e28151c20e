"""The house rules a newcomer relies on: packages keep their private modules to
themselves, files are readable in one sitting and functions do one thing."""
from __future__ import annotations

import ast
import os
import re

from tests.helpers.paths import REPO

MAX_FILE_LINES = 420  # "about 400"
MAX_FUNCTION_LINES = 70  # "about 60"; argument-parser declarations aside
_SKIP_DIRS = {".git", ".venv", "__pycache__", "fixtures", "node_modules"}


def _folders(leave_out: tuple[str, ...] = ()):
    """``(folder, its file names)`` for the repository's folders, sorted; hidden, built and
    vendored ones aside, and those named in ``leave_out`` wherever they are."""
    for dirpath, dirs, files in os.walk(REPO):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS and not d.startswith(".")
                         and d not in leave_out)
        yield dirpath, sorted(files)


def _python_files(include_tests: bool = True) -> list[str]:
    return [os.path.join(dirpath, f)
            for dirpath, files in _folders(() if include_tests else ("tests",))
            for f in files if f.endswith(".py")]


def _module_name(path: str) -> str:
    name = os.path.relpath(path, REPO)[:-3].replace(os.sep, ".")
    return name[:-len(".__init__")] if name.endswith(".__init__") else name


def _imported(node: ast.AST, module: str, is_package: bool) -> list[str]:
    """Dotted names an import statement refers to (modules and ``module.name``)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level:
        base = module.split(".")
        base = base[:len(base) - node.level + (1 if is_package else 0)]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module
    return [target] + [f"{target}.{alias.name}" for alias in node.names]


def _private_owner(dotted: str) -> str | None:
    """The package that owns the first private (``_x``) part of ``dotted``, or None: the
    dotted prefix itself for a private module, its package for a module's private name."""
    parts = dotted.split(".")
    for i, part in enumerate(parts[1:], 1):
        if part.startswith("_") and not part.startswith("__"):
            owner = parts[:i]
            if not os.path.isdir(os.path.join(REPO, *owner)):
                owner = owner[:-1]
            return ".".join(owner)
    return None


def test_no_module_imports_another_packages_private_module():
    found = []
    for path in _python_files(include_tests=False):
        module = _module_name(path)
        tree = ast.parse(open(path, encoding="utf-8").read())
        for node in ast.walk(tree):
            for dotted in _imported(node, module, path.endswith("__init__.py")):
                owner = _private_owner(dotted)
                inside = owner and (module == owner or module.startswith(owner + "."))
                if owner is not None and not inside:
                    found.append(f"{os.path.relpath(path, REPO)}:{node.lineno} imports {dotted}")
    assert not found, "\n".join(found)


def test_files_are_readable_in_one_sitting():
    long = [f"{os.path.relpath(p, REPO)}: {n} lines" for p in _python_files()
            if (n := sum(1 for _ in open(p, encoding="utf-8"))) > MAX_FILE_LINES]
    assert not long, "\n".join(long)


def _is_parser_declaration(fn: ast.FunctionDef) -> bool:
    calls = [n for n in ast.walk(fn) if isinstance(n, ast.Call)
             and isinstance(n.func, ast.Attribute) and n.func.attr == "add_argument"]
    return len(calls) >= 8


def test_functions_do_one_thing():
    long = []
    for path in _python_files():
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES and not _is_parser_declaration(node):
                    long.append(f"{os.path.relpath(path, REPO)}:{node.lineno} {node.name}: "
                                f"{lines} lines")
    assert not long, "\n".join(long)


# Packages whose constructors and functions take settings objects (LoaderSettings, DistInfo)
# rather than long argument lists (timm's PrefetchLoader as the model of size).
SMALL_SIGNATURE_PACKAGES = ("loaders", "engine", "main")
MAX_PARAMETERS = 8  # self and cls apart


def test_constructors_take_settings_objects_not_long_argument_lists():
    long = []
    for path in _python_files(include_tests=False):
        if _module_name(path).split(".")[0] not in SMALL_SIGNATURE_PACKAGES:
            continue
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = node.args
                names = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]
                count = len([n for n in names if n not in ("self", "cls")])
                count += (args.vararg is not None) + (args.kwarg is not None)
                if count > MAX_PARAMETERS:
                    long.append(f"{os.path.relpath(path, REPO)}:{node.lineno} {node.name}: "
                                f"{count} parameters")
    assert not long, "\n".join(long)


# Packages by layer: a module imports only from its own layer or those below;
# models/ needs nothing of ours, so it sits beside loaders/. Tools and benchmarks are on top.
LAYERS = {"decode": 0, "formats": 1, "loaders": 2, "models": 2, "engine": 3, "main": 4}
TOP = 5  # benchmarks, tools, the converters' command lines (folder2lmdb.py, folder2shards.py)


def _module_graph() -> dict[str, set[str]]:
    """Module -> the repository modules it imports anywhere in its file (module level or
    inside functions): ``from X import Y`` counts as X.Y where that is a module, else X."""
    paths = {_module_name(p): p for p in _python_files(include_tests=False)}
    graph = {}
    for module, path in paths.items():
        tree = ast.parse(open(path, encoding="utf-8").read())
        edges = set()
        for node in ast.walk(tree):
            names = _imported(node, module, path.endswith("__init__.py"))
            if isinstance(node, ast.ImportFrom):
                target, members = names[0], names[1:]
                edges |= {m for m in members if m in paths}
                if any(m not in paths for m in members) and target in paths:
                    edges.add(target)
            else:
                edges |= {n for n in names if n in paths}
        graph[module] = edges - {module}
    return graph


def test_imports_run_one_way_down_the_layers():
    def layer(module: str) -> int:
        return LAYERS.get(module.split(".")[0], TOP)

    upward = [f"{a} (layer {layer(a)}) imports {b} (layer {layer(b)})"
              for a, targets in _module_graph().items() for b in targets if layer(b) > layer(a)]
    assert not upward, "\n".join(upward)


def test_the_import_graph_has_no_circle():
    graph = _module_graph()
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
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
                circles.append(" <-> ".join(sorted(component)))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    assert not circles, "\n".join(circles)


def test_no_test_module_imports_another_and_no_code_imports_the_tests():
    """What tests share lives in ``tests/helpers`` (and fixtures in ``conftest.py``); the
    product, its tools and benchmarks import nothing from ``tests/``."""
    found = []
    for path in _python_files():
        module = _module_name(path)
        tree = ast.parse(open(path, encoding="utf-8").read())
        for node in ast.walk(tree):
            for dotted in _imported(node, module, path.endswith("__init__.py")):
                parts = dotted.split(".")
                if parts[0] != "tests":
                    continue
                if not module.startswith("tests."):
                    found.append(f"{module} imports {dotted}")
                elif any(p.startswith("test_") for p in parts) or parts[-1] == "conftest":
                    found.append(f"{module} imports {dotted}")
    assert not found, "\n".join(found)


# What makes a test able to fail: an assert statement, pytest's raises/warns/fail, a raised
# AssertionError, or a call to a function that has one (of its own module, or imported from
# tests/helpers, followed through further calls). A check made only by an exception that a call
# might raise (subprocess's check=True, warnings turned into errors) does not count: say it
# with an assert.
ASSERTING_PYTEST = {"raises", "warns", "fail", "deprecated_call"}


def _asserts_itself(function: ast.AST) -> bool:
    for node in ast.walk(function):
        if isinstance(node, ast.Assert):
            return True
        if isinstance(node, ast.Raise) and node.exc is not None:
            raised = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if isinstance(raised, ast.Name) and raised.id == "AssertionError":
                return True
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "pytest"
                and node.func.attr in ASSERTING_PYTEST):
            return True
    return False


def _test_functions() -> tuple[dict, dict]:
    """``(module, name) -> function`` for every function of ``tests/`` (methods as
    ``Class.name``), and per module the names it imports from ``tests``: ``name ->
    (module, attribute or None for a module)``."""
    functions, imports = {}, {}
    for path in _python_files():
        module = _module_name(path)
        if not module.startswith("tests."):
            continue
        tree = ast.parse(open(path, encoding="utf-8").read())
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                functions[(module, node.name)] = node
            elif isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        functions[(module, f"{node.name}.{item.name}")] = item
        names = imports[module] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tests"):
                for alias in node.names:
                    whole = f"{node.module}.{alias.name}"
                    is_module = os.path.isfile(os.path.join(REPO, *whole.split(".")) + ".py")
                    names[alias.asname or alias.name] = ((whole, None) if is_module
                                                         else (node.module, alias.name))
    return functions, imports


def _callee(module: str, call: ast.Call, functions: dict, imports: dict):
    func = call.func
    if isinstance(func, ast.Name):
        if (module, func.id) in functions:
            return module, func.id
        target, attribute = imports[module].get(func.id, (None, None))
        return (target, attribute) if attribute else None
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        target, attribute = imports[module].get(func.value.id, (None, None))
        return (target, func.attr) if target and attribute is None else None
    return None


def test_every_test_can_fail():
    functions, imports = _test_functions()
    asserting = {key for key, function in functions.items() if _asserts_itself(function)}
    grown = True
    while grown:  # through helpers that call helpers
        grown = False
        for key, function in functions.items():
            if key not in asserting and any(
                    _callee(key[0], node, functions, imports) in asserting
                    for node in ast.walk(function) if isinstance(node, ast.Call)):
                asserting.add(key)
                grown = True
    tests = [key for key in functions if key[1].split(".")[-1].startswith("test_")
             and key[0].split(".")[-1].startswith("test_")]
    assert len(tests) > 500  # the scan found the suite
    hollow = [f"{module}.{name} (line {functions[module, name].lineno})"
              for module, name in tests if (module, name) not in asserting]
    assert not hollow, "tests that assert nothing:\n" + "\n".join(hollow)


# A package shows its concerns as sub-packages (wings); a few modules stand loose beside them.
MAX_LOOSE_MODULES = 7  # "about 6"


def test_packages_keep_few_loose_modules():
    crowded = []
    for dirpath, files in _folders(("tests",)):
        package = os.path.relpath(dirpath, REPO).replace(os.sep, ".")
        if "__init__.py" not in files:
            continue
        loose = [f for f in files if f.endswith(".py") and f not in ("__init__.py", "__main__.py")]
        if len(loose) > MAX_LOOSE_MODULES:
            crowded.append(f"{package}: {len(loose)} loose modules ({', '.join(sorted(loose))})")
    assert not crowded, "\n".join(crowded)


def test_no_folder_spelled_as_a_file_name_prefix():
    """``_gpu_a.py``, ``_gpu_b.py`` beside each other want a ``gpu/`` package."""
    found = []
    for dirpath, files in _folders(("tests",)):
        prefixes: dict[str, list[str]] = {}
        for f in files:
            if f.endswith(".py") and f.startswith("_") and not f.startswith("__"):
                prefixes.setdefault(f[1:].split("_")[0], []).append(f)
        found += [f"{os.path.relpath(dirpath, REPO)}: {sorted(group)}"
                  for group in prefixes.values() if len(group) > 1]
    assert not found, "\n".join(found)


ISSUE_NUMBER = re.compile(r"\b[Ii]ssues? #?\d+|\bround \d+\b")


def test_the_code_tells_what_it_is_not_its_history():
    """No issue numbers in the product's code, tools or benchmarks: the history is git log's."""
    found = []
    for dirpath, files in _folders(("tests", "docs")):
        for f in files:
            if f.endswith((".py", ".c", ".sh")) or f in ("Makefile", "Dockerfile"):
                path = os.path.join(dirpath, f)
                for number, line in enumerate(open(path, encoding="utf-8"), 1):
                    if ISSUE_NUMBER.search(line):
                        found.append(f"{os.path.relpath(path, REPO)}:{number}: {line.strip()}")
    assert not found, "\n".join(found)


def test_one_module_declares_every_flag_of_main_py():
    """``main.py --help``'s source is engine/cli.py alone (as torchvision's ``get_args_parser``);
    the converters share formats/cli.py."""
    found = []
    for path in _python_files(include_tests=False):
        module = _module_name(path)
        if module == "engine.cli" or not (module == "main" or module.split(".")[0] in (
                "engine", "loaders", "models", "decode")):
            continue
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("add_argument", "add_argument_group")):
                found.append(f"{os.path.relpath(path, REPO)}:{node.lineno}")
    assert not found, "flags declared outside engine/cli.py:\n" + "\n".join(found)
