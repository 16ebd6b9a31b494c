"""The container deployment (docs/deployment.md): docker-compose.yml, deploy/*.Dockerfile,
deploy/*.toml (`vesper health`: test_health_command.py).

Here the compose file and the Dockerfiles are checked for structure and for agreement with
the configs they mount, and (marker slow) the one install script every Dockerfile RUNs is run
in a fresh virtual environment, whose `vesper` then serves and answers its health check. The
images themselves are built and run with podman by tests/test_containers.py
(make test-containers).
"""

from __future__ import annotations

import fnmatch
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from urllib.parse import urlsplit

import pytest
import yaml
from service_commands import accountant_config, free_port, port_of, vesper

from vesper.common.charge_token import ensure_distinct_tokens
from vesper.common.config import VesperConfig, load_config

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES = {"accountant": "accountant", "party-b": "party_b", "party-a": "party_a"}  # compose name -> config section
KEY_OWNER = {"accountant": "accountant", "party-b": "party-b", "party-a": "party-a", "coordinator": "coordinator"}
TORCH_SPEC = "torch==2.13.0"
IMAGE_UID = 10001


# -- reading the compose file -----------------------------------------------------------------
@dataclass(frozen=True)
class Mount:
    source: str  # a named volume, or a host path relative to the compose file
    target: PurePosixPath
    read_only: bool

    @property
    def is_named_volume(self) -> bool:
        return not self.source.startswith((".", "/"))

    @property
    def host_path(self) -> Path:
        return (ROOT / self.source).resolve()


def mounts(service: str) -> list[Mount]:
    found = []
    for entry in COMPOSE["services"][service].get("volumes", []):
        if isinstance(entry, str):
            source, target, *mode = entry.split(":")
            found.append(Mount(source, PurePosixPath(target), bool(mode) and "ro" in mode[0].split(",")))
        else:
            found.append(Mount(entry["source"], PurePosixPath(entry["target"]), bool(entry.get("read_only"))))
    return found


def mount_of(service: str, path: PurePosixPath | Path | str) -> Mount | None:
    """The mount that holds ``path`` in ``service``'s container (the deepest one)."""
    path = PurePosixPath(str(path))
    holding = [m for m in mounts(service) if path == m.target or m.target in path.parents]
    return max(holding, key=lambda m: len(m.target.parts), default=None)


def config_mount(service: str) -> Mount:
    """The service's TOML file: what its health check reads (the coordinator has one TOML file)."""
    if "healthcheck" not in COMPOSE["services"][service]:
        (toml,) = [m for m in mounts(service) if m.target.suffix == ".toml"]
        return toml
    test = COMPOSE["services"][service]["healthcheck"]["test"]
    target = PurePosixPath(test[test.index("--config") + 1])
    mount = mount_of(service, target)
    assert mount is not None and mount.target == target, f"{service}: health check reads {target}, which is not mounted"
    return mount


def config_of(service: str) -> VesperConfig:
    return load_config(config_mount(service).host_path)


def container_ports(service: str) -> set[int]:
    ports = set()
    for entry in COMPOSE["services"][service].get("ports", []):
        ports.add(int(str(entry).split(":")[-1].split("/")[0]))
    return ports


def listen_ports(service: str) -> set[int]:
    settings = getattr(config_of(service), SERVICES[service])
    ports = {port_of(settings.listen)}
    if service == "accountant":
        ports.add(port_of(settings.rest_listen))
    return ports


# -- compose ------------------------------------------------------------------------------------
def test_compose_builds_the_three_services_from_dockerfiles_in_deploy() -> None:
    assert set(SERVICES) <= set(COMPOSE["services"])
    for service in SERVICES:
        build = COMPOSE["services"][service]["build"]
        assert build["context"] == ".", f"{service}: the build context must be the repository root"
        dockerfile = ROOT / build["dockerfile"]
        assert dockerfile.is_file() and dockerfile.parent == DEPLOY, f"{service}: {dockerfile} is not in deploy/"
    built = {COMPOSE["services"][s]["image"] for s in SERVICES}
    coordinator = COMPOSE["services"]["coordinator"]
    assert "build" not in coordinator and coordinator["image"] in built, "the coordinator reuses a built image"
    assert coordinator["profiles"] == ["tools"], "`docker compose up` must not start the one-off coordinator"


