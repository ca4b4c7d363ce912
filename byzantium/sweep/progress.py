"""The sweep's progress bar: instances done over all cells, cells done, generated tokens/s, ETA."""
import threading
import time
from pathlib import Path

from ..experiments.runner import RESULTS
from .dry_run import cell_problems


def _rows(path):
    """Finished lines of a cell's results.jsonl (read-only: the runner may be appending)."""
    try:
        return (Path(path) / RESULTS).read_bytes().count(b"\n")
    except OSError:
        return 0


def _instances(cell):
    """Instances a cell runs, for the progress bar; 1 when unknown (a hub dataset without a limit)."""
    return cell_problems(cell) or 1


class Progress:
    """One bar for the sweep: instances done over all cells, cells done/total, generated tokens/s, ETA.
    A thread polls the current cell's results file and the engines' counters once a second."""

    def __init__(self, sweep, out, states, pool, enabled, skip=()):
        """skip: cells that will not run (they count as no instances)."""
        from tqdm.auto import tqdm
        self.out, self.pool, self.sweep = Path(out), pool, sweep
        self.sizes = {c.name: 0 if c.name in skip else _instances(c) for c in sweep.cells}
        self.base = {c.name: min(_rows(self.out / c.name), self.sizes[c.name]) for c in sweep.cells}
        self.cells_done = sum(s == "done" for s, _ in states.values())
        self.current, self.start, self.tokens0 = None, time.perf_counter(), None
        self.bar = tqdm(total=sum(self.sizes.values()), initial=sum(self.base.values()),
                        desc="sweep", unit="inst", disable=not enabled, dynamic_ncols=True)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True) if enabled else None
        if self.thread:
            self.thread.start()

    def _tokens(self):
        total = 0
        for llm in self.pool.llms():
            try:
                total += int(llm.stats.get("decode_tokens", 0))
            except Exception:  # counters are a nicety
                pass
        return total

    def _poll(self):
        while not self.stop.wait(1.0):
            self.update()

    def update(self):
        done = sum(self.base.values())
        if self.current is not None:
            name = self.current.name
            done += min(_rows(self.out / name), self.sizes[name]) - self.base[name]
        tokens = self._tokens()
        if self.tokens0 is None:
            self.tokens0 = tokens
        rate = (tokens - self.tokens0) / max(time.perf_counter() - self.start, 1e-9)
        self.bar.n = done
        self.bar.set_postfix_str(f"cells {self.cells_done}/{len(self.sweep.cells)}, {rate:.1f} gen tok/s",
                                 refresh=False)
        self.bar.refresh()

    def cell_finished(self, cell, status):
        self.base[cell.name] = min(_rows(self.out / cell.name), self.sizes[cell.name])
        self.cells_done += status == "done"
        self.current = None
        self.update()

    def close(self):
        self.stop.set()
        if self.thread:
            self.thread.join()
        self.bar.close()
