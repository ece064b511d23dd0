"""The wheel installs one top-level name, ``sinkscope``, with every layer inside it, read
from the repository's top-level folders (pyproject.toml's package-dir)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAYER_FOLDERS = ("interp", "reports", "execution", "probes", "toy", "pretrained_analysis")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # build from a copy of the files git would commit: setuptools leaves build/ in the
    # tree it builds, where a module deleted since would linger into later wheels
    source = tmp_path_factory.mktemp("source")
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    for name in filter(None, listed.split("\0")):
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    build = [sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "-q", "-w", str(out)]
    subprocess.run(build, check=True, capture_output=True, text=True, cwd=out)
    (found,) = out.glob("sinkscope-*.whl")
    return found


def test_the_wheel_has_one_top_level_package_holding_every_module(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")} == {"sinkscope"}
    (top_level,) = [name for name in names if name.endswith("top_level.txt")]
    assert zipfile.ZipFile(wheel).read(top_level).decode().split() == ["sinkscope"]
    # every package of the source tree, the layers' folders and sinkscope/'s own subpackages
    packages = {f"sinkscope/{folder}": ROOT / folder for folder in LAYER_FOLDERS}
    packages |= {str(init.parent.relative_to(ROOT)): init.parent for init in (ROOT / "sinkscope").rglob("__init__.py")}
    for installed, folder in packages.items():
        sources = {path.name for path in folder.glob("*.py")}
        in_wheel = {n.rsplit("/", 1)[1] for n in names if n.rsplit("/", 1)[0] == installed and n.endswith(".py")}
        assert sources and sources == in_wheel, installed
    assert "sinkscope/pretrained_analysis/data/default_prompts.txt" in names


def test_after_a_regular_install_only_the_sinkscope_names_import(wheel, tmp_path):
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
        check=True,
        capture_output=True,
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    code = "import sinkscope.interp.hook_names as m, sinkscope.pretrained_analysis.prompts as p; print(m.__file__); print(p.BUILTIN_PROMPTS)"
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    module_file, prompts_file = done.stdout.split()
    assert Path(module_file).is_relative_to(site) and Path(prompts_file).is_file()
    cli = subprocess.run([sys.executable, "-m", "sinkscope", "--version"], cwd=tmp_path, env=env, capture_output=True)
    assert cli.returncode == 0 and cli.stdout.startswith(b"sinkscope "), cli.stderr  # the command line is in it
    for old_name in LAYER_FOLDERS:
        failed = subprocess.run(
            [sys.executable, "-c", f"import {old_name}"], cwd=tmp_path, env=env, capture_output=True
        )
        assert failed.returncode != 0 and b"ModuleNotFoundError" in failed.stderr, old_name