def test_every_service_runs_as_the_images_unprivileged_user_and_restarts() -> None:
    for name, service in COMPOSE["services"].items():
        user = str(service.get("user", ""))
        uid = user.split(":")[0]
        assert uid.isdigit() and int(uid) != 0, f"{name}: user {user!r} must be a numeric non-root uid"
        assert int(uid) == IMAGE_UID, f"{name}: user {user!r} is not the images' uid {IMAGE_UID} (the volumes belong to it)"
        assert service.get("restart") in {"unless-stopped", "always", "on-failure", "no"}
    for name in SERVICES:
        assert COMPOSE["services"][name]["restart"] == "unless-stopped", f"{name} must come back after a crash"


def test_health_checks_ask_vesper_health_with_the_mounted_config() -> None:
    for service in SERVICES:
        check = COMPOSE["services"][service]["healthcheck"]
        test = check["test"]
        assert test[0] == "CMD" and test[1:3] == ["vesper", "health"], f"{service}: {test}"
        assert test[-1] == service, f"{service}: the health check asks {test[-1]}"
        mount = config_mount(service)
        assert mount.read_only and mount.host_path.is_file(), f"{service}: {mount.source} must exist and be mounted :ro"
        assert mount.host_path.parent == DEPLOY
        for key in ("interval", "timeout", "retries", "start_period"):
            assert key in check, f"{service}: healthcheck.{key} is missing"


def test_services_start_after_the_services_they_call_are_healthy() -> None:
    needs = {"accountant": set(), "party-b": {"accountant"}, "party-a": {"accountant", "party-b"}, "coordinator": {"party-a"}}
    for service, wanted in needs.items():
        depends = COMPOSE["services"][service].get("depends_on", {})
        assert set(depends) == wanted, f"{service} depends on {sorted(depends)}, expected {sorted(wanted)}"
        for peer, condition in depends.items():
            assert condition == {"condition": "service_healthy"}, f"{service} -> {peer}: {condition}"


def test_named_volumes_are_declared_and_used() -> None:
    used = {m.source for service in COMPOSE["services"] for m in mounts(service) if m.is_named_volume}
    declared = set(COMPOSE.get("volumes") or {})
    assert used == declared, f"used but not declared: {used - declared}; declared but unused: {declared - used}"
    assert {"accountant-ledger", "party-a-workdir", "party-b-workdir", "platform-data", "bank-data"} <= declared


def test_host_files_are_mounted_read_only_and_exist_or_are_made_by_the_documented_commands() -> None:
    for service in COMPOSE["services"]:
        for mount in mounts(service):
            if mount.is_named_volume:
                continue
            assert mount.read_only, f"{service}: {mount.source} is a host file mounted writable"
            relative = mount.host_path.relative_to(DEPLOY)  # every host file lives in deploy/
            if relative.parts[0] == "secrets":
                # made on the host by `vesper certs --out deploy/secrets/tls` and deploy/make-tokens.sh
                kind, name = relative.parts[1:]
                if kind == "tls":
                    assert re.fullmatch(r"ca\.pem|(accountant|party-a|party-b|coordinator)\.(pem|key)", name), name
                else:
                    assert kind == "tokens" and name in {"charge.token", "label-charge.token"}, relative
            else:
                assert mount.host_path.is_file(), f"{service}: {mount.source} does not exist"


def test_each_container_gets_only_its_own_key_and_token() -> None:
    for service, owner in KEY_OWNER.items():
        names = {mount.host_path.name for mount in mounts(service) if not mount.is_named_volume}
        keys = {name for name in names if name.endswith(".key")}
        assert keys == {f"{owner}.key"}, f"{service} gets keys {sorted(keys)}"
        assert "ca.key" not in names
        tokens = {name for name in names if name.endswith(".token")}
        expected = {
            "accountant": {"charge.token", "label-charge.token"},  # it verifies both
            "party-a": {"charge.token"},
            "party-b": {"label-charge.token"},
            "coordinator": set(),
        }[service]
        assert tokens == expected, f"{service} gets tokens {sorted(tokens)}, expected {sorted(expected)}"


def test_published_ports_are_the_listen_ports() -> None:
    for service in SERVICES:
        published, listening = container_ports(service), listen_ports(service)
        assert published == listening, f"{service} publishes {sorted(published)} but listens on {sorted(listening)}"
        assert all(p != 0 for p in listen_ports(service)), f"{service}: a container needs fixed ports"


