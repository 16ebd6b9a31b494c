"""The budget dashboard: HTML pages over the same numbers as the REST status.

``GET /`` lists every run: its status, privacy unit, accounting mode and the assumption in
words, ε spent against its budget, and its ε curve; party B's label ledger of a run
(``<id>.labels``) stands beside party A's ledger of it, as a budget of its own, never added.
``GET /runs/{id}`` is one run with its ledger's rows. Read-only and public like ``/v1/runs``
(no credential; under TLS it is served with the same certificate). Rendered on the server
with every string escaped: run ids and details come from whoever created the run.
The pages are left out of the OpenAPI document, which describes the JSON API only.
"""

from __future__ import annotations

from collections.abc import Callable
from html import escape
from urllib.parse import quote

from fastapi import FastAPI
from fastapi.responses import HTMLResponse

from vesper.accountant.budget import Accountant, AccountantError
from vesper.accountant.dashboard_svg import epsilon_curve_svg, format_epsilon
from vesper.common.privacy.ledger import (
    LABEL_ACCOUNTING,
    LedgerRow,
    RunStatusView,
    label_ledger_id,
    main_run_id,
)

# while a shown run is active the page reloads itself this often, so a training run's ε moves
REFRESH_SECONDS = 10

STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5rem; color: #1d2330; background: #f6f7f9; }
h1 { font-size: 1.4rem; margin: 0 0 .3rem; } h2 { font-size: 1.1rem; }
.note { color: #556; font-size: .9rem; max-width: 60rem; }
.group { display: grid; grid-template-columns: 1fr 1fr; gap: .8rem; margin: 1rem 0; }
.ledger { background: #fff; border: 1px solid #d5d9e0; border-radius: 6px; padding: .7rem .9rem; }
.ledger.absent { color: #778; background: #fafbfc; border-style: dashed; }
.side { font-size: .75rem; text-transform: uppercase; letter-spacing: .05em; color: #667; }
.run-id { font-family: ui-monospace, monospace; font-size: 1rem; font-weight: 600; }
.status { border-radius: 3px; padding: 0 .35rem; font-size: .8rem; background: #e4e7ec; }
.status-active { background: #d9f2e0; } .status-refused, .status-failed { background: #fbe0de; }
.status-interrupted { background: #fff1c8; }
.numbers { font-size: 1.05rem; margin: .3rem 0; } .eps-spent { font-weight: 700; }
.meter { height: .45rem; background: #e4e7ec; border-radius: 3px; overflow: hidden; max-width: 320px; }
.meter > div { height: 100%; background: #3b6fd8; } .meter.over > div { background: #d8453b; }
dl.facts { display: grid; grid-template-columns: max-content 1fr; gap: .1rem .8rem; margin: .4rem 0; font-size: .9rem; }
dl.facts dt { color: #667; } dl.facts dd { margin: 0; }
.assumption { font-size: .82rem; color: #445; } .hidden-batch .assumption { color: #a1271d; }
.eps-curve .plot-area { fill: #fbfcfd; stroke: #d5d9e0; }
.eps-curve .eps-line { fill: none; stroke: #3b6fd8; stroke-width: 1.6; }
.eps-curve .budget-line { stroke: #d8453b; stroke-dasharray: 4 3; }
.eps-curve .axis { font-size: 10px; fill: #667; } .eps-curve .infinite { fill: #d8453b; font-size: 12px; }
table.ledger-rows { border-collapse: collapse; font-size: .82rem; background: #fff; }
table.ledger-rows th, table.ledger-rows td { border: 1px solid #d5d9e0; padding: .15rem .45rem; text-align: left; }
table.ledger-rows td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.uncounted { color: #889; }
"""


def run_href(run_id: str) -> str:
    """The run page's path; the id is percent-encoded whole (it is the user's string)."""
    return f"/runs/{quote(run_id, safe='')}"


def page(title: str, body: str, refresh: bool = False) -> str:
    meta = f'<meta http-equiv="refresh" content="{REFRESH_SECONDS}">' if refresh else ""
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>{meta}'
        f'<meta name="viewport" content="width=device-width, initial-scale=1"><style>{STYLE}</style></head>'
        f"<body>{body}</body></html>"
    )


def _meter(view: RunStatusView) -> str:
    budget, spent = view.epsilon_budget, view.epsilon_spent
    if budget > 0 and budget != float("inf"):
        share = min(spent / budget, 1.0) if spent != float("inf") else 1.0
    else:
        share = 0.0 if budget == float("inf") else 1.0
    over = " over" if spent > budget else ""
    return f'<div class="meter{over}" title="ε spent / budget"><div style="width:{100 * share:.1f}%"></div></div>'


def _numbers(view: RunStatusView) -> str:
    return (
        f'<div class="numbers">ε <span class="eps-spent">{format_epsilon(view.epsilon_spent)}</span> of '
        f'<span class="eps-budget">{format_epsilon(view.epsilon_budget)}</span> at δ = '
        f'<span class="delta">{format_epsilon(view.delta)}</span></div>'
    )


def _side(view: RunStatusView) -> str:
    return "party B's label ledger" if view.accounting == LABEL_ACCOUNTING else "party A's ledger"


def ledger_card(view: RunStatusView) -> str:
    """One ledger on the index: status, mode, assumption, ε against budget, curve."""
    css = "ledger hidden-batch" if view.accounting == "hidden-batch" else "ledger"
    return (
        f'<article class="{css}" data-run-id="{escape(view.run_id)}">'
        f'<div class="side">{_side(view)}</div>'
        f'<a class="run-id" href="{escape(run_href(view.run_id))}">{escape(view.run_id)}</a> '
        f'<span class="status status-{escape(view.status)}">{escape(view.status)}</span>'
        f"{_numbers(view)}{_meter(view)}"
        '<dl class="facts">'
        f'<dt>privacy unit</dt><dd class="privacy-unit">{escape(view.privacy_unit)}</dd>'
        f'<dt>accounting</dt><dd class="accounting">{escape(view.accounting)}</dd>'
        f'<dt>extractor</dt><dd class="extractor">{escape(view.extractor)}</dd>'
        f'<dt>charges</dt><dd><span class="charges">{view.charges}</span> '
        f'(<span class="counted-charges">{view.counted_charges}</span> counted)</dd>'
        f"</dl>{epsilon_curve_svg(view)}"
        f'<p class="assumption">{escape(view.assumption)}</p></article>'
    )


def _absent_card(side: str, what: str) -> str:
    return f'<article class="ledger absent"><div class="side">{side}</div>{escape(what)}</article>'


Group = list[RunStatusView | None]  # [party A's ledger, party B's label ledger]


def _groups(views: list[RunStatusView]) -> list[tuple[str, Group]]:
    """Each run with party B's label ledger of it (``<id>.labels``) beside it, newest first.

    Every ledger is shown once: one whose slot is already taken (ids that collide only in
    odd cases) gets a group of its own.
    """
    groups: list[tuple[str, Group]] = []
    index: dict[str, int] = {}
    for view in views:
        slot = 1 if view.accounting == LABEL_ACCOUNTING else 0
        key = main_run_id(view.run_id) if slot else view.run_id
        if key in index and groups[index[key]][1][slot] is None:
            groups[index[key]][1][slot] = view
            continue
        group: Group = [None, None]
        group[slot] = view
        index.setdefault(key, len(groups))
        groups.append((key, group))

    def created(entry: tuple[str, Group]) -> str:
        return next(view.created_at for view in entry[1] if view is not None)

    return sorted(groups, key=created, reverse=True)


def index_page(views: list[RunStatusView]) -> str:
    groups = []
    for main, (main_view, label_view) in _groups(views):
        left = ledger_card(main_view) if main_view else _absent_card("party A's ledger", f"no run {main!r} of party A")
        right = ledger_card(label_view) if label_view else _absent_card(
            "party B's label ledger", "no label ledger: party B charged nothing for its labels in this run"
        )
        groups.append(f'<section class="group" data-run="{escape(main)}">{left}{right}</section>')
    listing = "".join(groups) or (
        '<p class="empty">No runs yet. A run appears here when party A creates it at this accountant.</p>'
    )
    body = (
        "<h1>vesper accountant: privacy budgets</h1>"
        '<p class="note">Read-only, the same numbers as <a href="/v1/runs">/v1/runs</a>. Each run has party A\'s '
        "ledger (privacy unit edge or node) and, when party B privatises its labels, B's label ledger beside it: "
        "two budgets for two different neighbouring relations, never added together. ε is computed from each "
        f"ledger's rows; while a run is active this page reloads every {REFRESH_SECONDS} s.</p>"
        f'<p class="note"><span class="run-count">{len(views)}</span> ledgers.</p>{listing}'
    )
    return page("vesper privacy budgets", body, refresh=any(view.status == "active" for view in views))


def _facts(view: RunStatusView) -> str:
    facts: list[tuple[str, str, str]] = [
        ("status", "run-status", view.status + (
            f" ({view.closed_reason})" if view.closed_reason and view.closed_reason != view.status else ""
        )),
        ("privacy unit", "privacy-unit", view.privacy_unit),
        ("accounting", "accounting", view.accounting),
        ("accountant", "accountant", f"{view.accountant} (asked for {view.accountant_requested})"),
        ("ε of the recorded events", "eps-events", format_epsilon(view.epsilon_events)),
        ("ε of bound (6)", "eps-bound6", format_epsilon(view.epsilon_bound6)),
        ("extractor", "extractor", view.extractor),
        ("created", "created", view.created_at),
        ("closed", "closed", view.closed_at or "–"),
    ]
    rows = "".join(f'<dt>{label}</dt><dd class="{css}">{escape(text)}</dd>' for label, css, text in facts)
    return f'<dl class="facts">{rows}</dl>'


def _rows_table(rows: list[LedgerRow]) -> str:
    header = "".join(
        f"<th>{name}</th>" for name in ("seq", "kind", "pass", "release key", "nodes", "counted", "ε after", "created")
    )
    body = "".join(
        f'<tr class="ledger-row{"" if row.counted else " uncounted"}"><td class="num">{row.seq}</td>'
        f"<td>{escape(row.kind)}</td><td>{escape(row.pass_id)}</td><td>{escape(row.release_key)}</td>"
        f'<td class="num">{row.num_nodes}</td><td>{"yes" if row.counted else "no"}</td>'
        f'<td class="num">{format_epsilon(row.epsilon_after)}</td><td>{escape(row.created_at)}</td></tr>'
        for row in rows
    )
    return f'<table class="ledger-rows"><thead><tr>{header}</tr></thead><tbody>{body}</tbody></table>'


def run_page(view: RunStatusView, rows: list[LedgerRow], related: RunStatusView | None) -> str:
    other = (
        f'<p>The other ledger of this run ({_side(related)}): <a class="related" href="{escape(run_href(related.run_id))}">'
        f"{escape(related.run_id)}</a>, ε {format_epsilon(related.epsilon_spent)} of "
        f"{format_epsilon(related.epsilon_budget)}, a separate budget.</p>"
        if related else ""
    )
    json_links = (
        f'<a href="{escape("/v1/runs/" + quote(view.run_id, safe=""))}">status JSON</a> · '
        f'<a href="{escape("/v1/runs/" + quote(view.run_id, safe="") + "/ledger")}">ledger JSON</a>'
    )
    body = (
        f'<p><a href="/">all runs</a> · {json_links}</p>'
        f'<h1>{_side(view)} <span class="run-id">{escape(view.run_id)}</span></h1>'
        f'<div class="{"hidden-batch" if view.accounting == "hidden-batch" else ""}">'
        f"{_numbers(view)}{_meter(view)}"
        f'<p>Charges: <span class="charges">{view.charges}</span> '
        f'(<span class="counted-charges">{view.counted_charges}</span> counted)</p>'
        f"{_facts(view)}{epsilon_curve_svg(view, width=640, height=220)}"
        f'<h2>Assumption</h2><p class="assumption">{escape(view.assumption)}</p></div>{other}'
        f'<h2>Ledger: <span class="row-count">{len(rows)}</span> rows</h2>{_rows_table(rows)}'
    )
    return page(f"vesper run {view.run_id}", body, refresh=view.status == "active")


def not_found_page(run_id: str) -> str:
    body = (
        '<p><a href="/">all runs</a></p><h1>No such run</h1>'
        f'<p class="not-found">The accountant has no run <span class="run-id">{escape(run_id)}</span>.</p>'
    )
    return page("vesper: no such run", body)


def _related(accountant: Accountant, view: RunStatusView) -> RunStatusView | None:
    """The run's other ledger: party A's run of a label ledger, or party B's label ledger of a run."""
    other = main_run_id(view.run_id) if view.accounting == LABEL_ACCOUNTING else label_ledger_id(view.run_id)
    if other == view.run_id:
        return None
    try:
        return accountant.status(other)
    except AccountantError:
        return None


def add_dashboard(app: FastAPI, accountant: Accountant) -> None:
    """Register ``/`` and ``/runs/{run_id}`` on the REST app (outside its OpenAPI document)."""

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def dashboard() -> HTMLResponse:
        return HTMLResponse(index_page(accountant.list_runs()))

    @app.get("/runs/{run_id}", response_class=HTMLResponse, include_in_schema=False)
    def dashboard_run(run_id: str) -> HTMLResponse:
        return _with_run(accountant, run_id, lambda view: run_page(
            view, accountant.store.charges(run_id), _related(accountant, view)
        ))


def _with_run(accountant: Accountant, run_id: str, render: Callable[[RunStatusView], str]) -> HTMLResponse:
    try:
        view = accountant.status(run_id)
    except AccountantError:
        return HTMLResponse(not_found_page(run_id), status_code=404)
    return HTMLResponse(render(view))
