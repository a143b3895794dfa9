"""Running code as an ordinary user from tests that run as root (read-only files mean
nothing to root): a child process imports what it needs as root (the interpreter and its
packages may live where an ordinary user cannot read), then drops to ``nobody`` and runs
the code. Where the tests already run as an ordinary user, the code just runs."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

TESTS = Path(__file__).resolve().parent

DROP = """
import os, pwd
if os.geteuid() == 0:
    _nobody = pwd.getpwnam("nobody")
    os.setgroups([])
    os.setgid(_nobody.pw_gid)
    os.setuid(_nobody.pw_uid)
"""


def shared_folder() -> Path:
    """A fresh folder that an ordinary user may write in (under /tmp, mode 0777)."""
    folder = Path(tempfile.mkdtemp(prefix="fastseq-user-", dir="/tmp"))
    folder.chmod(0o777)
    return folder


def writable_folder(path: Path) -> Path:
    """``path`` made a folder that an ordinary user may write in (mode 0777)."""
    path.mkdir()
    path.chmod(0o777)
    return path


def printing_export_error(statement: str) -> str:
    """Code that runs ``statement`` (one line or several) and prints the ExportError it
    raises, or ``written`` if it raises none."""
    body = "".join(f"    {line}\n" for line in statement.splitlines())
    return f"try:\n{body}except fastseq.ExportError as e:\n    print(e)\nelse:\n    print('written')\n"


def run(code: str, warm: str = "", cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Runs ``warm`` (imports, a first call that loads every module ``code`` needs) with the
    test's rights, then ``code`` as ``nobody``."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    script = f"import sys\n{warm}\n{DROP}\n{code}\n"
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=cwd, env=env, timeout=300)