def test_configs_name_their_peers_by_compose_service_and_listen_port() -> None:
    a, b = config_of("party-a"), config_of("party-b")
    accountant = config_of("accountant").accountant
    assert a.coordinator is not None and config_mount("coordinator").host_path == config_mount("party-a").host_path
    calls = {
        "party_a.label_party": (a.party_a.label_party, "party-b"),
        "party_a.accountant": (a.party_a.accountant, "accountant"),
        "party_b.accountant": (b.party_b.accountant, "accountant"),
        "coordinator.party_a": (a.coordinator.party_a, "party-a"),
    }
    for key, (address, service) in calls.items():
        host, port = address.rsplit(":", 1)
        assert host == service, f"{key} = {address}: the host must be the compose service {service}"
        assert int(port) == port_of(getattr(config_of(service), SERVICES[service]).listen), f"{key} = {address}"
    rest_port = port_of(accountant.rest_listen)
    for key, url in {
        "party_a.accountant_status_url": a.party_a.accountant_status_url,
        "party_b.accountant_status_url": b.party_b.accountant_status_url,
        "coordinator.accountant_status_url": a.coordinator.accountant_status_url,
    }.items():
        parts = urlsplit(url)
        assert (parts.scheme, parts.hostname, parts.port) == ("https", "accountant", rest_port), f"{key} = {url}"


def test_every_path_in_the_configs_is_inside_a_suitable_mount() -> None:
    # (service, path, what the mount must be): state on a writable named volume, inputs read-only
    a, b = config_of("party-a"), config_of("party-b")
    accountant = config_of("accountant").accountant
    writable, read_only = "writable volume", "read-only"
    paths = [
        ("accountant", accountant.ledger, writable),
        ("accountant", accountant.charge_token_file, read_only),
        ("accountant", accountant.label_charge_token_file, read_only),
        ("party-a", a.party_a.workdir / "checkpoint", writable),
        ("party-a", a.party_a.accountant_token_file, read_only),
        ("party-b", b.party_b.workdir / "checkpoint", writable),
        ("party-b", b.party_b.receipt_log, writable),
        ("party-b", b.party_b.accountant_token_file, read_only),
        *[("party-a", path, read_only) for path in a.party_a.datasets.values()],
        *[("party-b", path, read_only) for path in b.party_b.datasets.values()],
    ]
    for service, settings in (
        ("accountant", accountant), ("party-a", a.party_a), ("party-b", b.party_b), ("coordinator", a.coordinator)
    ):
        assert settings.tls is not None, f"{service}: the deployment runs with mutual TLS"
        paths += [(service, settings.tls.ca_file, read_only), (service, settings.tls.cert_file, read_only),
                  (service, settings.tls.key_file, read_only)]
        assert settings.tls.key_file.name == f"{KEY_OWNER[service]}.key"
    for service, path, kind in paths:
        mount = mount_of(service, path)
        assert mount is not None, f"{service}: {path} is in no mounted volume or file"
        if kind == writable:
            assert mount.is_named_volume and not mount.read_only, f"{service}: {path} must be on a writable named volume"
        else:
            assert mount.read_only, f"{service}: {path} must be mounted read-only"
    # and a token or key file is mounted as that very file, not found in some directory
    for service, path, _kind in paths:
        if str(path).endswith((".token", ".key", ".pem")):
            assert mount_of(service, path).target == PurePosixPath(str(path)), f"{service}: {path}"


def test_gpu_override_reserves_gpus_for_party_a_only() -> None:
    override = yaml.safe_load((DEPLOY / "compose.gpu.yml").read_text())
    assert set(override["services"]) == {"party-a"}
    devices = override["services"]["party-a"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]


# -- Dockerfiles ----------------------------------------------------------------------------------
def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    lines, current = [], ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not current and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        current += line
        lines.append(current)
        current = ""
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "") for line in lines]


def instruction(path: Path, name: str) -> list[str]:
    return [args for instr, args in dockerfile_instructions(path) if instr == name]


def build_args(path: Path) -> dict[str, str]:
    """The Dockerfile's ARGs and their defaults."""
    found = {}
    for args in instruction(path, "ARG"):
        name, _, default = args.partition("=")
        found[name] = shlex.split(default)[0] if shlex.split(default) else ""
    return found


