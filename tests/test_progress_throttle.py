"""What party A's service streams to the coordinator: a training pass's steps at most every
0.1 s, and every event that is not a routine step (party_a.run.progress.Throttled)."""

from vesper.party_a.run.progress import STEP_EVENTS_EVERY_S, ProgressEvent, Throttled


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _steps(epochs: int, per_epoch: int, message: str = "") -> list[ProgressEvent]:
    total = epochs * per_epoch
    return [
        ProgressEvent("train", step // per_epoch + 1, epochs, step + 1, total, loss=float(step), message=message)
        for step in range(total)
    ]


def test_steps_faster_than_the_interval_are_thinned_but_the_pass_ends_and_epochs_show() -> None:
    clock, passed = Clock(), []
    report = Throttled(passed.append, clock=clock)
    for event in _steps(epochs=3, per_epoch=10):
        report(event)
        clock.now += 0.01  # 100 steps a second
    # per epoch: its first step and the one 0.1 s later; and the pass's last step
    assert [e.step for e in passed] == [1, 11, 21, 30]
    assert passed[-1].loss == 29.0 and passed[-1].step == passed[-1].total_steps


def test_slow_steps_all_pass() -> None:
    clock, passed = Clock(), []
    report = Throttled(passed.append, clock=clock)
    events = _steps(epochs=2, per_epoch=4)
    for event in events:
        report(event)
        clock.now += 1.5 * STEP_EVENTS_EVERY_S
    assert passed == events


def test_messages_other_phases_and_a_second_pass_are_never_held_back() -> None:
    clock, passed = Clock(), []
    report = Throttled(passed.append, clock=clock)
    report(ProgressEvent("train", 1, 2, 1, 8))
    held = ProgressEvent("train", 1, 2, 2, 8)
    report(held)
    others = [
        ProgressEvent("setup", message="calibrating"),
        ProgressEvent("train", message="a checkpoint was saved"),  # no total_steps: not a step
        ProgressEvent("eval", 1, 1, 1, 3),
        ProgressEvent("train", 1, 1, 1, 5, message="edge-free stage"),  # another pass's first step
    ]
    for event in others:
        report(event)
    assert held not in passed and passed[1:] == others
