"""python -m vesper.benchmarks.path_stage: its plan, its runs' configs and its table."""

from __future__ import annotations

from rich.console import Console

from vesper.benchmarks.path_stage import PathStageRow, planned, report, run_config


def test_the_plan_is_seed_major_and_every_form_runs_each_seed() -> None:
    plan = list(planned([("cora", "cora"), ("twitch_engb", "/x/twitch_engb.npz")], 2))
    assert [p[3] for p in plan] == [0] * 6 + [1] * 6
    assert [p[2] for p in plan[:3]] == ["baseline", "stage", "no stage"]


def test_the_forms_differ_only_in_the_extractor_and_the_path_s_stage() -> None:
    baseline, stage, none = (run_config("cora", "gap", form, 4.0, 3) for form in ("baseline", "stage", "no stage"))
    assert baseline.extractor.name == "mlp" and stage.extractor.name == none.extractor.name == "gap"
    assert stage.extractor.edge_free_path_epochs is None and none.extractor.edge_free_path_epochs == 0
    assert {c.seed for c in (baseline, stage, none)} == {3} and stage.privacy.epsilon == 4.0


def test_the_table_shows_each_head_s_mean_per_form() -> None:
    def row(form: str, seed: int, free: float) -> PathStageRow:
        heads = {} if form == "baseline" else {"test@edge-free": free, "test@graph": 0.5, "test@combined": 0.6}
        return PathStageRow(dataset="cora", extractor="gap", form=form, epsilon=4.0, seed=seed, status="completed",
                            chosen="edge-free", test=free, heads=heads, seconds=1.0)

    console = Console(record=True, width=200)
    report([row("baseline", 0, 0.74), row("stage", 0, 0.75), row("stage", 1, 0.73), row("no stage", 0, 0.70)], console)
    text = console.export_text()
    assert "│ cora  │ stage    │ 2    │ 0.740" in text and "│ no stage │ 1    │ 0.700" in text