def install_commands(path: Path) -> dict[str, list[str]]:
    """The shared install step's arguments (after the script's path) per --step, with the build
    arguments' defaults put in for $NAME: {"torch": [...], "vesper": [...]}."""
    defaults = build_args(path)
    steps = {}
    for args in instruction(path, "RUN"):
        words = shlex.split(args)
        for i, word in enumerate(words):
            if word.endswith("install.sh"):
                rest = [defaults.get(w[1:], w) if w.startswith("$") else w for w in words[i + 1 :]]
                assert rest[:1] == ["--step"], f"{path.name}: install.sh without --step: {rest}"
                steps[rest[1]] = rest[2:]
    assert set(steps) == {"torch", "vesper"}, f"{path.name} RUNs install.sh steps {sorted(steps)}"
    return steps


def install_command(path: Path) -> list[str]:
    """The torch step's VENV TORCH_SPEC [TORCH_INDEX_URL], defaults put in (--wheels left out)."""
    words = install_commands(path)["torch"]
    while words and words[0].startswith("--"):
        words = words[2:]
    return words


def install_stage(path: Path) -> str:
    """The Dockerfile's text from its first ARG to the end of the install stage's last RUN."""
    text = path.read_text()
    start = text.index("\nARG BASE_IMAGE")
    end = text.index("COPY --from=install /opt/vesper /opt/vesper")
    return text[start:end]


@pytest.mark.parametrize("service", list(SERVICES))
def test_dockerfile_is_minimal_non_root_and_runs_the_shared_install(service: str) -> None:
    path = ROOT / COMPOSE["services"][service]["build"]["dockerfile"]
    users = instruction(path, "USER")
    assert users, f"{path.name} has no USER"
    uid = users[-1].split(":")[0]
    assert uid not in {"root", "0"} and int(uid) == IMAGE_UID, f"{path.name}: USER {users[-1]}"

    venv, torch_spec, *index = install_command(path)
    assert venv == "/opt/vesper" and torch_spec == TORCH_SPEC, f"{path.name}: install.sh {venv} {torch_spec}"
    # every image, party A's too, takes the CPU build by default (A's CUDA build: a build argument)
    assert index == ["https://download.pytorch.org/whl/cpu"], f"{path.name}: {index}"
    vesper_step = install_commands(path)["vesper"]
    assert vesper_step[-2:] == ["/opt/vesper", TORCH_SPEC], f"{path.name}: install.sh --step vesper {vesper_step}"
    assert "PATH=/opt/vesper/bin" in " ".join(instruction(path, "ENV"))

    config = str(config_mount(service).target)
    (entrypoint,) = instruction(path, "ENTRYPOINT")
    assert yaml.safe_load(entrypoint) == ["vesper", "serve", service, "--config", config]
    (healthcheck,) = instruction(path, "HEALTHCHECK")
    command = yaml.safe_load(healthcheck.split("CMD", 1)[1].strip())
    assert command == ["vesper", "health", "--config", config, service]
    exposed = {int(p) for args in instruction(path, "EXPOSE") for p in args.split()}
    assert exposed == listen_ports(service)


def test_images_build_from_a_base_given_as_build_argument_and_share_their_install_stage() -> None:
    stages = {}
    for name in SERVICES:
        path = DEPLOY / f"{name}.Dockerfile"
        assert instruction(path, "FROM") == ["${BASE_IMAGE} AS install", "${BASE_IMAGE}"], f"{name}: two stages"
        args = build_args(path)
        assert args["BASE_IMAGE"] == "python:3.11-slim-bookworm", f"{name}: default base {args['BASE_IMAGE']}"
        assert {"TORCH_SPEC", "TORCH_INDEX_URL", "PIP_INDEX_URL", "WHEELS"} <= set(args), f"{name}: {sorted(args)}"
        assert (ROOT / args["WHEELS"]).is_dir(), f"{name}: the default wheel directory {args['WHEELS']} is missing"
        assert all("--mount=type=secret,id=pip-ca" in run for run in instruction(path, "RUN") if "install.sh" in run)
        stages[name] = install_stage(path)
    # the same text, so a build of the three shares the torch and vesper layers (and the cache
    # key of a bind mount is not trusted: the source comes in by COPY, whose content is hashed)
    assert len(set(stages.values())) == 1, "the install stages of the three Dockerfiles differ"
    assert "--mount=type=bind" not in stages["accountant"]


