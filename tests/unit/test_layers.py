"""The package's import layers (docs/architecture.md): every import, at module level or inside a
function, goes to the importing module's own layer or a lower one, and the packages import each
other without cycles. Read from the source with ``ast``: nothing is imported to check it."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "tensorpilot"

# lowest first; a unit is a subpackage (plan, training, ...) or a top-level module (config, cli, ...)
LAYERS = [
    {"errors", "version", "files", "argtypes", "config", "layout", "k8s"},   # foundations: stdlib only
    {"hardware"},                                          # what the machine is
    {"plan"},                                              # predictions (torch-free)
    {"attention", "workloads"},                            # kernels any model calls; models, data, specs
    {"modules", "observe"},                                # model surgery, measurements
    {"parallel", "modelplan"},                             # process groups, parallelize; any model planned
    {"training"},                                          # the trainer, checkpoints, autotune
    {"api", "trainargs", "serve", "launch", "profiling", "bench"},  # entry points
    {"cli", "__main__", "__init__"},                       # the command line and the facade
]
LAYER = {unit: i for i, units in enumerate(LAYERS) for unit in units}


def _unit(module: str) -> str:
    """'tensorpilot.plan.predict' -> 'plan'; 'tensorpilot.config' -> 'config'; 'tensorpilot' -> '__init__'."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _module_name(path: Path) -> str:
    rel = path.relative_to(SRC.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imports(path: Path) -> list[tuple[str, int]]:
    """(imported tensorpilot module, line) for every import in ``path``."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # "from tensorpilot import files": the submodule is what is imported
            subs = [f"{target}.{a.name}" for a in node.names
                    if (SRC.parent / f"{target}.{a.name}".replace(".", "/")).with_suffix(".py").exists()
                    or (SRC.parent / f"{target}.{a.name}".replace(".", "/") / "__init__.py").exists()]
            found += [(t, node.lineno) for t in (subs or [target])]
    return [(t, line) for t, line in found if t == "tensorpilot" or t.startswith("tensorpilot.")]


def _all_imports() -> list[tuple[str, str, int]]:
    return [(_module_name(p), target, line) for p in sorted(SRC.rglob("*.py")) for target, line in _imports(p)]


def test_every_unit_has_a_layer():
    units = {_unit(_module_name(p)) for p in SRC.rglob("*.py")}
    assert units <= set(LAYER), f"add these to LAYERS (and docs/architecture.md): {sorted(units - set(LAYER))}"


def test_no_module_imports_a_layer_above_its_own():
    wrong = [f"{src}:{line} imports {target} ({_unit(target)}, layer {LAYER[_unit(target)]}) from layer "
             f"{LAYER[_unit(src)]}" for src, target, line in _all_imports()
             if LAYER[_unit(target)] > LAYER[_unit(src)]]
    assert not wrong, "\n".join(wrong)


def test_packages_import_each_other_without_cycles():
    graph: dict[str, set[str]] = {}
    for src, target, _ in _all_imports():
        if _unit(src) != _unit(target):
            graph.setdefault(_unit(src), set()).add(_unit(target))
    state: dict[str, int] = {}                      # 1: on the current path, 2: done

    def visit(unit: str, path: list[str]) -> None:
        state[unit] = 1
        for nxt in sorted(graph.get(unit, ())):
            assert state.get(nxt) != 1, "import cycle: " + " -> ".join(path + [unit, nxt])
            if nxt not in state:
                visit(nxt, path + [unit])
        state[unit] = 2

    for unit in sorted(graph):
        if unit not in state:
            visit(unit, [])


def test_the_checker_sees_a_violation():
    """The rule is not vacuous: a lower layer importing a higher one is reported."""
    assert LAYER[_unit("tensorpilot.plan.local")] < LAYER[_unit("tensorpilot.training.trainer")]
    imports = _imports(SRC / "training" / "trainer.py")
    assert ("tensorpilot.parallel.runtime" in {t for t, _ in imports})
    assert ("tensorpilot.modules" in {t for t, _ in imports})       # "from tensorpilot import modules"
