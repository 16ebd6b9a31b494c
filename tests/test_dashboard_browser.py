"""The budget dashboard in a real headless Chromium, over the real services on loopback.

While a run trains (accountant, party A and party B as processes, ``vesper train`` as a
process of its own, party B privatising its labels with randomised response) the index is
loaded: the run is there, active, with party B's label ledger beside it, and its ε and
budget are those of the REST status (ε at the charges the page shows, read from the
ledger, since the run moves on while the page is read). Once the run is over, every number
on the page equals ``/v1/runs``'s and the run page has one row per ledger row. Screenshots
of both pages are saved under the test's tmp path.

Needs Chromium and its driver (Debian: ``apt-get install chromium chromium-driver``) and
selenium (the ``test`` extra); skipped, saying which is missing, without them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from vesper.coordinator.processes import LocalCluster

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

# without the background-networking flags Chromium's own connections stall on a closed network
CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage", "--window-size=1280,1100",
)
# every element with a class, per card: its text (the first element of each class), read in one
# script so a reload of the page (it reloads itself while a run is active) cannot split a reading
READ_CARDS = """
const cards = {};
for (const card of document.querySelectorAll('article[data-run-id]')) {
  const fields = {};
  for (const el of card.querySelectorAll('[class]'))
    for (const name of el.classList) if (!(name in fields)) fields[name] = el.textContent;
  const box = card.getBoundingClientRect();
  const curve = card.querySelector('svg.eps-curve').getBoundingClientRect();
  fields['@box'] = [box.x, box.y, box.width, box.height];
  fields['@curve'] = [curve.width, curve.height];
  fields['@group'] = card.closest('section.group').dataset.run;
  cards[card.dataset.runId] = fields;
}
return cards;
"""


def _tool(*names: str) -> str | None:
    return next((found for name in names if (found := shutil.which(name))), None)


@pytest.fixture(scope="module")
def browser(tmp_path_factory) -> Iterator[Any]:
    chromium = _tool("chromium", "chromium-browser", "google-chrome")
    driver_path = _tool("chromedriver")
    if chromium is None or driver_path is None:
        pytest.skip("needs Chromium and chromedriver on PATH (Debian: apt-get install chromium chromium-driver)")
    webdriver = pytest.importorskip("selenium.webdriver", reason="needs selenium: pip install -e '.[test]'")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}")
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[LocalCluster]:
    workdir = tmp_path_factory.mktemp("dashboard-cluster")
    with LocalCluster(workdir, party_a={"secret_seed": 3}, party_b={"secret_seed": 4, "max_label_epsilon": 6}) as c:
        yield c


def _runs(cluster: LocalCluster) -> dict[str, dict]:
    return {run["run_id"]: run for run in httpx.get(f"{cluster.status_url}/v1/runs", timeout=10).json()}


def _ledger_rows(cluster: LocalCluster, run_id: str) -> list[dict]:
    return httpx.get(f"{cluster.status_url}/v1/runs/{run_id}/ledger", timeout=10).json()["rows"]


def _shown(text: str) -> float:
    return float("inf") if text == "∞" else float(text)


def _as_shown(value: float | str) -> float:
    """A JSON number as the page writes it (6 significant digits), read back."""
    return _shown("∞" if value == "Infinity" else f"{float(value):.6g}")


def _start_training(cluster: LocalCluster, log: Path) -> subprocess.Popen:
    """A run long enough to be read while it trains: small batches, many epochs."""
    vesper = Path(sys.executable).parent / "vesper"
    args = [
        str(vesper), "train", "--party-a", cluster.party_a_address, "--dataset", "cora", "--extractor", "pmp-gcn",
        "--epochs", "20", "--batch-size", "64", "--epsilon", "8", "--seed", "1",
        "--label-privacy", "rr", "--label-epsilon", "2",
    ]
    return subprocess.Popen(args, stdout=log.open("w"), stderr=subprocess.STDOUT, env={**os.environ, "NO_COLOR": "1"})


def _wait_until_training(cluster: LocalCluster, trainer: subprocess.Popen, log: Path) -> str:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        active = [run for run in _runs(cluster).values() if run["status"] == "active" and run["accounting"] != "labels"]
        if active and active[0]["charges"] > 0:
            return active[0]["run_id"]
        assert trainer.poll() is None, f"vesper train ended before its run was seen training:\n{log.read_text()}"
        time.sleep(0.2)
    pytest.fail(f"no run was training after 180 s:\n{log.read_text()}")


def _load(browser: Any, url: str, shot: Path) -> dict[str, dict]:
    browser.get(url)
    cards = browser.execute_script(READ_CARDS)
    browser.save_screenshot(str(shot))
    assert shot.stat().st_size > 10_000, "the screenshot is (nearly) empty"
    return cards


def _check_beside(cards: dict[str, dict], run_id: str) -> None:
    """Party B's label ledger of the run is in the run's group, to the right of A's, on the same row."""
    a, b = cards[run_id], cards[f"{run_id}.labels"]
    assert a["@group"] == b["@group"] == run_id
    assert b["@box"][0] >= a["@box"][0] + a["@box"][2] - 1 and abs(b["@box"][1] - a["@box"][1]) < 1
    assert a["side"] == "party A's ledger" and b["side"] == "party B's label ledger"
    for card in (a, b):
        assert card["@curve"][0] > 100 and card["@curve"][1] > 50, "the ε curve is not drawn"


