"""One version, set in Cargo.toml: pyproject.toml takes it from there (``dynamic``), and the
package, the core, the installed metadata, ``fastseq --version`` and the changelog agree."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
import tomllib

import fastseq
from conftest import ROOT
from fastseq import _core

sys.path.insert(0, str(ROOT / "tools"))
import check_dist


def test_the_version_is_set_once_in_cargo_toml():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "version" not in project and project["dynamic"] == ["version"]
    assert re.fullmatch(r"\d+\.\d+\.\d+(-(alpha|beta|rc)\.\d+)?", check_dist.cargo_version())


def test_package_core_and_metadata_agree():
    version = check_dist.cargo_version()
    assert fastseq.__version__ == _core.__version__ == version
    # the distribution installs the package under another name (fastseq-onnx: "fastseq" is taken)
    assert importlib.metadata.version(check_dist.DISTRIBUTION) == check_dist.pep440(version)


def test_the_command_reports_the_version_and_the_cores_build():
    r = subprocess.run([sys.executable, "-m", "fastseq", "--version"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == f"fastseq {fastseq.__version__}"
    assert f"core: {_core.__version__} ({_core.__build__})" in lines
    assert re.fullmatch(r"\w+-\w+(-\w+)? (release|debug)", _core.__build__)
    assert any(line.startswith("runtime: onnxruntime") for line in lines)


def test_the_changelog_has_an_unreleased_section_and_this_version():
    text = (ROOT / "CHANGELOG.md").read_text()
    sections = re.findall(r"^## \[([^\]]+)\]", text, re.M)
    assert sections[0] == "Unreleased"
    assert check_dist.pep440(check_dist.cargo_version()) in sections[1:], sections
