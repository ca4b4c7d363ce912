"""`byzantium sweep ... --dry-run`: what each cell needs, loading nothing and reading nothing from the
network: its problems, generated tokens (an upper bound), the weights of its models against the
device's memory, and the hours at a decode rate measured in bench/results/ (none is invented); per
model, the plan `byzantium plan` makes for it on --gpus N such GPUs (tensor-parallel size, quantization,
KV tokens left) and, where the file or the sweep's flags set them, how the run's settings fare."""
import functools
import json
import re
from pathlib import Path

from ..experiments.report_cells import short_model
from ..plan.facts import model_facts
from ..plan.fit import DEFAULT_SEQS, GIB, H200_GB, H200_GIB, option, plan_model, tp_sizes
from .cells import COMMANDS, DEFAULT_TASK, ENGINE_KEYS, model_engine
from .needs import cell_problem, hub_note, local_model, model_context, needed_len, serving

DEVICE_MEMORY_GB = H200_GB  # one H200 as CUDA reports it (139.8 GiB), with no GPU here to ask
WEIGHTS_SHARE = 0.8  # the weights must leave a fifth of the device for the KV cache and activations
DTYPE_BYTES = {"float32": 4, "fp32": 4, "float": 4, "float16": 2, "fp16": 2, "half": 2, "bfloat16": 2, "bf16": 2}
# Mixture-of-experts names give the active parameters and the experts, not the total the device holds:
# the totals from the model cards. Any other xB-yE name is "unknown" rather than a guess.
MOE_TOTAL = {"17B-16E": 109e9, "17B-128E": 400e9, "8x7B": 46.7e9, "8x22B": 141e9}
BENCH = Path(__file__).resolve().parents[2] / "bench" / "results"  # measured throughput (a source checkout)


def check_dtype(dtype, device):
    """The dtype the weights are sized in: --dtype, else the engine's default (bfloat16 on a GPU,
    float32 with --device cpu)."""
    dtype = (dtype or ("float32" if device == "cpu" else "bfloat16")).lower()
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"unknown --dtype {dtype!r}; choose float32, float16 or bfloat16")
    return dtype


def device_memory(flag_gb=None):
    """(bytes, where the number comes from): --device-memory when given (planning for another machine),
    else this machine's first GPU, else one H200."""
    if flag_gb is not None:
        return flag_gb * 1e9, "--device-memory"
    try:
        import torch
        if torch.cuda.is_available():
            return torch.cuda.get_device_properties(0).total_memory, torch.cuda.get_device_name(0)
    except Exception:  # no usable torch.cuda: the default below
        pass
    return DEVICE_MEMORY_GB * 1e9, f"default: one H200, {H200_GIB:g} GiB"


def _arg(cell, flag):
    return cell.argv[cell.argv.index(flag) + 1] if flag in cell.argv else None


def cell_problems(cell):
    """Problems a cell runs: a data file's records cut by sample and limit; a generator's limit (default
    100); a hub dataset's limit or sample; None when unknown (a hub dataset without either, an unreadable file)."""
    from ..tasks import TASKS
    from ..tasks.resilience import BUILTIN_TASKS
    limit, sample = cell.params.get("limit"), cell.params.get("sample")
    caps = [n for n in (sample, limit) if n]
    data = _arg(cell, "--data")
    if data is not None:
        n = _records(data)
        return None if n is None else min([n] + caps)
    task = _arg(cell, "--task") or DEFAULT_TASK[cell.method]
    if task in TASKS or task in BUILTIN_TASKS or task.startswith("gen-"):
        return limit or 100
    return min(caps) if caps else None


@functools.cache
def _records(path):
    from ..tasks import read_records
    try:
        return len(read_records(path))
    except (OSError, ValueError):
        return None


def cell_tokens(cell):
    """Generated tokens per problem, an upper bound (every answer runs to its length limit), as the
    cell's method counts them (its Command's sweep_tokens)."""
    return COMMANDS[cell.method].sweep_tokens(cell.params)