def test_the_install_stage_copies_every_source_folder_of_the_package() -> None:
    import tomllib

    folders = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"].values())
    copied = {}
    for args in instruction(DEPLOY / "accountant.Dockerfile", "COPY"):
        *sources, target = args.split()
        if target.startswith("/build/src"):
            for source in sources:
                copied[source] = target
    assert {f for f in copied if f in folders} == folders, f"not copied: {sorted(folders - set(copied))}"
    for folder in folders:
        assert copied[folder] == f"/build/src/{folder}", f"COPY {folder} {copied[folder]}"
    assert {"pyproject.toml", "README.md", "deploy/install.sh"} <= set(copied)


def test_party_a_image_takes_the_cuda_build_as_a_documented_build_argument() -> None:
    path = DEPLOY / "party-a.Dockerfile"
    text = path.read_text()
    assert "--build-arg TORCH_INDEX_URL=" in text and "cu126" in text, "party A's Dockerfile documents the CUDA build"
    assert "NVIDIA_DRIVER_CAPABILITIES=compute,utility" in " ".join(instruction(path, "ENV"))
    # docker-compose.yml carries party A's GPU reservation commented out: uncommented, it is the
    # reservation of deploy/compose.gpu.yml
    lines = (ROOT / "docker-compose.yml").read_text().splitlines()
    start = lines.index("    # deploy:")
    block = []
    for line in lines[start:]:
        if not line.startswith("    # "):
            break
        block.append(line.replace("# ", "", 1))
    commented = yaml.safe_load("\n".join(block))
    override = yaml.safe_load((DEPLOY / "compose.gpu.yml").read_text())
    assert commented == {"deploy": override["services"]["party-a"]["deploy"]}, commented
    assert "deploy" not in COMPOSE["services"]["party-a"], "the GPU reservation is off by default"


def test_install_script_refuses_a_vesper_step_without_its_torch_step_and_an_unknown_step(tmp_path: Path) -> None:
    script = str(DEPLOY / "install.sh")
    result = subprocess.run(["sh", script, "--step", "vesper", str(tmp_path / "venv"), TORCH_SPEC],
                            capture_output=True, text=True)
    assert result.returncode == 2 and "run --step torch first" in result.stderr
    result = subprocess.run(["sh", script, "--step", "wheel", str(tmp_path / "venv"), TORCH_SPEC],
                            capture_output=True, text=True)
    assert result.returncode == 2 and "--step must be torch, vesper or all" in result.stderr
    result = subprocess.run(["sh", script, "--wheels", str(tmp_path / "none"), str(tmp_path / "venv"), TORCH_SPEC],
                            capture_output=True, text=True)
    assert result.returncode == 2 and "is not a directory" in result.stderr
    assert not (tmp_path / "venv").exists()


def test_dockerignore_keeps_secrets_and_state_out_of_the_build_context() -> None:
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    for path in ("deploy/secrets", ".git", ".venv", ".vesper"):
        assert path in patterns, f".dockerignore must exclude {path}"
    context = build_context_files()
    assert "pyproject.toml" in context and "README.md" in context and "deploy/install.sh" in context
    assert not [f for f in context if f.startswith(("deploy/secrets/", ".venv/", ".git/", "tests/"))]


def build_context_files() -> list[str]:
    """What docker would send as the build context: the tree less .dockerignore's patterns
    (the patterns used here: plain paths and **/ globs)."""
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]

    def ignored(relative: str) -> bool:
        for pattern in patterns:
            if pattern.startswith("**/"):
                if any(fnmatch.fnmatch(part, pattern[3:]) for part in relative.split("/")):
                    return True
            elif relative == pattern or relative.startswith(pattern + "/") or fnmatch.fnmatch(relative, pattern):
                return True
        return False

    files = []
    for directory, subdirs, names in os.walk(ROOT):
        base = Path(directory).relative_to(ROOT).as_posix()
        prefix = "" if base == "." else base + "/"
        subdirs[:] = [d for d in subdirs if not ignored(prefix + d)]
        files += [prefix + name for name in names if not ignored(prefix + name)]
    return sorted(files)


