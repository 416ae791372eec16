"""The package's layering (docs/architecture.md): every `import` of an sptlib module, at module
level or inside a function, goes down the stack; imports (deferred ones too) form no cycle; and an
sptlib import inside a function says why in a comment on its line or the line above."""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
# JAX-free modules every layer but the pure kernels may use (errors, ids, logging, the user's
# objects by import path, the slices' mesh presets and topologies).
FOUNDATION = {"errors", "write_errors", "vocab", "logs", "console", "import_path", "config_paths",
              "cli_help", "slices.meshes", "slices.topologies"}
# What each layer may import from sptlib; "tools" (stages, compare, aot, bench, the CLIs and
# the experiment files and the launchers: experiments/ and launch/, installed as
# sptlib.experiments and sptlib.launch) may import everything.
ALLOWED = {
    "foundation": {"foundation"},
    "kernels": {"kernels"},
    "layers": {"foundation", "kernels", "layers"},
    "models": {"foundation", "kernels", "layers", "models"},
    "data": {"foundation", "data"},
    "objectives": {"foundation", "kernels", "layers", "models", "objectives"},
    "train": {"foundation", "kernels", "layers", "models", "objectives", "data", "train"},
    # Config builders fill train's base config; only tools and experiment files import them.
    "configs": {"foundation", "kernels", "layers", "models", "objectives", "data", "train",
                "configs"},
}
# Files another change still has to give a comment to (remove an entry once it is fixed).
PENDING_COMMENTS = set()


def layer_of(module):
    parts = module.split(".")
    if len(parts) == 1:
        return "foundation"  # the package's own __init__ (version only)
    if parts[1] in FOUNDATION or ".".join(parts[1:3]) in FOUNDATION:
        return "foundation"
    if parts[1] in ("kernels", "layers", "models", "data", "objectives", "train", "configs"):
        return parts[1]
    return "tools"


# Top-level folders of the clone that the wheel installs inside the package (setup.py).
MAPPED = ("experiments", "launch")


def module_name(path):
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[0] in MAPPED:
        parts = ["sptlib"] + parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def library_files():
    return sorted(p for top in ("sptlib", *MAPPED) for p in (ROOT / top).rglob("*.py"))


MODULES = {module_name(p) for p in library_files()}


def sptlib_imports(path):
    """(target module, line, inside a function?) for every import of an sptlib module."""
    tree = ast.parse(path.read_text())
    name = module_name(path)
    is_pkg = path.name == "__init__.py"
    in_function = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            in_function.update(id(n) for n in ast.walk(node) if n is not node)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_pkg else name.split(".")[:-1]
                base = ".".join(base[:len(base) - node.level + 1] + [node.module or ""])
            else:
                base = node.module
            base = base.rstrip(".")
            # `from sptlib.x import y` imports the module sptlib.x.y when there is one.
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base
                       for a in node.names]
        else:
            continue
        for t in targets:
            if t == "sptlib" or t.startswith("sptlib."):
                out.append((t, node.lineno, id(node) in in_function))
    return out


def test_every_sptlib_import_goes_down_the_stack():
    bad = []
    for path in library_files():
        name = module_name(path)
        src = layer_of(name)
        for target, line, _ in sptlib_imports(path):
            dst = layer_of(target)
            if src != "tools" and dst not in ALLOWED[src]:
                bad.append(f"{path.relative_to(ROOT)}:{line}: {src} imports {target} ({dst})")
    assert not bad, "\n".join(bad)


def test_no_import_cycle():
    """No cycle among sptlib's modules, counting imports deferred into functions too (a deferred
    import hides a circle from Python, not from a reader)."""
    modules = {module_name(p): p for p in library_files()}
    edges = {name: {t for t, _, _ in sptlib_imports(path) if t in modules and t != name}
             for name, path in modules.items()}
    # A package's __init__ imported by its own submodule is not a cycle (Python allows it).
    for name in edges:
        edges[name] = {d for d in edges[name] if not name.startswith(d + ".")}
    state, cycle = {}, []

    def visit(node, stack):
        state[node] = "open"
        for dep in sorted(edges[node]):
            if state.get(dep) == "open":
                cycle.append(stack[stack.index(dep):] + [dep])
            elif dep not in state:
                visit(dep, stack + [dep])
        state[node] = "done"

    for name in sorted(edges):
        if name not in state:
            visit(name, [name])
    assert not cycle, cycle


def test_function_level_sptlib_imports_say_why():
    bad = []
    for path in library_files():
        rel = str(path.relative_to(ROOT))
        if rel in PENDING_COMMENTS:
            continue
        lines = path.read_text().splitlines()
        for target, line, in_fn in sptlib_imports(path):
            if in_fn and "#" not in lines[line - 1] and not lines[line - 2].strip().startswith("#"):
                bad.append(f"{rel}:{line}: import of {target} inside a function, no comment")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("module,layer", [("sptlib.kernels.s4", "kernels"),
                                          ("sptlib.slices.meshes", "foundation"),
                                          ("sptlib.configs.presets", "configs"),
                                          ("sptlib.protocol.stages", "tools")])
def test_layer_of(module, layer):
    assert layer_of(module) == layer


def test_data_config_imports_without_jax():
    """Configs and the JAX-free compare CLI import `sptlib.data` for `data_config` and
    `task_info`; grain (and with it JAX) loads only with `get_task`."""
    import subprocess
    import sys
    code = ("import sys, sptlib.data as d; d.task_info(d.data_config()); "
            "sys.exit('jax' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
