"""The README's "Running A and B on two machines" steps, run as written on one machine.

The block between ``<!-- two-machines:begin -->`` and ``<!-- two-machines:end -->`` is run
by bash in a scratch directory holding only ``deploy/hosts/`` (the configs it names), with
four changes, each of which must apply exactly where the README has it: the three host
names become ``127.0.0.1``; ``vesper train``'s ``--epochs 20`` becomes 1; the ports (in the
block and in the copied configs) become free ones, so the test never collides with a
service that already holds 50051-50053 or 8080. Nothing else is edited: a wrong flag, a
config key the services refuse or a step out of order fails the script and this test.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- two-machines:begin -->", "<!-- two-machines:end -->"
HOST_VARIABLES = ("ACCOUNTANT_HOST", "PLATFORM_HOST", "BANK_HOST")
PORTS = (50051, 50052, 50053, 8080)  # party A, party B, the accountant's gRPC and REST
SCRIPT_TIMEOUT_S = 420


def readme_block(readme: str) -> str:
    """The shell commands between the markers (one fenced block)."""
    assert readme.count(BEGIN) == 1 and readme.count(END) == 1, f"README.md needs one {BEGIN} ... {END} pair"
    marked = readme.split(BEGIN, 1)[1].split(END, 1)[0]
    blocks = re.findall(r"```(?:sh|bash)?\n(.*?)```", marked, re.S)
    assert len(blocks) == 1, f"expected one fenced block between the markers, found {len(blocks)}"
    return blocks[0]


def _substitute(pattern: str, replacement: str, text: str, what: str, flags: int = 0) -> str:
    changed, count = re.subn(pattern, replacement, text, flags=flags)
    assert count >= 1, f"the README's two-machine steps no longer contain {what} (pattern {pattern!r})"
    return changed


def loopback_script(block: str, ports: dict[int, int], epochs: int) -> str:
    """The README's block with the hosts on loopback, fewer epochs and the given ports."""
    for name in HOST_VARIABLES:
        block = _substitute(rf"^{name}=\S+", f"{name}=127.0.0.1", block, f"the line {name}=...", re.M)
    block = _substitute(r"^(vesper train .*--epochs )20\b", rf"\g<1>{epochs}", block, "`vesper train ... --epochs 20`", re.M)
    return _with_ports(block, ports)


def _with_ports(text: str, ports: dict[int, int]) -> str:
    return re.sub(r":(\d+)\b", lambda m: f":{ports.get(int(m.group(1)), int(m.group(1)))}", text)


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("0.0.0.0", 0))  # the services listen on every interface, as the configs say
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _copy_host_configs(target: Path, ports: dict[int, int]) -> None:
    source = ROOT / "deploy" / "hosts"
    target.mkdir(parents=True)
    seen: set[int] = set()
    for config in sorted(source.glob("*.toml")):
        text = config.read_text()
        seen |= {int(p) for p in re.findall(r":(\d+)\b", text)} & set(ports)
        (target / config.name).write_text(_with_ports(text, ports))
    assert seen == set(ports), f"deploy/hosts/*.toml should name the ports {sorted(ports)}, found {sorted(seen)}"


def _stop_group(pgid: int) -> None:
    """End the script's process group (bash and the services it started with `&`), by its id."""
    for sig, wait_s in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.2)


def _tools() -> dict[str, str]:
    vesper = Path(sys.executable).parent / "vesper"
    if not vesper.exists():
        pytest.skip(f"vesper's console script is not installed beside {sys.executable} (pip install -e .)")
    found = {}
    for tool in ("bash", "sed", "timeout", "python3"):
        path = shutil.which(tool)
        if path is None:
            pytest.skip(f"the README's two-machine steps need `{tool}`, which is not on PATH")
        found[tool] = path
    return found


def test_the_readme_block_is_marked_and_parameterised() -> None:
    block = readme_block((ROOT / "README.md").read_text())
    script = loopback_script(block, dict(zip(PORTS, range(40001, 40005))), epochs=1)
    assert "example.internal" not in script
    for name in HOST_VARIABLES:
        assert f"{name}=127.0.0.1" in script
    assert "--epochs 1 " in script and ":40004" in script  # the REST port in `vesper status --url`
    for role in ("accountant", "bank", "platform"):
        assert (ROOT / "deploy" / "hosts" / f"{role}.toml").is_file()


@pytest.mark.e2e
@pytest.mark.slow
def test_the_readme_two_machine_steps_run_as_written_on_loopback(tmp_path: Path) -> None:
    tools = _tools()
    ports = dict(zip(PORTS, _free_ports(len(PORTS))))
    script = loopback_script(readme_block((ROOT / "README.md").read_text()), ports, epochs=1)
    _copy_host_configs(tmp_path / "deploy" / "hosts", ports)
    (tmp_path / "steps.sh").write_text(script)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    log_path = tmp_path / "steps.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [tools["bash"], "-eu", "steps.sh"], cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: the services it starts with `&` end with it
        )
        try:
            code = process.wait(timeout=SCRIPT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            _stop_group(process.pid)
    output = log_path.read_text()
    assert code is not None, f"the README's steps did not finish in {SCRIPT_TIMEOUT_S} s:\n{output[-6000:]}"
    assert code == 0, f"the README's steps failed (exit {code}):\n{output[-6000:]}"

    summary = json.loads((tmp_path / "run.json").read_text())
    assert summary["status"] == "completed" and summary["dataset"] == "customers-aligned"
    assert summary["epsilon_spent"] <= summary["epsilon_budget"] == 8.0
    assert summary["label_privacy"] == "rr" and summary["label_epsilon_spent"] <= 2.0  # what bank.toml requires
    run_id = summary["run_id"]
    words = " ".join(output.split())  # the commands wrap their lines to the terminal's width
    assert f"run {run_id} (completed)" in words  # vesper status, over https
    assert f"run {run_id}.labels (completed)" in words  # B's label ledger beside A's
    assert words.count("exactly as recorded") == 2, output[-4000:]  # both `vesper ledger verify`
    assert (tmp_path / "eps.png").stat().st_size > 0
    assert (tmp_path / ".vesper" / "accountant" / "ledger.sqlite").is_file()
    assert all((tmp_path / ".vesper" / "tokens" / name).stat().st_mode & 0o077 == 0
               for name in ("charge.token", "label-charge.token"))
