"""The budget dashboard's HTML, through the REST app in process (no browser).

The numbers on the page are those of ``/v1/runs`` (parsed back from the HTML, compared
after the same 6-significant-digit formatting), party B's label ledger stands beside its
run, the run page has one row per ledger row, every user string is escaped, an unknown run
is a 404 page, and the pages work with no runs and with infinite ε. The browser test is
tests/test_dashboard_browser.py.
"""

from __future__ import annotations

import math
import re
from html.parser import HTMLParser
from pathlib import Path

import dp_accounting as dpa
import pytest
from fastapi.testclient import TestClient

from vesper.accountant.budget import Accountant
from vesper.accountant.dashboard import index_page, run_page
from vesper.accountant.dashboard_svg import curve_points, format_epsilon
from vesper.accountant.ledger_store import LedgerStore
from vesper.accountant.rest import create_app
from vesper.common.privacy.events import event_to_json
from vesper.common.privacy.ledger import ChargeRule, label_ledger_id

DELTA = 1e-5
HOSTILE = "<script>alert('x')</script>\"&amp;"


def _rule(kind: str, event: dpa.DpEvent, bound: int | None = None) -> ChargeRule:
    return ChargeRule(kind=kind, release_event=event_to_json(event), participation_bound=bound)


def _charge(accountant: Accountant, run_id: str, key: str, pass_id: str, kind: str, event: dpa.DpEvent) -> None:
    accountant.charge(run_id, key, pass_id, kind, 3, f"digest-{key}", event_to_json(event))


def _accountant() -> Accountant:
    return Accountant(LedgerStore(Path(":memory:")))


def seeded() -> Accountant:
    """An edge run with B's label ledger beside it, a hidden-batch run, a refused run."""
    accountant = _accountant()
    train, evaluation = dpa.GaussianDpEvent(3.0), dpa.GaussianDpEvent(5.0)
    accountant.create_run("edge-run", "edge", "visible-batch", "pld", 8.0, DELTA,
                          [_rule("train", train, bound=2), _rule("eval", evaluation, bound=1)], "pmp-gcn", {})
    for i in range(3):  # the third release of the pass is past its participation bound: not counted
        _charge(accountant, "edge-run", f"train-0/{i}", "train-0", "train", train)
    _charge(accountant, "edge-run", "eval-0/0", "eval-0", "eval", evaluation)
    labels = label_ledger_id("edge-run")
    accountant.create_run(labels, "label", "labels", "pld", 2.0, DELTA, [_rule("one-shot", dpa.GaussianDpEvent(2.0))], "rr", {})
    _charge(accountant, labels, "query-0", "query", "one-shot", dpa.GaussianDpEvent(2.0))
    sampled = dpa.PoissonSampledDpEvent(0.01, dpa.GaussianDpEvent(1.0))
    accountant.create_run("hidden-run", "edge", "hidden-batch", "rdp", 4.0, DELTA, [_rule("train", sampled)], "pmp-gin", {})
    for i in range(2):
        _charge(accountant, "hidden-run", f"train-0/{i}", "train-0", "train", sampled)
    accountant.create_run("node-run", "node", "visible-batch", "pld", 2.0, DELTA, [_rule("train", train)], "heterpoisson", {})
    accountant.close_run("node-run", "refused", HOSTILE)
    return accountant


