"""Defects found by trying vesper as a new user and as an attacker would (issue #24), each
checked here without services: the ledger file audited read-only, paths that are not
ledgers, unwritable directories, the bound on B's classes, the one trainer of a run at the
accountant, label-ledger names, error texts, `--help` at 80 columns, the free MLP under
hidden-batch, and the ledger file whole after a clean stop. The ones that need the three
services are in test_reliability_e2e.py."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import dp_accounting as dpa
import numpy as np
import pytest
from e2e import runner

from vesper.accountant.budget import Accountant, AccountantError
from vesper.accountant.leases import Leases
from vesper.accountant.ledger_store import LedgerFileError, LedgerStore
from vesper.common.config import PartyBConfig, RunSummary
from vesper.common.privacy.events import event_to_json
from vesper.common.privacy.ledger import ChargeRule, LedgerView, RunStatusView
from vesper.common.writable import SettingError, check_writable_dir
from vesper.coordinator.cli import app, print_summaries
from vesper.party_b.label_data import load_labels

GAUSS = event_to_json(dpa.GaussianDpEvent(2.0))
RULES = [ChargeRule(kind="train", release_event=GAUSS, participation_bound=None)]


def _chattr(path: Path, flag: str) -> bool:
    """``chattr +i`` / ``-i``: a file or directory even root cannot write (False where it cannot be made)."""
    return subprocess.run(["chattr", flag, str(path)], capture_output=True).returncode == 0


@pytest.fixture
def immutable():
    """Make paths immutable for one test, and always writable again afterwards."""
    made: list[Path] = []

    def make(path: Path) -> None:
        if not shutil.which("chattr") or not _chattr(path, "+i"):
            pytest.skip("an unwritable path cannot be made here: chattr +i failed (not root, or no ext4/xfs)")
        made.append(path)

    yield make
    for path in made:
        _chattr(path, "-i")


def _tree(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()
    }


def _ledger_with_a_run(path: Path) -> str:
    store = LedgerStore(path)
    accountant = Accountant(store)
    accountant.create_run("r1", "edge", "visible-batch", "pld", 8.0, 1e-6, RULES, "pmp-gin", {})
    for i in range(3):
        accountant.charge("r1", f"train-0/{i}", "train-0", "train", 4, "d", GAUSS)
    store.close()
    return "r1"


# -- 5. auditing a ledger never writes it ------------------------------------------------------------
def test_ledger_verify_reads_a_read_only_ledger_and_changes_no_byte(tmp_path: Path, immutable) -> None:
    ledger = tmp_path / "audit" / "ledger.sqlite"
    run = _ledger_with_a_run(ledger)
    assert not Path(f"{ledger}-wal").exists() or Path(f"{ledger}-wal").stat().st_size == 0  # 14: checkpointed
    before = _tree(ledger.parent)
    immutable(ledger)
    immutable(ledger.parent)  # not even a -wal or -shm file may appear beside it
    result = runner.invoke(app, ["ledger", "verify", run, "--ledger", str(ledger)])
    assert result.exit_code == 0 and "verified" in result.output, result.output
    result = runner.invoke(app, ["status", run, "--ledger", str(ledger)])
    assert result.exit_code == 0 and "ε spent" in result.output, result.output
    assert _tree(ledger.parent) == before


def test_a_live_ledger_is_read_with_its_write_ahead_log_and_left_as_it_was(tmp_path: Path) -> None:
    """A copy taken while the accountant runs holds charges in its -wal: the audit reads them too."""
    ledger = tmp_path / "ledger.sqlite"
    store = LedgerStore(ledger)
    accountant = Accountant(store)
    accountant.create_run("r1", "edge", "visible-batch", "pld", 8.0, 1e-6, RULES, "pmp-gin", {})
    accountant.charge("r1", "train-0/0", "train-0", "train", 4, "d", GAUSS)
    assert Path(f"{ledger}-wal").stat().st_size > 0  # still open: the charge is in the log
    main_before = ledger.read_bytes()
    audit = LedgerStore(ledger, read_only=True, setting="--ledger")
    assert len(audit.charges("r1")) == 1
    audit.close()
    assert ledger.read_bytes() == main_before
    store.close()


# -- 6. a ledger path that is not a ledger -----------------------------------------------------------
@pytest.mark.parametrize("kind", ["text", "truncated", "directory", "other database"])
def test_a_path_that_is_not_a_ledger_gets_a_clear_error_and_stays_as_it_was(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "ledger.sqlite"
    if kind == "text":
        path.write_text("this is not a ledger\n")
    elif kind == "truncated":
        _ledger_with_a_run(path)
        path.write_bytes(path.read_bytes()[:60])
    elif kind == "directory":
        path.mkdir()
    else:
        import sqlite3

        with sqlite3.connect(path) as db:
            db.execute("create table notes(x)")
    before = _tree(tmp_path)
    with pytest.raises(LedgerFileError, match="accountant.ledger = "):
        LedgerStore(path)
    for args in (["ledger", "verify", "r1", "--ledger", str(path)], ["status", "--ledger", str(path)]):
        result = runner.invoke(app, args)
        assert result.exit_code in (1, 2) and "--ledger" in result.output and "Traceback" not in result.output, result.output
    config = tmp_path / "accountant.toml"
    config.write_text(f'[accountant]\nledger = "{path}"\nlisten = "127.0.0.1:0"\nrest_listen = "127.0.0.1:0"\n'
                      f'charge_token_file = "{tmp_path / "a.token"}"\nlabel_charge_token_file = "{tmp_path / "b.token"}"\n')
    served = subprocess.run(
        [sys.executable, "-m", "vesper.coordinator", "serve", "accountant", "--config", str(config)],
        capture_output=True, text=True, timeout=120,
    )
    assert served.returncode == 2 and "accountant.ledger = " in served.stderr and "Traceback" not in served.stderr, served.stderr
    assert {k: v for k, v in _tree(tmp_path).items() if not k.endswith((".token", ".toml"))} == before


# -- 4. a service refuses to start on a directory it cannot write --------------------------------------
def test_an_unwritable_workdir_is_refused_at_start_with_the_setting_named(tmp_path: Path, immutable) -> None:
    workdir = tmp_path / "party_b"
    workdir.mkdir()
    immutable(workdir)
    with pytest.raises(SettingError, match=r"party_b.workdir = .*cannot write there"):
        check_writable_dir(workdir, "party_b.workdir")
    config = tmp_path / "b.toml"
    config.write_text(f'[party_b]\nworkdir = "{workdir}"\nlisten = "127.0.0.1:0"\n')
    served = subprocess.run(
        [sys.executable, "-m", "vesper.coordinator", "serve", "party-b", "--config", str(config)],
        capture_output=True, text=True, timeout=120,
    )
    assert served.returncode == 2 and "party_b.workdir = " in served.stderr and "Traceback" not in served.stderr, served.stderr


# -- 7. B's classes are bounded -------------------------------------------------------------------------
def test_a_label_outside_the_class_bound_is_refused_when_the_labels_load(tmp_path: Path) -> None:
    path = tmp_path / "labels.npz"
    labels = np.array([0, 1, 2, 1_000_000_000, 1])
    np.savez(path, node_features=np.zeros((5, 2), np.float32), node_labels=labels, edges=np.zeros((0, 2), np.int64))
    with pytest.raises(ValueError, match=r"label 1000000000 at row 3 is outside 0..999.*party_b.max_classes"):
        load_labels(path, 0, max_classes=PartyBConfig().max_classes)
    store = load_labels(path, 0, max_classes=2_000_000_000)
    assert store.num_classes == 1_000_000_001  # the bound is a setting: raised, the labels load


def test_nan_labels_are_named_as_such_not_as_negative(tmp_path: Path) -> None:
    path = tmp_path / "labels.npz"
    np.savez(path, node_features=np.zeros((3, 2), np.float32), node_labels=np.array([0.0, np.nan, 1.0]),
             edges=np.zeros((0, 2), np.int64))
    with pytest.raises(ValueError, match=r"label at row 1 is nan") as info:
        load_labels(path, 0)
    assert "negative" not in str(info.value)


# -- 1, 2. one trainer per run, at the accountant -------------------------------------------------------
class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_second_trainer_is_refused_while_the_first_ones_lease_lives(tmp_path: Path) -> None:
    clock = Clock()
    accountant = Accountant(LedgerStore(tmp_path / "ledger.sqlite"), Leases(clock))
    accountant.announce_run("r1", "first", 10.0)
    accountant.create_run("r1", "edge", "visible-batch", "pld", 8.0, 1e-6, RULES, "pmp-gin", {}, lease="first", lease_ttl_s=10.0)
    accountant.charge("r1", "train-0/0", "train-0", "train", 4, "d", GAUSS, lease="first")
    before = accountant.store.charges("r1")
    for call in (
        lambda: accountant.reopen_run("r1", "a resume while it trains", "second", 10.0),
        lambda: accountant.charge("r1", "train-0/1", "train-0", "train", 4, "d", GAUSS, lease="second"),
        lambda: accountant.close_run("r1", "failed", "", lease="second"),
        lambda: accountant.announce_run("r2", "x", 10.0) and accountant.renew_lease("r1", "second", 10.0),
    ):
        with pytest.raises(AccountantError) as refused:
            call()
        assert refused.value.code == "ABORTED" and "live trainer" in str(refused.value)
    assert accountant.store.charges("r1") == before and accountant.status("r1").status == "active"
    clock.now = 5.0
    accountant.renew_lease("r1", "first", 10.0)  # the first trainer lives on
    clock.now = 14.0
    with pytest.raises(AccountantError, match="live trainer"):
        accountant.reopen_run("r1", "too early", "second", 10.0)
    clock.now = 16.0  # the first trainer stopped renewing 11 s ago: killed
    accountant.reopen_run("r1", "resume", "second", 10.0)
    with pytest.raises(AccountantError, match="live trainer"):  # the stalled first trainer lost the run
        accountant.charge("r1", "train-0/1", "train-0", "train", 4, "d", GAUSS, lease="first")
    accountant.charge("r1", "train-0/1", "train-0", "train", 4, "d", GAUSS, lease="second")
    accountant.close_run("r1", "completed", "done", lease="second")
    assert accountant.status("r1").status == "completed"


# -- 11. label ledgers cannot squat on run ids ----------------------------------------------------------
def test_party_b_opens_only_the_label_ledger_of_a_run_party_a_announced(tmp_path: Path) -> None:
    accountant = Accountant(LedgerStore(tmp_path / "ledger.sqlite"))
    labels = [ChargeRule(kind="one-shot", release_event=GAUSS, participation_bound=None)]

    def open_labels(run_id: str):
        return accountant.create_run(run_id, "label", "labels", "pld", 4.0, 1e-6, labels, "labels-rr", {})

    for squat in ("squat5", "squat5.labels"):  # any name, or the label ledger of a run nobody announced
        with pytest.raises(AccountantError) as refused:
            open_labels(squat)
        assert refused.value.code == "PERMISSION_DENIED" and "announced or created" in str(refused.value)
    with pytest.raises(AccountantError, match="names party B's label ledgers"):
        accountant.create_run("r9.labels", "edge", "visible-batch", "pld", 8.0, 1e-6, RULES, "pmp-gin", {})
    accountant.announce_run("squat5", "trainer", 30.0)
    open_labels("squat5.labels")
    accountant.create_run("squat5", "edge", "visible-batch", "pld", 8.0, 1e-6, RULES, "pmp-gin", {}, lease="trainer")
    assert {r.run_id for r in accountant.store.list_runs()} == {"squat5", "squat5.labels"}


# -- 13. a release that reads no edge is free under every accounting --------------------------------------
def test_the_mlp_baseline_is_accepted_under_hidden_batch(tmp_path: Path) -> None:
    accountant = Accountant(LedgerStore(tmp_path / "ledger.sqlite"))
    free = [ChargeRule(kind=k, release_event=event_to_json(dpa.NoOpDpEvent()), participation_bound=0) for k in ("train", "eval")]
    view = accountant.create_run("mlp", "edge", "hidden-batch", "pld", 8.0, 1e-6, free, "mlp", {})
    row, _ = accountant.charge("mlp", "train-0/0", "train-0", "train", 4, "d", event_to_json(dpa.NoOpDpEvent()))
    assert view.accounting == "hidden-batch" and row.epsilon_after == 0.0


# -- 14. after a clean stop the ledger file alone is whole -------------------------------------------------
def test_closing_the_ledger_moves_every_charge_into_the_file(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.sqlite"
    _ledger_with_a_run(ledger)  # closes the store, as the accountant does when it stops
    copy = tmp_path / "copy" / "ledger.sqlite"
    copy.parent.mkdir()
    shutil.copy(ledger, copy)  # the file the demo names, without its -wal
    assert len(LedgerStore(copy, read_only=True).charges("r1")) == 3


# -- 10. error texts ----------------------------------------------------------------------------------------
def test_config_errors_name_the_setting_and_the_value_without_a_validation_dump(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text('[run]\nepochs = "many"\n[run.privacy]\ndelta = 2\n[party_a]\nbogus = 1\n')
    result = runner.invoke(app, ["train", "--config", str(config)])
    assert result.exit_code == 2
    assert "run.epochs" in result.output and "(got 'many')" in result.output and "run.privacy.delta" in result.output
    assert "party_a.bogus: not a setting here" in result.output
    assert "pydantic" not in result.output and "https://" not in result.output


def test_a_summary_of_a_run_that_lost_the_accountant_does_not_say_no_charges(capsys) -> None:
    summary = RunSummary(
        run_id="r", status="interrupted", dataset="cora", extractor="pmp-gcn", decoder="concat",
        accounting="visible-batch", epsilon_budget=8, epsilon_spent=3.2, delta=1e-6, steps=678,
        message="accountant at 127.0.0.1:1 failed to charge release train-3/1",
    )
    from vesper.coordinator import cli

    with cli.console.capture() as captured:
        print_summaries([summary])
    text = captured.get()
    assert "no charges" not in text and "the accountant was lost" in text


def test_train_help_keeps_its_descriptions_readable_at_80_columns() -> None:
    result = runner.invoke(app, ["train", "--help"], terminal_width=80, env={"COLUMNS": "80"})
    assert result.exit_code == 0
    lines = result.output.splitlines()
    assert max(len(line) for line in lines) <= 80
    # every description starts at column 34 at the latest, leaving it at least 46 columns
    described = [line for line in lines if line.startswith("  -") and "  " in line.strip()]
    assert described and all(len(line) - len(line.lstrip()) <= 2 for line in described)
    continuation = [line for line in lines if line.startswith(" " * 20) and line.strip()]
    assert continuation and all(len(line) - len(line.lstrip()) <= 34 for line in continuation)


# -- versions: what crosses a process boundary (common/versioning.py) ----------------------------------------
def _summary_json(**extra) -> str:
    summary = RunSummary(
        run_id="r", status="completed", dataset="cora", extractor="mlp", decoder="concat", accounting="visible-batch",
        epsilon_budget=8, epsilon_spent=0, delta=1e-6,
    )
    return json.dumps({**json.loads(summary.model_dump_json()), **extra})


def test_reports_tolerate_added_fields_and_refuse_a_newer_format(tmp_path: Path) -> None:
    """A report (run summary, status view, ledger) from a newer version: additive fields are read past,
    a newer format is refused with what to do."""
    assert RunSummary.model_validate_json(_summary_json(added_in_a_later_version=[1, 2])).run_id == "r"
    with pytest.raises(ValueError, match=r"newer vesper \(format 2; this one reads formats up to 1\): upgrade"):
        RunSummary.model_validate_json(_summary_json(format=2))
    store = LedgerStore(tmp_path / "ledger.sqlite")
    run = _ledger_with_a_run(tmp_path / "other.sqlite")
    audit = Accountant(LedgerStore(tmp_path / "other.sqlite", read_only=True))
    view = json.loads(audit.status(run).model_dump_json())
    assert RunStatusView.model_validate({**view, "a_field_of_tomorrow": True}).run_id == run
    with pytest.raises(ValueError, match="newer vesper"):
        RunStatusView.model_validate({**view, "format": 9})
    ledger_view = LedgerView(run=audit.store.get_run(run), rows=audit.store.charges(run))
    newer = json.loads(ledger_view.model_dump_json())
    newer["rows"][0]["new_column"] = "x"
    assert LedgerView.model_validate(newer).rows[0].seq == 0
    store.close()


def test_a_newer_accountant_is_named_not_dumped_by_vesper_status(tmp_path: Path) -> None:
    """`vesper status` against an accountant whose REST answers in a newer format."""
    import http.server
    import threading

    body = json.dumps({"format": 7, "run_id": "r"}).encode()

    class Newer(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Newer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        result = runner.invoke(app, ["status", "r", "--url", f"http://127.0.0.1:{server.server_port}"])
    finally:
        server.shutdown()
    assert result.exit_code == 1 and "newer vesper" in result.output and "upgrade" in result.output, result.output
    assert "Traceback" not in result.output and "pydantic" not in result.output


def test_settings_are_strict_and_the_coordinator_sends_only_those_given() -> None:
    """A setting a receiver does not know is refused by name; the coordinator sends what was given."""
    from vesper.common.config import ConfigError, RunConfig, validated

    run = RunConfig.model_validate({"epochs": 3, "privacy": {"epsilon": 4.0}})
    sent = json.loads(run.model_dump_json(exclude_unset=True))
    assert sent == {"epochs": 3, "privacy": {"epsilon": 4.0}}
    with pytest.raises(ConfigError, match=r"run.privacy.a_later_setting: not a setting here"):
        validated(RunConfig, {**sent, "privacy": {**sent["privacy"], "a_later_setting": 1}}, "party A", "run")


def test_a_ca_certificate_or_another_roles_certificate_stops_a_service_at_start(tmp_path: Path) -> None:
    """10: a CA certificate as a service's own, or party A's certificate configured for party B."""
    from vesper.common.config import TlsConfig
    from vesper.common.tls import TlsError, load_material
    from vesper.coordinator.certs import make_certificates

    make_certificates(tmp_path)
    ca = tmp_path / "ca.pem"
    with pytest.raises(TlsError, match=r"party_b.tls.cert_file = .* is a CA certificate"):
        load_material(TlsConfig(ca_file=ca, cert_file=ca, key_file=tmp_path / "ca.key"), "party_b.tls")
    with pytest.raises(TlsError, match=r"role 'party-a', but party_b needs its own, of role 'party-b'.*--role party-b"):
        load_material(TlsConfig(ca_file=ca, cert_file=tmp_path / "party-a.pem", key_file=tmp_path / "party-a.key"), "party_b.tls")
    load_material(TlsConfig(ca_file=ca, cert_file=tmp_path / "party-b.pem", key_file=tmp_path / "party-b.key"), "party_b.tls")
    config = tmp_path / "b.toml"
    config.write_text(
        f'[party_b]\nworkdir = "{tmp_path / "b"}"\nlisten = "127.0.0.1:0"\n[party_b.tls]\nca_file = "{ca}"\n'
        f'cert_file = "{tmp_path / "party-a.pem"}"\nkey_file = "{tmp_path / "party-a.key"}"\n'
    )
    served = subprocess.run(
        [sys.executable, "-m", "vesper.coordinator", "serve", "party-b", "--config", str(config)],
        capture_output=True, text=True, timeout=120,
    )
    assert served.returncode == 2 and "role 'party-b'" in served.stderr and "Traceback" not in served.stderr, served.stderr


def test_a_kind_the_accountant_does_not_know_is_named_with_the_kinds_it_knows() -> None:
    """10: `kind="labels"` from a client: INVALID_ARGUMENT naming the field, not a bare validation message."""
    import grpc

    from vesper.accountant.service import AccountantService
    from vesper.proto.v1 import accountant_pb2 as acc

    service = AccountantService(Accountant(LedgerStore(Path(":memory:"))), "a" * 32, "b" * 32)

    class Context:
        def abort(self, code, details):
            raise RuntimeError((code, details))

        def invocation_metadata(self):
            return (("authorization", "Bearer " + "a" * 32),)

        def auth_context(self):
            return {}

    request = acc.CalibrateRequest(mechanism="gaussian", target_epsilon=1.0, delta=1e-6, accounting="visible-batch")
    request.plan.rules.add(kind="labels", mechanism="gaussian")
    with pytest.raises(RuntimeError) as refused:
        service.Calibrate(request, Context())
    code, details = refused.value.args[0]
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert details.startswith("invalid PlanRule in the request: kind: Input should be 'train'") and "(got 'labels')" in details
