"""Checks a release build: one wheel and one sdist in a folder, as tools/build_dist.sh makes them.

    python tools/check_dist.py DIST_FOLDER
    python tools/check_dist.py --version      # the version a release is tagged with


The wheel: abi3 for CPython 3.11+, a manylinux tag of glibc 2.17 or older that auditwheel
confirms from the extension's symbols, at most 5 MB, the version Cargo.toml sets, and every
file of python/fastseq (the modules, ``_core.pyi``, ``py.typed``, the shipped models) beside
the built ``_core`` extension. The sdist: what building the wheel needs (Cargo.toml and
Cargo.lock, the Rust sources and the vendored ONNX schema, pyproject.toml, the package, the
README). Exit status 1 and one line per problem when anything is off.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from email.parser import Parser
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "python" / "fastseq"
#: the distribution's name (pyproject.toml's; the package imports as fastseq), and the
#: prefix of its files as maturin names them (``fastseq_onnx-0.1.0-....whl``)
DISTRIBUTION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["name"]
FILE_PREFIX = re.sub(r"[-_.]+", "_", DISTRIBUTION)
MAX_WHEEL_BYTES = 5 * 1024 * 1024
#: the newest glibc a Linux wheel may need (manylinux2014 = manylinux_2_17)
MAX_GLIBC = (2, 17)
#: what the sdist must hold to build the wheel, relative to its top folder
SDIST_NEEDS = [
    "Cargo.toml",
    "Cargo.lock",
    "pyproject.toml",
    "README.md",
    "PKG-INFO",
    "crates/fastseq/src/lib.rs",
    "crates/fastseq/proto/onnx-ml.proto",
    "crates/fastseq-python/src/lib.rs",
    "crates/vendor/prost-derive/Cargo.toml",
    "crates/vendor/prost-derive/src/lib.rs",  # Cargo.toml's [patch]
    "python/fastseq/__init__.py",
    "python/fastseq/_core.pyi",
    "python/fastseq/py.typed",
    "python/fastseq/ops/shipped/digits.onnx",
]


def cargo_version() -> str:
    """The crate's version: ``[package] version``, or the workspace's where the package
    takes it from there (``version.workspace = true``)."""
    cargo = tomllib.loads((ROOT / "Cargo.toml").read_text())
    version = cargo.get("package", {}).get("version")
    if isinstance(version, str):
        return version
    return cargo["workspace"]["package"]["version"]


def pep440(version: str) -> str:
    """Cargo's semver as maturin writes it in the metadata: ``0.2.0-rc.1`` -> ``0.2.0rc1``."""
    m = re.fullmatch(r"(\d+\.\d+\.\d+)(?:-(alpha|beta|rc)\.?(\d+))?", version)
    if not m:
        return version
    release, kind, n = m.groups()
    return release + ({"alpha": "a", "beta": "b", "rc": "rc"}[kind] + n if kind else "")


def package_files() -> set[str]:
    """Every file of the package that the wheel must carry: git's list of python/fastseq
    (so that a stray file in a checkout is not asked for), or the folder's files less build
    output (bytecode, the extension ``maturin develop`` puts there) outside git."""
    r = subprocess.run(["git", "ls-files", "-z", "python/fastseq"], cwd=ROOT, capture_output=True)
    if r.returncode == 0 and r.stdout:
        files = [ROOT / f for f in r.stdout.decode().split("\0") if f]
    else:
        files = [
            p
            for p in PACKAGE.rglob("*")
            if p.is_file()
            and "__pycache__" not in p.parts
            and not (p.name.startswith("_core.") and p.name != "_core.pyi")
        ]
    return {"fastseq/" + p.relative_to(PACKAGE).as_posix() for p in files}


def glibc_of(tag: str) -> tuple[int, int] | None:
    m = re.match(r"manylinux_(\d+)_(\d+)_", tag)
    if m:
        return int(m.group(1)), int(m.group(2))
    legacy = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}
    return legacy.get(tag.split("_")[0])