# -- the helper scripts ---------------------------------------------------------------------------
def test_make_tokens_writes_two_distinct_private_tokens_the_services_accept(tmp_path: Path) -> None:
    out = tmp_path / "tokens"
    first = subprocess.run(["sh", str(DEPLOY / "make-tokens.sh"), str(out)], capture_output=True, text=True, check=True)
    assert first.stdout.count("wrote") == 2
    charge, label = out / "charge.token", out / "label-charge.token"
    assert charge.stat().st_mode & 0o777 == 0o600 and label.stat().st_mode & 0o777 == 0o600
    tokens = ensure_distinct_tokens(charge, label)  # what the accountant reads at start
    again = subprocess.run(["sh", str(DEPLOY / "make-tokens.sh"), str(out)], capture_output=True, text=True, check=True)
    assert again.stdout.count("kept") == 2
    assert ensure_distinct_tokens(charge, label) == tokens, "a second run must keep the tokens the parties hold"


def test_install_script_refuses_an_unpinned_torch(tmp_path: Path) -> None:
    # the pinned form is run in test_install_script_in_a_fresh_venv_serves_and_answers_health
    result = subprocess.run(["sh", str(DEPLOY / "install.sh"), str(tmp_path / "venv"), "torch"], capture_output=True, text=True)
    assert result.returncode == 2 and "must pin torch exactly" in result.stderr
    assert not (tmp_path / "venv").exists()


# -- the images' install step, for real (slow) ----------------------------------------------------
@pytest.mark.slow
def test_install_script_in_a_fresh_venv_serves_and_answers_health(tmp_path: Path) -> None:
    """deploy/install.sh as party B's and the accountant's Dockerfiles RUN it, from a copy of the
    build context: the CPU torch spec; the CPU index URL is not reachable here, so pip's
    configured index supplies the same torch==2.13.0+cpu wheel."""
    source = tmp_path / "src"
    for relative in build_context_files():
        target = source / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / relative, target)
    _venv, torch_spec, *_index = install_command(DEPLOY / "party-b.Dockerfile")
    assert torch_spec == TORCH_SPEC
    venv = tmp_path / "venv"
    env = dict(os.environ)
    env.pop("VIRTUAL_ENV", None)
    if shutil.which("python3.11") is None:
        env["PYTHON"] = sys.executable
    started = time.monotonic()
    install = subprocess.run(["sh", str(source / "deploy" / "install.sh"), str(venv), torch_spec],
                             capture_output=True, text=True, env=env, timeout=1500)
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]
    print(f"install.sh took {time.monotonic() - started:.0f} s")
    assert f"torch {TORCH_SPEC.split('==')[1]}" in install.stdout

    vesper_bin = venv / "bin" / "vesper"
    assert vesper("--help", executable=vesper_bin).returncode == 0
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import vesper.common; print(vesper.common.__file__)"],
                           capture_output=True, text=True, check=True).stdout
    assert str(venv) in where, f"the fresh venv imports vesper from {where}, not its own install"

    workdir = tmp_path / "accountant"
    workdir.mkdir()
    config = accountant_config(workdir, free_port())
    log = (workdir / "accountant.log").open("wb")
    server = subprocess.Popen([str(vesper_bin), "serve", "accountant", "--config", str(config)],
                              stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            health = vesper("health", "--config", str(config), "accountant", executable=vesper_bin)
            if health.returncode == 0 or time.monotonic() > deadline or server.poll() is not None:
                break
            time.sleep(0.5)
        assert health.returncode == 0, health.stderr + (workdir / "accountant.log").read_text()[-2000:]
        assert health.stdout.strip().endswith(": SERVING")
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()


def test_every_python_package_of_the_tree_is_installed_by_pyproject() -> None:
    """A subpackage missing from [tool.setuptools] packages works in the editable install and
    is absent from a real one (the images' install): `vesper` would not start there."""
    import tomllib

    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(setuptools["packages"])
    found = set()
    for package, folder in setuptools["package-dir"].items():
        for init in (ROOT / folder).rglob("__init__.py"):
            relative = init.parent.relative_to(ROOT / folder)
            found.add(".".join([package, *relative.parts]))
    assert found <= listed, f"not in pyproject's packages: {sorted(found - listed)}"
