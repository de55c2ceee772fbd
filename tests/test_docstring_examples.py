"""Every docstring example in the package runs on its own imports, and prints what it shows (doctest, in a scratch
directory)."""

import doctest
import importlib
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "torchrl_swm"
MODULES = sorted(
    ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")
    for path in PACKAGE.rglob("*.py")
    if ">>> " in path.read_text()
)


def test_the_examples_are_found():
    assert {"torchrl_swm.pool.env_pool", "torchrl_swm.world", "torchrl_swm.world_model.env", "torchrl_swm.data"} <= set(
        MODULES
    )


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # examples write datasets (data/...) relative to the working directory
    # globs={}: an example sees only what it imports, as a user pasting it into a script (not the module's names)
    result = doctest.testmod(importlib.import_module(name), globs={}, optionflags=doctest.ELLIPSIS, verbose=False)
    assert result.attempted > 0
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples in {name} failed (printed above)"
