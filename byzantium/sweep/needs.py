"""What a cell needs of the machine it runs on (a context length, its models, its data) and whether
this machine has it, looked up without any network call."""
import json
import os
from pathlib import Path

from .cells import COMMANDS

PROMPT_BUDGET = 512  # prompt tokens assumed per request when sizing max_model_len (prompt_budget = ...)
NOT_HERE = ("is not on this machine (no checkpoint directory, not in the Hugging Face cache): download it "
            "(huggingface-cli download NAME) for a GPU with the weights, or serve it and pass "
            "--backend openai --base-url URL")


def needed_len(cell, prompt_budget=PROMPT_BUDGET):
    """The max_model_len a cell needs: the longest prompt plus what is generated after it, as its method
    counts them (its Command's sweep_length; an estimate: the prompt is prompt_budget tokens)."""
    return COMMANDS[cell.method].sweep_length(cell.params, prompt_budget)


def model_context(name, settings):
    """The context the engine gets for a model: [models."name"].max_model_len, else the checkpoint's
    max_position_embeddings when it is here; None when unknown (a model not on this machine)."""
    limit = settings.get(str(name), {}).get("max_model_len") if name is not None else None
    if limit is not None:
        return limit
    where = local_model(name)
    try:
        if where == "hub cache":  # read from the cache as it is: no hub call
            from huggingface_hub import try_to_load_from_cache
            path = Path(try_to_load_from_cache(str(name), "config.json"))
        elif where is not None:
            from ..engine.loader import resolve_model
            path = Path(resolve_model(name)) / "config.json"
        else:
            return None
        config = json.loads(path.read_text())
    except Exception:  # an unreadable config: the engine will say
        return None
    config = config.get("text_config", config)
    return config.get("max_position_embeddings")


def local_model(name):
    """Where a model is on this machine, without any network call: "embedded", "path", "hub cache";
    None when it is not here (it needs a server or a download)."""
    from ..engine.loader import EMBEDDED, HUB_ID
    if name is None or str(name).lower() in EMBEDDED:
        return "embedded"
    if Path(name).expanduser().exists():
        return "path"
    if HUB_ID.match(str(name)):
        try:
            from huggingface_hub import try_to_load_from_cache
            if isinstance(try_to_load_from_cache(str(name), "config.json"), str):
                return "hub cache"
        except Exception:
            return None
    return None


def serving(name, backend):
    """Which backend would serve a model, in words."""
    if backend == "openai":
        return "the server at --base-url"
    where = local_model(name)
    if where is not None:
        return f"the local engine ({where})"
    return "not here: needs --backend openai --base-url ... or a GPU with the weights"


def hub_dataset(cell):
    """The Hugging Face hub id a cell's questions would be downloaded from (a dataset name as its task
    and no data file), or None."""
    from ..tasks import HUB
    if "--data" in cell.argv or "--task" not in cell.argv:
        return None
    base = cell.argv[cell.argv.index("--task") + 1].split(":")[0]
    return HUB[base][0] if base in HUB else None


def hub_offline():
    """Whether the environment forbids the hub (the variables `datasets` and huggingface_hub obey)."""
    return any(os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on")
               for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


def hub_cached(hub_id):
    """Whether a hub dataset is in the local caches (huggingface_hub's or `datasets`'), looked up on disk
    only: a dry run makes no network call. Paths from the environment at call time (as the libraries
    read it at import)."""
    home = Path(os.environ.get("HF_HOME") or Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache") / "huggingface")
    hub = Path(os.environ.get("HF_HUB_CACHE") or home / "hub").expanduser()
    data = Path(os.environ.get("HF_DATASETS_CACHE") or home / "datasets").expanduser()
    return (hub / f"datasets--{hub_id.replace('/', '--')}").is_dir() or (data / hub_id.replace("/", "___")).is_dir()


def hub_note(cell):
    """The dry run's word on a download the run would make (offline, cell_problem says it cannot)."""
    hub_id = hub_dataset(cell)
    if hub_id is None or hub_offline() or hub_cached(hub_id):
        return ""
    return (f"  [needs the Hugging Face hub: {hub_id} is not in the local cache, downloaded at run time; "
            f"without network give the task a data file]")


def cell_problem(sweep, cell, backend):
    """Why the cell cannot run here (a message), or None."""
    hub_id = hub_dataset(cell)
    if hub_id is not None and hub_offline() and not hub_cached(hub_id):
        return (f"cannot run here: its questions need the Hugging Face hub ({hub_id}), not in the local cache, "
                f"and the hub is off (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE); give the task a data file")
    for name in cell.models:
        if backend != "openai" and local_model(name) is None:
            return f"model {name!r} {NOT_HERE}"
    need = needed_len(cell, sweep.prompt_budget)
    for name in cell.models:
        limit = model_context(name, sweep.models)
        if limit is not None and need > limit:
            return (f"needs max_model_len {need} (prompt budget {sweep.prompt_budget} + generation) but model "
                    f"{name or 'smollm2-135m'!r} has a context of {limit}; shorten max_len/max_tokens")
    return None