def model_params(name):
    """(parameters, where the number comes from), or (None, why unknown): a local checkpoint's
    safetensors headers, else the count in the name (70B, 135M; mixture-of-experts: the total)."""
    where = local_model(name)
    if where in ("path", "hub cache"):
        try:
            from ..engine.memory import checkpoint_params
            if where == "hub cache":  # the snapshot as it is in the cache: no hub call
                from huggingface_hub import try_to_load_from_cache
                folder = Path(try_to_load_from_cache(str(name), "config.json")).parent
            else:
                folder = Path(name).expanduser()
            count = checkpoint_params(folder) if folder.is_dir() else 0
            if count:
                return count, "its checkpoint"
        except Exception:  # an unreadable checkpoint: the name below
            pass
    base = short_model(name) if name is not None else "smollm2-135m"
    moe = re.search(r"(?:^|[-_])(\d+B-\d+E|\d+x\d+B)(?=$|[-_])", base, re.I)
    if moe:
        key = moe[1].upper().replace("X", "x")
        return (MOE_TOTAL[key], "its name (MoE total)") if key in MOE_TOTAL else (None, f"MoE {key}: total unknown")
    count = re.search(r"(?:^|[-_])(\d+(?:\.\d+)?)([BM])(?=$|[-_])", base, re.I)
    if count:
        return float(count[1]) * (1e9 if count[2].upper() == "B" else 1e6), "its name"
    return None, "no parameter count in its name"