def check_wheel(wheel: Path, version: str) -> list[str]:
    problems = []
    size = wheel.stat().st_size
    print(f"{wheel.name}: {size / 1e6:.2f} MB")
    if size > MAX_WHEEL_BYTES:
        problems.append(f"{wheel.name}: {size} bytes, over the 5 MB budget")
    name, ver, py, abi, platforms = wheel.name[: -len(".whl")].split("-")
    if ver != pep440(version):
        problems.append(f"{wheel.name}: version {ver}, Cargo.toml says {version}")
    if (py, abi) != ("cp311", "abi3"):
        problems.append(f"{wheel.name}: tagged {py}-{abi}, not cp311-abi3 (one wheel for CPython 3.11+)")
    tags = platforms.split(".")
    if sys.platform.startswith("linux"):
        glibcs = [glibc_of(t) for t in tags]
        if not all(glibcs) or min(glibcs) > MAX_GLIBC:
            problems.append(f"{wheel.name}: platform {platforms}, not manylinux_2_17 or older")
        problems += check_auditwheel(wheel)
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        metadata = Parser().parsestr(z.read(f"{FILE_PREFIX}-{ver}.dist-info/METADATA").decode())
        entry_points = z.read(f"{FILE_PREFIX}-{ver}.dist-info/entry_points.txt").decode()
    if name != FILE_PREFIX or metadata["Name"] != DISTRIBUTION:
        problems.append(f"{wheel.name}: distribution {metadata['Name']}, pyproject.toml says {DISTRIBUTION}")
    if metadata["Version"] != pep440(version):
        problems.append(f"{wheel.name}: METADATA says version {metadata['Version']}, Cargo.toml {version}")
    extras = set(metadata.get_all("Provides-Extra") or ())
    if not {"cpu", "gpu"} <= extras:
        problems.append(f"{wheel.name}: extras {sorted(extras)} lack cpu or gpu")
    if not re.search(r"^fastseq\s*=\s*fastseq\.cli:main\s*$", entry_points, re.M):
        problems.append(f"{wheel.name}: no `fastseq` command in entry_points.txt")
    extension = [n for n in names if re.fullmatch(r"fastseq/_core\.(abi3\.so|pyd)", n)]
    if len(extension) != 1:
        problems.append(f"{wheel.name}: expected one fastseq/_core extension, found {extension}")
    missing = sorted(package_files() - names)
    if missing:
        problems.append(f"{wheel.name}: lacks {missing}")
    strays = sorted(n for n in names if "__pycache__" in n or n.endswith(".pyc"))
    if strays:
        problems.append(f"{wheel.name}: carries build output {strays[:5]}")
    print(f"{wheel.name}: {len(names)} files, extension {extension}, extras {sorted(extras)}")
    return problems


def check_auditwheel(wheel: Path) -> list[str]:
    """auditwheel reads the extension's symbol versions and names the manylinux tags they
    allow: the wheel's own tag must be among them."""
    r = subprocess.run([sys.executable, "-m", "auditwheel", "show", str(wheel)], capture_output=True, text=True)
    text = " ".join((r.stdout + r.stderr).split())
    print(f"auditwheel: {text}")
    m = re.search(r'consistent with the following platform tag: "([^"]+)"', text)
    if r.returncode != 0 or not m:
        return [f"{wheel.name}: auditwheel could not place it: {text}"]
    allowed = glibc_of(m.group(1))
    if allowed is None or allowed > MAX_GLIBC:
        return [f"{wheel.name}: auditwheel says {m.group(1)}, newer than manylinux_2_17"]
    return []


def check_sdist(sdist: Path, version: str) -> list[str]:
    print(f"{sdist.name}: {sdist.stat().st_size / 1e6:.2f} MB")
    top = f"{FILE_PREFIX}-{pep440(version)}"
    if sdist.name != f"{top}.tar.gz":
        return [f"{sdist.name}: expected {top}.tar.gz (the version in Cargo.toml)"]
    with tarfile.open(sdist) as t:
        names = {n.removeprefix(top + "/") for n in t.getnames()}
        info = Parser().parsestr(t.extractfile(f"{top}/PKG-INFO").read().decode())
    problems = [f"{sdist.name}: lacks {n}" for n in SDIST_NEEDS if n not in names]
    missing = sorted(f"python/{n}" for n in package_files() if f"python/{n}" not in names)
    if missing:
        problems.append(f"{sdist.name}: lacks {missing}")
    if info["Version"] != pep440(version):
        problems.append(f"{sdist.name}: PKG-INFO says version {info['Version']}, Cargo.toml {version}")
    return problems


def main(argv: list[str]) -> int:
    if argv == ["--version"]:
        print(pep440(cargo_version()))
        return 0
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    folder = Path(argv[0])
    wheels, sdists = sorted(folder.glob(f"{FILE_PREFIX}-*.whl")), sorted(folder.glob(f"{FILE_PREFIX}-*.tar.gz"))
    if len(wheels) != 1 or len(sdists) != 1:
        print(f"check_dist: expected one wheel and one sdist in {folder}, found {wheels + sdists}", file=sys.stderr)
        return 1
    version = cargo_version()
    problems = check_wheel(wheels[0], version) + check_sdist(sdists[0], version)
    for p in problems:
        print(f"check_dist: {p}", file=sys.stderr)
    if not problems:
        print(f"check_dist: {wheels[0].name} and {sdists[0].name} are complete (version {version})")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