class Cards(HTMLParser):
    """The text of every element with a class, per ``data-run-id`` card (``None``: outside any card)."""

    def __init__(self) -> None:
        super().__init__()
        self.cards: dict[str | None, dict[str, str]] = {None: {}}
        self.groups: list[list[str]] = []
        self._card: str | None = None
        self._open: list[tuple[str, str | None]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "section" and "group" in (found.get("class") or ""):
            self.groups.append([])
        if tag == "article" and found.get("data-run-id") is not None:
            self._card = found["data-run-id"]
            self.cards[self._card] = {}
            self.groups[-1].append(self._card)
        if tag not in ("meta", "br", "rect", "line", "polyline"):
            self._open.append((tag, found.get("class")))

    def handle_endtag(self, tag: str) -> None:
        while self._open:
            opened, _ = self._open.pop()
            if opened == tag:
                break
        if tag == "article":
            self._card = None

    def handle_data(self, data: str) -> None:
        for _, css in self._open:
            for name in (css or "").split():
                fields = self.cards[self._card]
                fields[name] = fields.get(name, "") + data


def parse(html: str) -> Cards:
    cards = Cards()
    cards.feed(html)
    return cards


@pytest.fixture(scope="module")
def client() -> TestClient:
    return TestClient(create_app(seeded()))


def test_the_index_shows_every_run_with_the_numbers_of_v1_runs(client: TestClient) -> None:
    response = client.get("/")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/html")
    cards = parse(response.text).cards
    runs = client.get("/v1/runs").json()
    assert {run["run_id"] for run in runs} == set(cards) - {None}
    for run in runs:
        shown = cards[run["run_id"]]
        assert shown["run-id"] == run["run_id"] and shown["status"] == run["status"]
        assert shown["accounting"] == run["accounting"] and shown["privacy-unit"] == run["privacy_unit"]
        for css, key in (("eps-spent", "epsilon_spent"), ("eps-budget", "epsilon_budget"), ("delta", "delta")):
            assert float(shown[css]) == float(f"{float(run[key]):.6g}"), (run["run_id"], css)
        assert int(shown["charges"]) == run["charges"] and int(shown["counted-charges"]) == run["counted_charges"]
        assert shown["assumption"] == run["assumption"]  # the assumption, in words
    assert float(cards["edge-run"]["eps-spent"]) > 0  # not a page of zeros


def test_the_label_ledger_stands_beside_its_run_and_each_run_is_shown_once(client: TestClient) -> None:
    groups = parse(client.get("/").text).groups
    assert ["edge-run", "edge-run.labels"] in groups
    shown = [run_id for group in groups for run_id in group]
    assert sorted(shown) == sorted(run["run_id"] for run in client.get("/v1/runs").json())
    assert all(len(group) <= 2 for group in groups)


def test_the_run_page_has_one_row_per_ledger_row(client: TestClient) -> None:
    for run_id in ("edge-run", "edge-run.labels", "hidden-run", "node-run"):
        response = client.get(f"/runs/{run_id}")
        assert response.status_code == 200, response.text
        ledger = client.get(f"/v1/runs/{run_id}/ledger").json()
        html = response.text
        assert html.count('<tr class="ledger-row') == len(ledger["rows"])
        assert f'<span class="row-count">{len(ledger["rows"])}</span>' in html
        status = client.get(f"/v1/runs/{run_id}").json()
        fields = parse(html).cards[None]
        assert float(fields["eps-spent"]) == float(f"{status['epsilon_spent']:.6g}")
    assert client.get("/runs/edge-run").text.count('class="ledger-row uncounted"') == 1
    # each ledger links to the other of its run
    assert 'href="/runs/edge-run.labels"' in client.get("/runs/edge-run").text
    assert 'href="/runs/edge-run"' in client.get("/runs/edge-run.labels").text


def test_user_strings_are_escaped(client: TestClient) -> None:
    """The refused run's reason, an unknown id in the URL, and ids no ledger would accept."""
    for html in (client.get("/runs/node-run").text, client.get("/runs/%3Cimg%20src%3Dx%20onerror%3Dalert(1)%3E").text):
        assert "<script>" not in html and "<img" not in html
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;&quot;&amp;amp;" in client.get("/runs/node-run").text
    view = seeded().status("edge-run").model_copy(update={"run_id": HOSTILE, "extractor": HOSTILE, "assumption": HOSTILE})
    for html in (index_page([view]), run_page(view, [], None)):
        assert "<script>" not in html and HOSTILE not in html
        assert parse(html).cards.get(HOSTILE, parse(html).cards[None])["run-id"] == HOSTILE  # shown, as text


def test_an_unknown_run_is_a_404_page(client: TestClient) -> None:
    response = client.get("/runs/no-such-run")
    assert response.status_code == 404 and response.headers["content-type"].startswith("text/html")
    assert "No such run" in response.text and "no-such-run" in response.text


def test_the_pages_work_with_no_runs() -> None:
    response = TestClient(create_app(_accountant())).get("/")
    assert response.status_code == 200 and "No runs yet" in response.text
    cards = parse(response.text)
    assert set(cards.cards) == {None} and cards.groups == [] and cards.cards[None]["run-count"] == "0"


def test_infinite_epsilon_and_budget_are_shown_as_infinity() -> None:
    accountant = _accountant()
    accountant.create_run("open", "edge", "visible-batch", "pld", math.inf, DELTA,
                          [_rule("train", dpa.NonPrivateDpEvent())], "pmp-gcn", {})
    _charge(accountant, "open", "train-0/0", "train-0", "train", dpa.NonPrivateDpEvent())
    client = TestClient(create_app(accountant))
    assert client.get("/v1/runs/open").json()["epsilon_spent"] == "Infinity"
    for path in ("/", "/runs/open"):
        response = client.get(path)
        assert response.status_code == 200
        fields = parse(response.text).cards.get("open") or parse(response.text).cards[None]
        assert fields["eps-spent"] == "∞" and fields["eps-budget"] == "∞"
        assert "ε = ∞ (non-private releases)" in response.text
        text = re.sub(r"<[^>]*>", " ", response.text)
        assert not re.search(r"\b(inf|Infinity|NaN)\b", text), "ε written as a number it is not"


def test_an_active_run_reloads_the_page_and_a_closed_one_does_not(client: TestClient) -> None:
    assert 'http-equiv="refresh"' in client.get("/").text  # hidden-run is active
    assert 'http-equiv="refresh"' in client.get("/runs/hidden-run").text
    assert 'http-equiv="refresh"' not in client.get("/runs/node-run").text


def test_the_pages_are_not_in_the_openapi_document(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    assert "/" not in paths and "/runs/{run_id}" not in paths
    assert "/v1/runs" in paths


def test_the_curve_is_the_ledgers_steps() -> None:
    view = seeded().status("edge-run")
    points = curve_points(view)
    assert points[0] == (0, 0.0) and points[-1][0] == view.charges
    assert [eps for _, eps in points] == sorted(eps for _, eps in points)  # ε never decreases
    assert points[-1][1] == view.epsilon_spent


@pytest.mark.parametrize("value, text", [(math.inf, "∞"), (1.23456789, "1.23457"), (1e-5, "1e-05"), (None, "–"), (8.0, "8")])
def test_numbers_are_formatted_one_way(value: float | None, text: str) -> None:
    assert format_epsilon(value) == text



@pytest.mark.parametrize("path", ["/", "/runs/edge-run"])
def test_the_pages_are_read_only(client: TestClient, path: str) -> None:
    for method in ("POST", "PUT", "DELETE", "PATCH"):
        assert client.request(method, path).status_code == 405, (method, path)
