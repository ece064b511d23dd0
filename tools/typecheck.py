"""Type-check the ``sinkscope`` package as it installs: ``python tools/typecheck.py``.

The wheel maps the repository's top-level folders into one package (``interp/`` is
``sinkscope.interp``; ``[tool.setuptools.package-dir]`` in pyproject.toml). mypy names a
module by its path, so run on the folders it would call ``interp/errors.py`` "interp.errors"
and never connect it to the ``sinkscope.interp.errors`` that the code imports. This script
lays the installed layout out as symbolic links in ``.typecheck/`` (git ignores it), runs
mypy there with the settings in pyproject.toml, and prints each path as the repository
file it links to. Extra arguments go to mypy.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
TREE = ROOT / ".typecheck"


def package_dirs() -> dict[str, str]:
    """Package name -> its folder in the repository, as setuptools maps them."""
    settings = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    mapping = settings.get("package-dir", {})
    return {name: mapping.get(name, name.replace(".", "/")) for name in settings["packages"]}


def lay_out_tree() -> dict[str, str]:
    """Build ``.typecheck/`` and return {path in the tree: path in the repository}."""
    shutil.rmtree(TREE, ignore_errors=True)
    links: dict[str, str] = {}
    for name, folder in sorted(package_dirs().items()):
        target = TREE / name.replace(".", "/")
        target.mkdir(parents=True, exist_ok=True)
        for source in sorted((ROOT / folder).glob("*.py")):
            (target / source.name).symlink_to(source)
            links[os.path.relpath(target / source.name, ROOT)] = os.path.relpath(source, ROOT)
    return links


def main() -> int:
    links = lay_out_tree()
    config = ["--config-file", str(ROOT / "pyproject.toml"), "--cache-dir", str(ROOT / ".mypy_cache")]
    command = [sys.executable, "-m", "mypy", *config, *sys.argv[1:]]
    done = subprocess.run(command, cwd=TREE, capture_output=True, text=True)
    output = done.stdout + done.stderr
    for tree_path, repo_path in links.items():
        output = output.replace(os.path.relpath(tree_path, ".typecheck"), repo_path)
    print(output, end="")
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
