"""Progress that moves while instances are in flight: when every instance starts at once (the demo, a run
whose instances all fit its concurrency) none finishes until near the end, so a bar over finished instances
sits at 0 and then extrapolates hours from the first one that ends. These bars count generated tokens
instead, and show an ETA only once it rests on completed work.

    bar = TokenBudgetBar(total=budget, decoded=lambda: llm.stats["decode_tokens"], desc="demo")
    bar.finished(budget=n * max_len, generated=tokens_it_wrote)   # an instance ended: its unused budget is done
    bar.tick()                                                    # every second: tokens decoded so far
    bar.close()

`bar_format(eta)` is the layout the runner's instance bar uses too: with the remaining time, or without it.
"""
import time

WITH_ETA = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}{postfix}]"
NO_ETA = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]"


def bar_format(eta: bool) -> str:
    return WITH_ETA if eta else NO_ETA


class TokenBudgetBar:
    """A bar over the instances' token budget (each may generate up to its budget): done = tokens decoded
    so far + the unused budget of the instances that ended. Its ETA assumes the rest of the budget is
    generated, so it is an upper bound; it is shown once a token has been decoded."""

    def __init__(self, total, decoded, desc, instances, disable=False):
        from tqdm.auto import tqdm

        self.total, self.decoded, self.instances = total, decoded, instances
        self.start, self.decoded0 = time.perf_counter(), self._decoded()
        self.unused, self.ended = 0, 0
        self.bar = tqdm(total=total, desc=desc, unit="tok", unit_scale=True, disable=disable, dynamic_ncols=True,
                        bar_format=bar_format(False))

    def _decoded(self) -> int:
        try:
            return int(self.decoded() or 0)
        except Exception:  # counters are a nicety; never let them stop a run
            return 0

    def finished(self, budget, generated):
        """An instance ended having generated `generated` of its `budget` tokens."""
        self.unused += max(0, budget - generated)
        self.ended += 1
        self.tick()

    def tick(self):
        decoded = self._decoded() - self.decoded0
        done = min(self.total, decoded + self.unused)
        seconds = max(time.perf_counter() - self.start, 1e-9)
        self.bar.bar_format = bar_format(decoded > 0)
        self.bar.set_postfix_str(f"{decoded / seconds:.1f} gen tok/s, {self.ended}/{self.instances} instances done",
                                 refresh=False)
        self.bar.update(done - self.bar.n)

    def close(self):
        self.tick()
        if self.ended == self.instances:
            self.bar.update(self.total - self.bar.n)  # every budget spent or given back
        self.bar.close()


__all__ = ["TokenBudgetBar", "bar_format", "WITH_ETA", "NO_ETA"]
