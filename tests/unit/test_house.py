"""Rules of the house, checked on the source: no import circle among nwhisper's modules or its
rooms (a subpackage, or a module at the top; imports inside functions counted too), a command's
--help that does not load the kernels, no op module that chooses a variant by a backend's name (ops read capabilities: be.on_host), no file
that names the documents outside the repository this project was specified from, and no module
much over 500 lines."""

import ast
import os
import re
import subprocess
import sys

from paths import ROOT

PKG = os.path.join(ROOT, "nwhisper")


def modules():
    """{dotted name: path} of nwhisper's modules (package __init__ files as the package)."""
    found = {}
    for d, _, files in os.walk(PKG):
        for f in files:
            if f.endswith(".py"):
                rel = os.path.relpath(os.path.join(d, f), ROOT)[:-3].replace(os.sep, ".")
                found[rel[:-len(".__init__")] if rel.endswith(".__init__") else rel] = os.path.join(d, f)
    return found


def imports(name, path, known):
    """The nwhisper modules `name` imports, at its top or inside its functions."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    package = name if path.endswith("__init__.py") else name.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                out.add(sub if sub in known else base)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return {m for m in out if m in known and m != name}


def circles(graph):
    """The import circles of {node: nodes it imports}, each as a path back to its start."""
    state, found = {}, []

    def visit(m, stack):
        state[m] = "open"
        stack.append(m)
        for t in sorted(graph[m]):
            if state.get(t) == "open":
                found.append(stack[stack.index(t):] + [t])
            elif t not in state:
                visit(t, stack)
        stack.pop()
        state[m] = "done"
    for m in sorted(graph):
        if m not in state:
            visit(m, [])
    return found


def module_graph():
    known = modules()
    graph = {m: imports(m, p, known) for m, p in known.items()}
    # a package's __init__ runs before its modules: an edge into a package is not a circle back
    return {m: {t for t in ts if not known[t].endswith("__init__.py")} for m, ts in graph.items()}


def room(module):
    """The room a module stands in: its subpackage (nwhisper.server), or itself at the top."""
    parts = module.split(".")
    return ".".join(parts[:2])


def test_no_import_circle():
    found = circles(module_graph())
    assert not found, "import circles: " + "; ".join(" -> ".join(c) for c in found)


def test_no_import_circle_between_rooms():
    """No subpackage imports one that imports it back (an arrow up a floor: server -> cli)."""
    rooms = {}
    for m, ts in module_graph().items():
        rooms.setdefault(room(m), set()).update(room(t) for t in ts if room(t) != room(m))
    found = circles(rooms)
    assert not found, "circles between rooms: " + "; ".join(" -> ".join(c) for c in found)


def test_help_does_not_load_the_kernels():
    """Every command's --help, and the parsers behind it, need neither the model nor its kernels."""
    probe = ("import sys\n"
             "from nwhisper.cli.main import cli\n"
             "for cmd in [[]] + [[c] for c in cli.commands]:\n"
             "    try:\n"
             "        cli.main(cmd + ['--help'], standalone_mode=False)\n"
             "    except SystemExit:\n"
             "        pass\n"
             "print(sorted(m for m in sys.modules if m.startswith(('nwhisper.kernels', "
             "'nwhisper.model', 'nwhisper.backend'))))\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                         cwd=ROOT).stdout
    assert out.strip().splitlines()[-1] == "[]", out[-2000:]


def test_no_op_module_reads_a_backend_name():
    offenders = []
    for f in sorted(os.listdir(os.path.join(PKG, "kernels"))):
        if not f.endswith(".py") or f.startswith("_launch"):
            continue
        tree = ast.parse(open(os.path.join(PKG, "kernels", f), encoding="utf-8").read())
        offenders += [f"kernels/{f}:{n.lineno}" for n in ast.walk(tree)
                      if isinstance(n, ast.Attribute) and n.attr == "name"
                      and isinstance(n.value, ast.Name) and n.value.id == "be"]
    assert not offenders, f"ops choosing by be.name (read a capability instead): {offenders}"


def test_nothing_names_the_documents_outside_the_repository():
    outside = re.compile(r"\b(SPEC|DESIGN|PEERS|STYLE|DATA)\.md\b|\.\./shared|\bseeds/")
    hits = []
    for top in ("nwhisper", "tests", "fixtures", "bench", "docs", ".ci"):
        for d, _, files in os.walk(os.path.join(ROOT, top)):
            for f in files:
                if f.endswith((".py", ".md", ".sh", ".html", ".js", ".txt", ".toml")) or f == "run":
                    path = os.path.join(d, f)
                    text = open(path, encoding="utf-8", errors="replace").read()
                    if path != os.path.abspath(__file__) and outside.search(text):
                        hits.append(os.path.relpath(path, ROOT))
    for f in ("README.md", "pyproject.toml"):
        if outside.search(open(os.path.join(ROOT, f), encoding="utf-8").read()):
            hits.append(f)
    assert not hits, hits


def test_no_module_is_over_about_500_lines():
    """A module a reader can hold: the generated launchers (_launch_*.py) aside."""
    long = []
    for d, _, files in os.walk(PKG):
        for f in files:
            if f.endswith(".py") and not f.startswith("_launch_"):
                n = sum(1 for _ in open(os.path.join(d, f), encoding="utf-8"))
                if n > 510:
                    long.append(f"{os.path.relpath(os.path.join(d, f), ROOT)}: {n} lines")
    assert not long, long
