"""The servers of bench_netserve.py: each started pinned to the server core and waited for
(``/v2/health/ready``), its Triton counters read from /metrics, stopped with its children;
and ``--setup``: wrk, h2load and libb64 from Debian, a venv of its own for each peer (KServe
0.21, MLServer 1.7.1) and for perf_analyzer (the tritonclient==2.40.0 wheel)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import netserve_clients as nc

HERE = Path(__file__).parent
OUT = HERE / "out"
WORK = OUT / "netserve"
VENVS = OUT / "venvs"
MLSERVER_BATCH = {"max_batch_size": 32, "max_batch_time": 0.001}  # adaptive batching: 32 rows or 1 ms
PEERS = {  # venv -> what pip installs there (onnxruntime pinned to this Python's, in setup())
    "kserve": ["kserve==0.21.0", "numpy"],
    "mlserver": ["mlserver==1.7.1", "uvloop<0.22", "numpy"],
    "perf": ["--no-deps", "tritonclient==2.40.0", "nvidia-cuda-runtime-cu12"],
}


class Server:
    """One server process pinned to the server core; ``http``/``grpc`` its ports once ready."""

    def __init__(self, kind: str, case: dict, fastseq: list[str]):
        self.kind, self.http, self.grpc = kind, free_port(), free_port()
        cwd = None
        if kind.startswith("serve"):
            cmd = [
                *fastseq,
                "serve",
                *case["sources"],
                "--name",
                "m",
                "--port",
                str(self.http),
                "--max-batch-size",
                "1" if kind == "serve-b1" else "32",
            ]
            cmd += ["--grpc-port", str(self.grpc)] if kind == "serve" else []
        elif kind == "kserve":
            cmd = [
                str(VENVS / "kserve/bin/python"),
                str(HERE / "netserve_peers/kserve_server.py"),
                str(case["joined"]),
                "--http_port",
                str(self.http),
                "--grpc_port",
                str(self.grpc),
            ]
        else:  # mlserver: a folder with its settings and the runtime
            cwd = case["dir"] / "mlserver"
            cwd.mkdir(exist_ok=True)
            shutil.copy(HERE / "netserve_peers/mlserver_runtime.py", cwd)
            (cwd / "settings.json").write_text(
                json.dumps(
                    {"http_port": self.http, "grpc_port": self.grpc, "metrics_port": free_port(), "debug": False}
                )
            )
            (cwd / "model-settings.json").write_text(
                json.dumps(
                    {
                        "name": "m",
                        "implementation": "mlserver_runtime.OnnxModel",
                        **MLSERVER_BATCH,
                        "parameters": {"uri": str(case["joined"].resolve())},
                    }
                )
            )
            cmd = [str(VENVS / "mlserver/bin/mlserver"), "start", "."]
        self.log = WORK / f"{kind}.log"
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(nc.pinned(nc.SERVER_CORE, cmd), stdout=log, stderr=subprocess.STDOUT, cwd=cwd)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{kind} exited ({self.proc.returncode}) at start: {self.tail()}")
            try:
                if urllib.request.urlopen(f"http://127.0.0.1:{self.http}/v2/health/ready", timeout=2).status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"{kind} not ready in 180 s: {self.tail()}")

    def tail(self) -> str:
        return " / ".join(self.log.read_text(errors="replace").strip().splitlines()[-3:])

    def metrics(self) -> dict[str, float]:
        """Triton's counters from fastseq serve's /metrics (summed over labels); {} where absent."""
        if not self.kind.startswith("serve"):
            return {}
        try:
            text = urllib.request.urlopen(f"http://127.0.0.1:{self.http}/metrics", timeout=10).read().decode()
        except OSError:
            return {}
        found: dict[str, float] = {}
        for line in text.splitlines():
            key = line.split("{")[0].split(" ")[0]
            if key in (
                "nv_inference_request_success",
                "nv_inference_request_failure",
                "nv_inference_count",
                "nv_inference_exec_count",
            ):
                found[key] = found.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
        return found

    def stop(self) -> None:
        family = nc.tree(self.proc.pid)
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for pid in family[1:]:  # MLServer's workers, where the main process left them
            try:
                os.kill(pid, 9)
            except OSError:
                pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def available(modes: dict[str, tuple]) -> tuple[list[str], dict[str, str]]:
    """Of ``modes`` (name -> (server kind, client, ...)), those this machine can run, and why
    each other one is skipped."""
    skipped = {}
    for mode, (kind, client, *_) in modes.items():
        if kind in ("kserve", "mlserver") and not (VENVS / kind / ".ready").exists():
            skipped[mode] = f"no venv at {VENVS / kind} (run --setup)"
        elif client and client.startswith("pa") and nc.perf_analyzer(VENVS / "perf")[0] is None:
            skipped[mode] = f"no perf_analyzer in {VENVS / 'perf'} (run --setup)"
        elif (
            client
            and client.startswith("pa")
            and shutil.which("ldconfig")
            and b"libb64.so.0d" not in (subprocess.run(["ldconfig", "-p"], capture_output=True).stdout)
        ):
            skipped[mode] = "perf_analyzer needs libb64.so.0d (apt-get install -y libb64-0d)"
    return [m for m in modes if m not in skipped], skipped


def setup() -> None:
    """wrk, h2load and libb64 from Debian (where this is root), and the peers' venvs."""
    import onnxruntime

    needs = [pkg for tool, pkg in nc.APT.items() if shutil.which(tool) is None]
    if b"libb64.so.0d" not in subprocess.run(["ldconfig", "-p"], capture_output=True).stdout:
        needs.append("libb64-0d")
    if needs and os.geteuid() == 0 and shutil.which("apt-get"):
        subprocess.run(["apt-get", "update", "-q"], check=False)
        subprocess.run(["apt-get", "install", "-y", "-q", *needs], check=False)
    elif needs:
        print(f"missing: run  sudo apt-get install -y {' '.join(needs)}")
    for name, packages in PEERS.items():
        venv = VENVS / name
        if (venv / ".ready").exists():
            print(f"{name}: ready in {venv}")
            continue
        extra = [] if name == "perf" else [f"onnxruntime=={onnxruntime.__version__}"]
        print(f"{name}: building {venv} ({' '.join(packages + extra)}) ...", flush=True)
        try:
            subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
            subprocess.run([str(venv / "bin/pip"), "install", "-q", *packages, *extra], check=True)
            (venv / ".ready").write_text(" ".join(packages + extra) + "\n")
        except subprocess.CalledProcessError as e:
            print(f"{name}: cannot build the venv ({e}); its modes will be skipped")
    print("still missing: " + ", ".join(nc.missing_tools()) if nc.missing_tools() else "wrk, h2load, taskset: found")
