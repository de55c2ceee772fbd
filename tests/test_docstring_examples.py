"""Every docstring example in the package runs on its own imports, and prints what it shows (doctest, in a scratch
directory)."""

import doctest
import importlib
import pathlib
import re

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "torchrl_swm"
SOURCES = {  # module name -> its file, for the modules with examples
    ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__"): path
    for path in PACKAGE.rglob("*.py")
    if ">>> " in path.read_text()
}
MODULES = sorted(SOURCES)
# the optional extras' packages: a module whose examples import one is skipped where it is not installed
OPTIONAL = ("stable_baselines3", "ray", "imageio", "matplotlib", "pygame")


def optional_imports(name: str) -> list[str]:
    """The optional packages the examples of module ``name`` import (``>>> import x`` / ``>>> from x import``)."""
    imported = set(re.findall(r">>> (?:from|import) (\w+)", SOURCES[name].read_text()))
    return [package for package in OPTIONAL if package in imported]


def test_the_examples_are_found():
    assert {"torchrl_swm.pool.env_pool", "torchrl_swm.world", "torchrl_swm.world_model.env", "torchrl_swm.data"} <= set(
        MODULES
    )


def test_examples_that_import_an_optional_extra_are_found():
    assert optional_imports("torchrl_swm.export.sb3") == ["stable_baselines3"]
    assert optional_imports("torchrl_swm.world_model.transforms") == []


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name, tmp_path, monkeypatch):
    for package in optional_imports(name):
        pytest.importorskip(package, reason=f"{name}'s examples import {package} (an optional extra)")
    monkeypatch.chdir(tmp_path)  # examples write datasets (data/...) relative to the working directory
    # globs={}: an example sees only what it imports, as a user pasting it into a script (not the module's names)
    result = doctest.testmod(importlib.import_module(name), globs={}, optionflags=doctest.ELLIPSIS, verbose=False)
    assert result.attempted > 0
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples in {name} failed (printed above)"