@functools.cache
def measured_rates():
    """{model (lower case): (generated tok/s, device, file, batch)} from bench/results/*.json: the engine's
    decode rate at the largest batch measured (a sweep decodes many sequences at once); a GPU measurement
    wins over a CPU one. Empty outside a source checkout."""
    rates = {}
    for path in sorted(BENCH.glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        for run in data if isinstance(data, list) else [data]:
            if not isinstance(run, dict) or not isinstance(run.get("model"), str):
                continue
            rows = [r for r in run.get("rows") or [] if isinstance(r, dict)
                    and isinstance(r.get("byzantium"), dict) and r["byzantium"].get("decode_tok_s")]
            key, device = run["model"].lower(), str(run.get("device", "?"))
            if not rows or (key in rates and rates[key][1] == "cuda" and device != "cuda"):
                continue
            best = max(rows, key=lambda r: r.get("batch", 0))
            rates[key] = (float(best["byzantium"]["decode_tok_s"]), device, path.name, best.get("batch"))
    return rates


def measured_rate(name):
    return measured_rates().get((short_model(name) if name is not None else "smollm2-135m").lower())


def _si(n):
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return f"{n:.0f}"


def _hours(h):
    return f"{h:.1f} h" if h >= 0.1 else f"{h * 60:.1f} min" if h * 60 >= 0.1 else f"{h * 3600:.1f} s"


def run_engine(sweep, name, flags=()):
    """The engine settings a model's cells run with: the file's [models] ones, the sweep's own
    --tensor-parallel-size / --quantization winning. {"tensor_parallel_size", "quantization"}."""
    flags = list(flags)
    if "--backend" in flags and flags[flags.index("--backend") + 1] != "native":  # the engine's options only
        return model_engine({}, name)
    engine = model_engine(sweep.models, name)
    for key, flag in ENGINE_KEYS.items():
        if flag in flags:
            value = flags[flags.index(flag) + 1]
            engine[key] = int(value) if key == "tensor_parallel_size" else value
    return engine


def estimate(sweep, cell, backend, dtype, budget, gpus=1, flags=()):
    """A cell's dry-run numbers: {problems, tokens, weights (bytes a GPU), fits, hours, device}; None for
    unknown. A model split over TP GPUs holds 1/TP of its weights on each; fp8 weights are a byte each."""
    problems = cell_problems(cell)
    tokens = None if problems is None else problems * cell_tokens(cell)
    if backend == "openai":  # served elsewhere: no weights here, and the server's speed is not measured
        return dict(problems=problems, tokens=tokens, weights=None, fits=None, hours=None, device=None)
    sizes, split = [], True
    for name in cell.models:
        engine, count = run_engine(sweep, name, flags), model_params(name)[0]
        size = 1 if engine["quantization"] == "fp8" else DTYPE_BYTES[dtype]
        sizes.append(None if count is None else count * size / engine["tensor_parallel_size"])
        split = split and engine["tensor_parallel_size"] <= gpus
    weights = None if None in sizes else sum(sizes)
    rates = [measured_rate(m) for m in cell.models]
    known = tokens is not None and None not in rates
    slowest = min(rates, key=lambda r: r[0]) if known else None  # several models: the slowest bounds it
    return dict(problems=problems, tokens=tokens, weights=weights,
                fits=None if weights is None else weights <= budget and split,
                hours=tokens / slowest[0] / 3600 if known else None, device=slowest[1] if known else None)


def model_plan(sweep, name, need, memory, gpus, flags=()):
    """A model's plan in words (byzantium plan's rules for it alone on `gpus` GPUs of `memory` bytes, KV
    room for DEFAULT_SEQS sequences of `need` tokens), and how the run's own settings fare when set."""
    try:
        facts = model_facts(name if name is not None else "smollm2-135m")
    except ValueError as error:
        return "; plan unknown (" + ("not on this machine nor in the planner's table"
                                     if str(error).startswith("unknown model") else str(error)) + ")"
    tokens = DEFAULT_SEQS * need
    where = f"{gpus} x {memory / GIB:.1f} GiB"
    opts, chosen = plan_model(facts, gpus, memory, tokens)
    text = (f"; plan on {where}: " + (f"{chosen.label()}, {chosen.kv_tokens / 1e3:.0f}k KV tokens left"
                                      if chosen is not None else "does not fit") +
            f" ({DEFAULT_SEQS} x {need} needed)")
    engine = run_engine(sweep, name, flags)
    tp = engine["tensor_parallel_size"]
    quantization = "fp8" if engine["quantization"] == "fp8" or facts.fp8_checkpoint else "bf16"
    if chosen is not None and (tp, quantization) == (chosen.tp, chosen.quantization):
        return text + (", as set" if engine != model_engine({}, name) else "")
    said = f"; as set, TP {tp} {quantization}: "
    if tp not in tp_sizes(facts, tp):
        return text + said + (f"TP {tp} is not a TP size it splits into (powers of two dividing its {facts.heads} "
                              "heads, its experts and MLP widths)")
    if tp > gpus:
        return text + said + f"needs {tp} GPUs (--gpus {gpus})"
    used = option(facts, tp, quantization, memory, tokens)
    return text + said + (f"{used.kv_tokens / 1e3:.0f}k KV tokens" if used.fits else
                          "does not fit" if used.kv_bytes <= 0 else f"{used.kv_tokens / 1e3:.0f}k KV tokens, too few")


def describe(sweep, backend="native", dtype="bfloat16", memory=None, gpus=1, flags=()) -> str:
    """The dry run's listing: per cell its method, problems, generated tokens, context, weights against
    the device and hours; per model who serves it, its context, size and plan; the totals. flags: the
    sweep's own run flags (its --tensor-parallel-size / --quantization win over the file's)."""
    memory, memory_from = memory or device_memory()
    budget = WEIGHTS_SHARE * memory
    flags = list(flags) + (["--backend", backend] if "--backend" not in flags and backend != "native" else [])
    lines = [f"{sweep.path.name}: {sweep.paper} {sweep.table}, scale {sweep.scale}: {len(sweep.cells)} cells",
             f"{'cell':<48} {'method':<10} {'problems':>8} {'gen tokens':>10} {'needs len':>9} "
             f"{'weights':>9} {'fits':<5} {'hours':<18} models"]
    totals = []
    for cell in sweep.cells:
        e = estimate(sweep, cell, backend, dtype, budget, gpus, flags)
        totals.append(e)
        models = ", ".join(short_model(m) for m in cell.models)
        problem = cell_problem(sweep, cell, backend)
        served = backend == "openai"
        hours = "served" if served else (
            f"{_hours(e['hours'])} ({e['device']})" if e["hours"] is not None else "no measured rate")
        weights = "-" if served else f"{e['weights'] / 1e9:.1f} GB" if e["weights"] is not None else "unknown"
        fits = "-" if served else {True: "yes", False: "NO", None: "?"}[e["fits"]]
        tokens = _si(e["tokens"]) if e["tokens"] is not None else "unknown"
        lines.append(f"{cell.name:<48} {cell.method:<10} {e['problems'] or 'unknown':>8} {tokens:>10} "
                     f"{needed_len(cell, sweep.prompt_budget):>9} {weights:>9} {fits:<5} {hours:<18} {models}"
                     + ("  [cannot run here: see its model below]" if problem and problem.startswith("model ")
                        else f"  [{problem}]" if problem else "") + hub_note(cell))
    lines.append("models:")
    for name in dict.fromkeys(m for cell in sweep.cells for m in cell.models):
        how = serving(name, backend)
        need = max(needed_len(c, sweep.prompt_budget) for c in sweep.cells if name in c.models)
        context = model_context(name, sweep.models)
        kwargs = sweep.models.get(str(name), {}).get("chat_template_kwargs")
        size = ""
        if backend != "openai":
            count, source = model_params(name)
            fp8 = run_engine(sweep, name, flags)["quantization"] == "fp8"
            size = (f"; weights unknown ({source})" if count is None else
                    f"; weights {count * (1 if fp8 else DTYPE_BYTES[dtype]) / 1e9:.1f} GB ({_si(count)} parameters "
                    f"from {source}, {'fp8' if fp8 else dtype})")
            rate = measured_rate(name)
            size += (f"; {rate[0]:.0f} generated tok/s measured on {rate[1]} (bench/results/{rate[2]}, "
                     f"batch {rate[3]})" if rate else "; no measured rate")
            size += model_plan(sweep, name, need, memory, gpus, flags) if backend == "native" else ""
        lines.append(f"  {name or 'smollm2-135m (embedded)'}: {how}; max_model_len needed {need}"
                     + (f" (context {context})" if context else "") + size
                     + (f"; chat_template_kwargs {json.dumps(kwargs)}" if kwargs else ""))
    problems = [e["problems"] for e in totals if e["problems"] is not None]
    tokens = [e["tokens"] for e in totals if e["tokens"] is not None]
    hours = [e["hours"] for e in totals if e["hours"] is not None]
    unsized, unrated = len(totals) - len(problems), len(totals) - len(hours)
    lines.append(f"total: {sum(problems)} problems, {_si(sum(tokens))} generated tokens"
                 + (f" ({unsized} cells of unknown size not counted)" if unsized else "")
                 + ("" if backend == "openai" else
                    "; no measured rate for any cell" if not hours else
                    f"; {_hours(sum(hours))} at measured rates"
                    + (f" ({unrated} cells with no measured rate not counted)" if unrated else "")))
    if backend != "openai":
        lines.append(f"fits: the weights of a cell's models within {WEIGHTS_SHARE:.0%} of {memory / 1e9:.0f} GB "
                     f"({memory_from}; --device-memory GB to plan for another), the rest left for the KV cache; "
                     f"weights are a GPU's share (1/TP of a model split over TP GPUs; fp8 a byte a weight)")
    if backend == "native":
        lines.append(f"plan: `byzantium plan`'s for each model alone on --gpus {gpus} such GPU{'s' if gpus > 1 else ''} "
                     f"(bf16 at the smallest TP that fits, else fp8), KV room for {DEFAULT_SEQS} sequences of the "
                     "length it needs; set a plan with [models.\"name\"] tensor_parallel_size / quantization")
    lines.append("gen tokens: an upper bound, every answer at its length limit (sweep/dry_run.py, the method's sweep_tokens); needed "
                 f"length = prompt budget ({sweep.prompt_budget} tokens, an estimate) + what the cell generates "
                 "after it (sweep/needs.py, the method's sweep_length)")
    return "\n".join(lines)