def test_the_dashboard_shows_a_training_run_with_the_numbers_of_the_rest_status(
    cluster: LocalCluster, browser: Any, tmp_path: Path
) -> None:
    log = tmp_path / "train.log"
    trainer = _start_training(cluster, log)
    try:
        run_id = _wait_until_training(cluster, trainer, log)
        cards = _load(browser, f"{cluster.status_url}/", tmp_path / "dashboard-training.png")
        assert run_id in cards, f"run {run_id} is not on the page: {sorted(cards)}"
        shown = cards[run_id]
        assert shown["status"] == "active", "the run ended before the page was read: make it longer"
        assert shown["run-id"] == run_id and shown["accounting"] == "visible-batch" and shown["privacy-unit"] == "edge"
        assert "B sees every batch's node ids" in shown["assumption"]
        runs = _runs(cluster)
        assert _shown(shown["eps-budget"]) == _as_shown(runs[run_id]["epsilon_budget"])
        # the run moves on while the page is read: ε shown is the ledger's after the charges shown
        charges = int(shown["charges"])
        rows = _ledger_rows(cluster, run_id)
        assert 0 < charges <= len(rows)
        assert _shown(shown["eps-spent"]) == _as_shown(rows[charges - 1]["epsilon_after"]) > 0
        _check_beside(cards, run_id)
        label = cards[f"{run_id}.labels"]
        assert label["accounting"] == "labels" and label["privacy-unit"] == "label"
        assert _shown(label["eps-spent"]) == _as_shown(runs[f"{run_id}.labels"]["epsilon_spent"]) > 0
        assert trainer.wait(timeout=300) == 0, log.read_text()
    finally:
        if trainer.poll() is None:
            trainer.kill()
            trainer.wait()

    cards = _load(browser, f"{cluster.status_url}/", tmp_path / "dashboard-done.png")
    runs = _runs(cluster)
    assert set(cards) == set(runs)
    for ledger_id, run in runs.items():
        for css, key in (("eps-spent", "epsilon_spent"), ("eps-budget", "epsilon_budget"), ("delta", "delta")):
            assert _shown(cards[ledger_id][css]) == _as_shown(run[key]), (ledger_id, css)
        assert cards[ledger_id]["status"] == run["status"] == "completed"
        assert int(cards[ledger_id]["charges"]) == run["charges"]
    _check_beside(cards, run_id)

    browser.find_element("css selector", f'article[data-run-id="{run_id}"] a.run-id').click()
    assert browser.current_url == f"{cluster.status_url}/runs/{run_id}"
    rows = browser.find_elements("css selector", "tr.ledger-row")
    browser.save_screenshot(str(tmp_path / "run-page.png"))
    ledger = _ledger_rows(cluster, run_id)
    assert len(rows) == len(ledger) == runs[run_id]["charges"] > 0
    assert rows[-1].find_elements("css selector", "td")[0].text == str(ledger[-1]["seq"])
    assert _shown(browser.find_element("css selector", ".eps-spent").text) == _as_shown(runs[run_id]["epsilon_spent"])
    print(f"screenshots: {tmp_path / 'dashboard-training.png'}, {tmp_path / 'dashboard-done.png'}, {tmp_path / 'run-page.png'}")
