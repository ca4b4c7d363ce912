"""`byzantium sweep FILE.toml --out DIR`: every cell of an experiment file (config.py), each an ordinary
`byzantium run <method>` into DIR/<cell name>/, one engine per model for the whole sweep (running.py).

    byzantium sweep ct_table1 --out runs/ct1                      # a shipped file by name; smoke scale
    byzantium sweep my.toml --out runs/x --scale paper --data-root ~/data --dry-run   # what it needs
    byzantium sweep ct_table1 --out runs/ct1-try --scale paper --data-root ~/data --limit 5   # 5 problems a cell

--limit N overrides every cell's limit (the file is not copied); it is recorded in sweep.json, and a
rerun into the same DIR with another --limit (or none) is refused: its cells would count as done with
the other number of problems. --dry-run prints what each cell needs (dry_run.py) and each model's plan
on --gpus N GPUs of --device-memory GB (byzantium/plan/). A model's [models."name"] tensor_parallel_size
and quantization are its engine's options (the shared pool's model_options, --backend native), so the
models of one cell may differ (a 70B in fp8 beside an 8B in bf16); --tensor-parallel-size /
--quantization given to the sweep win over the file's for every model (another machine).
"""
import argparse

from ..backends import add_backend_args, pool_kwargs
from ..commands import Command
from ..plan.fit import H200_GB


def add_sweep_args(ap):
    ap.add_argument("file", help="an experiment file (TOML), or the name of a shipped one (byzantium/experiments/"
                                 "configs/: sac_table3_4, ct_table1, mas_main, ...)")
    ap.add_argument("--out", default=None, help="output directory: DIR/sweep.json and DIR/<cell>/ (required "
                                                "unless --dry-run)")
    ap.add_argument("--scale", choices=("smoke", "paper"), default="smoke",
                    help="smoke (default): the embedded model, a few questions, short answers (minutes on a CPU); "
                         "paper: the paper's models and sizes (GPUs)")
    ap.add_argument("--dry-run", action="store_true",
                    help="list the cells, their models, which backend would serve them, the context, problems, "
                         "generated tokens, weights and hours they need; loads nothing")
    ap.add_argument("--limit", type=int, default=None, metavar="N",
                    help="N problems a cell, whatever the file says (recorded in DIR/sweep.json: a rerun into "
                         "the same DIR must give the same --limit)")
    ap.add_argument("--device-memory", type=float, default=None, metavar="GB",
                    help=f"the memory of one GPU (GB, 1e9 bytes) the dry run fits the weights into and plans each "
                         f"model for (default: this machine's GPU by torch.cuda, else {H200_GB:g}, one H200 "
                         f"as CUDA reports it)")
    ap.add_argument("--gpus", type=int, default=1, metavar="N",
                    help="the GPUs the dry run plans each model for (`byzantium plan`: tensor-parallel size and "
                         "quantization; default 1)")
    ap.add_argument("--data-root", default=None, metavar="DIR",
                    help="the directory of the data files the experiment names (default: the file's data_root)")
    add_backend_args(ap)
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    ap.add_argument("--dtype", default=None, help="float32, float16 or bfloat16")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")


def run_flags(args):
    """The sweep's backend and device flags, as every cell's `run` gets them (each flag that
    add_backend_args defines, so that flags added there travel too)."""
    ap = argparse.ArgumentParser(add_help=False)
    add_backend_args(ap)
    ap.add_argument("--device")
    ap.add_argument("--dtype")
    flags = ["--no-progress"]
    for action in ap._actions:
        value = getattr(args, action.dest, None)
        if value == action.default:
            continue
        if action.nargs == 0 or (action.nargs == "?" and value == action.const):  # --enforce-eager, --ray
            flags.append(action.option_strings[0])
        else:
            flags += [action.option_strings[0], str(value)]
    return flags


def cmd_sweep(args):
    # The sweep's modules import the run methods (networkx, numpy): here, not with `byzantium --help`.
    from .cell_checks import parse_cell
    from .config import ConfigError, load_sweep
    from .dry_run import check_dtype, describe, device_memory
    from .running import run_sweep
    if args.out is None and not args.dry_run:
        raise ValueError("--out DIR is required: where the cells' runs and sweep.json go (only --dry-run needs none)")
    try:
        sweep = load_sweep(args.file, args.scale, args.data_root, check_files=True)
    except ConfigError as error:
        raise ValueError(str(error)) from None
    apply_limit(sweep, args.limit)
    if args.device_memory is not None and args.device_memory <= 0:
        raise ValueError(f"--device-memory must be > 0 GB, got {args.device_memory:g}")
    dtype = check_dtype(args.dtype, args.device)
    pool_kwargs(args)  # the backend flags' own checks (--backend openai needs --base-url, ...)
    flags = run_flags(args)
    if args.gpus < 1:
        raise ValueError(f"--gpus must be >= 1, got {args.gpus}")
    for cell in sweep.cells:  # each cell with them, before anything loads
        parse_cell(cell, sweep.path.name, flags)
    if args.dry_run:
        print(describe(sweep, args.backend, dtype, device_memory(args.device_memory), args.gpus, flags))
        return
    result = run_sweep(sweep, args.out, flags, backend=args.backend, progress=not args.no_progress,
                       limit=args.limit)
    return 1 if any(cell["status"] == "failed" for cell in result["cells"]) else 0  # scripts see failed cells


# ---------------------------------------------------------------------------------------- --limit

def apply_limit(sweep, limit):
    """--limit N: every cell's limit becomes N (argv and params, so that sweep.json and the report show it)."""
    if limit is None:
        return
    if limit < 1:
        raise ValueError(f"--limit must be >= 1, got {limit}")
    for cell in sweep.cells:
        where = cell.sources.get("limit", "")
        if "axes" in where or "cells" in where:  # N for all would make those cells one run under several names
            raise ValueError(f"{sweep.path.name}: {where}.limit varies limit across cells; --limit would make "
                             "them the same run: drop --limit or edit the file")
        if "--limit" in cell.argv:
            cell.argv[cell.argv.index("--limit") + 1] = str(limit)
        else:
            cell.argv += ["--limit", str(limit)]
        cell.params["limit"] = limit
        cell.sources["limit"] = "--limit"


COMMAND = Command("sweep", "every cell of an experiment file (TOML), e.g. a paper's table, into DIR/<cell>/; "
                           "resumable (byzantium/experiments/configs/)", add_sweep_args, cmd_sweep)
