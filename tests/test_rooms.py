"""iosim/ is rooms, not one floor: each module lives in the package that says what it is for.

What is asked (``iosim.spec``: the problem, the schedule, KV formats; ``iosim.masking``: which scores exist), how it
runs (``iosim.runner``: the front door, problem runs, results, references, inputs, validation, estimates, the
registry, sweeps, the warm-up), the plumbing (``iosim.base``: errors, outputs, Numba's cache, the version), beside the
rooms that were already folders (cli, gpu, hierarchy, kernels, pebble, theory, views).
"""

import ast
import importlib
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
ROOMS = {
    "spec": {"problem", "schedule", "kv_format"},
    "masking": {"masks", "mask_mod", "head_masks", "block_sparse", "topk_sparse", "counted_run"},
    "runner": {
        "api",
        "problem_runs",
        "results",
        "references",
        "inputs",
        "validate",
        "estimate",
        "registry",
        "sweep",
        "warmup",
    },
    "base": {"errors", "outputs", "numba_cache", "version"},
}
# What `import iosim` offers, unchanged by the move (the docs and users' code use these names).
PUBLIC = {
    "CapacityError", "CheckReport", "HierarchyResult", "InputError", "Memory", "PassResult", "Problem",
    "ReplayResult", "Result", "Schedule", "ScheduleError", "Trace", "__version__", "algorithm_names", "check",
    "hierarchy", "masks", "register", "replay", "run", "show", "sweep", "unregister",
}  # fmt: skip


def test_no_module_sits_on_the_ground_floor():
    assert sorted(p.name for p in (ROOT / "iosim").glob("*.py")) == ["__init__.py"]


@pytest.mark.parametrize("room", sorted(ROOMS))
def test_each_room_holds_its_modules_and_says_what_it_is_for(room):
    folder = ROOT / "iosim" / room
    assert {p.stem for p in folder.glob("*.py")} - {"__init__"} == ROOMS[room]
    assert ast.get_docstring(ast.parse((folder / "__init__.py").read_text()))
    for name in ROOMS[room]:
        importlib.import_module(f"iosim.{room}.{name}")


def test_every_package_folder_says_what_it_is_for():
    for init in (ROOT / "iosim").glob("*/__init__.py"):
        assert ast.get_docstring(ast.parse(init.read_text())), f"{init.relative_to(ROOT)} has no docstring"


def test_the_plumbing_imports_no_room_above_it():
    """iosim.base is imported by every room, so it imports none of them (a lazy import of the kernels' drivers to
    warm Numba's cache aside, it names only iosim.base and the memory model's errors)."""
    for path in (ROOT / "iosim" / "base").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("iosim."):
                top = node.module.split(".")[1]
                assert top in {"base", "memory_model", "algorithms"}, f"{path.name} imports {node.module}"


def test_the_public_names_are_unchanged():
    import iosim

    assert set(iosim.__all__) == PUBLIC
    for name in PUBLIC:
        assert getattr(iosim, name) is not None
    assert callable(iosim.sweep) and callable(iosim.run)
