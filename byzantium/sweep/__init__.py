"""`byzantium sweep`: every cell of an experiment file, each an ordinary `byzantium run <method>`.

    config.py       the experiment file (TOML), read and checked: a Sweep of Cells
    cells.py        its keys, and one cell made from one point of its settings
    cell_checks.py  a cell through `byzantium run`'s parser and the run's own checks
    needs.py        what a cell needs (context length, models, data) and whether this machine has it
    dry_run.py      `--dry-run`: problems, generated tokens, weights and hours per cell; each model's plan
    running.py      running the cells into DIR/<cell>/, and DIR/sweep.json
    pool.py         one model pool shared by every cell
    progress.py     the sweep's progress bar
    command.py      the `byzantium sweep` command
"""
