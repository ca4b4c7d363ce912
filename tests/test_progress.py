"""The demo's progress bar (experiments/progress.py): it moves with generated tokens while every instance is
still in flight, gives back an ended instance's unused budget, and shows no time left before any token."""
from byzantium.experiments.progress import NO_ETA, WITH_ETA, TokenBudgetBar


def test_the_bar_counts_tokens_and_unused_budget_and_shows_no_eta_from_nothing():
    decoded = [100]  # the engine's counter when the bar starts: not this run's work
    bar = TokenBudgetBar(total=4 * 50, decoded=lambda: decoded[0], desc="t", instances=4)
    bar.tick()
    assert bar.bar.n == 0 and bar.bar.bar_format == NO_ETA
    decoded[0] += 30
    bar.tick()
    assert bar.bar.n == 30 and bar.bar.bar_format == WITH_ETA
    assert "0/4 instances done" in bar.bar.postfix
    bar.finished(budget=50, generated=20)  # stopped early: its other 30 tokens will never be generated
    assert bar.bar.n == 60 and "1/4 instances done" in bar.bar.postfix
    decoded[0] += 500  # more than the budget (counted elsewhere): never past the total
    bar.tick()
    assert bar.bar.n == 200
    for _ in range(3):
        bar.finished(budget=50, generated=50)
    bar.close()
    assert bar.bar.n == bar.bar.total


def test_a_counter_that_fails_stops_nothing():
    def broken():
        raise RuntimeError("no stats")
    bar = TokenBudgetBar(total=10, decoded=broken, desc="t", instances=1)
    bar.finished(budget=10, generated=4)
    bar.close()
    assert bar.bar.n == 10
