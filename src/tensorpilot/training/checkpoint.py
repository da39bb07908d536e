"""Checkpoints: atomic, self-describing, and loaded without unpickling arbitrary objects.

Layout of ``<run-dir>/checkpoints/step_00000100/``:
    model.safetensors   weights (tied tensors stored once)
    state.pt            optimizer, scheduler, scaler, step, data position, RNG states; only
                        tensors, numbers, strings and containers, read with weights_only=True
    meta.json           run config, workload facts, versions, SHA-256 of the two files above

A checkpoint is written into ``step_*.tmp-<pid>``, every file fsync'd, then the directory is
renamed into place and its parent fsync'd. A crash at any point leaves either the complete new
checkpoint or none, and never touches the previous one. The newest complete ``step_*``
directory is the one to resume; half-written ``*.tmp-*`` directories are ignored and cleaned.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tensorpilot.errors import CheckpointError

STEP_DIR = re.compile(r"^step_(\d{8})$")
FILES = ("model.safetensors", "state.pt")


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def list_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoints under ``root`` (a checkpoints/ directory), oldest first."""
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := STEP_DIR.match(p.name)) and p.is_dir()]
    return [p for _, p in sorted(found)]


def find_checkpoint(path: str | Path) -> Path:
    """A checkpoint directory from a run directory (its newest) or a checkpoint directory."""
    p = Path(path).expanduser()
    if not p.exists():
        raise CheckpointError(f"run or checkpoint directory {str(path)!r} does not exist.")
    if (p / "meta.json").exists() or STEP_DIR.match(p.name):
        return p
    ckpts = list_checkpoints(p / "checkpoints")
    if not ckpts:
        raise CheckpointError(f"{str(path)!r} holds no complete checkpoint (checkpoints/step_N with meta.json).")
    return ckpts[-1]


def save(root: Path, step: int, model, state: dict[str, Any], meta: dict[str, Any], keep: int) -> Path:
    """Write checkpoint ``step`` atomically under ``root`` and prune to the newest ``keep``."""
    import torch
    from safetensors.torch import save_model

    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:08d}"
    if final.exists():
        return final                                  # this exact step is already on disk
    tmp = root / f"{final.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        save_model(model, str(tmp / "model.safetensors"))
        torch.save(state, tmp / "state.pt")
        meta = dict(meta, step=step, sha256={f: _sha256(tmp / f) for f in FILES})
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1, default=str))
        for f in (*FILES, "meta.json"):
            _fsync_path(tmp / f)
        _fsync_path(tmp)
        os.rename(tmp, final)
        _fsync_path(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for old in list_checkpoints(root)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    for stale in root.glob("step_*.tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    return final


@dataclass
class Loaded:
    path: Path
    meta: dict[str, Any]
    state: dict[str, Any]


def read_meta(ckpt: Path) -> dict[str, Any]:
    try:
        meta = json.loads((ckpt / "meta.json").read_text())
        if not isinstance(meta, dict):
            raise ValueError("not a JSON object")
        return meta
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {str(ckpt)!r} is incomplete: meta.json is missing.") from None
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"checkpoint {str(ckpt)!r} is corrupt: cannot read meta.json ({exc}).") from None


def verify(ckpt: Path, meta: dict[str, Any]) -> None:
    for f in FILES:
        path = ckpt / f
        if not path.exists():
            raise CheckpointError(f"checkpoint {str(ckpt)!r} is incomplete: {f} is missing.")
        expected = (meta.get("sha256") or {}).get(f)
        if not expected:
            raise CheckpointError(f"checkpoint {str(ckpt)!r} is corrupt: meta.json has no checksum for {f}.")
        if _sha256(path) != expected:
            raise CheckpointError(f"checkpoint {str(ckpt)!r} is corrupt: {f} does not match its checksum.")


def load_weights(ckpt: Path, model) -> None:
    """Load model.safetensors into ``model`` (strict: every tensor present and of equal shape)."""
    from safetensors.torch import load_model

    try:
        load_model(model, str(ckpt / "model.safetensors"), strict=True)
    except Exception as exc:  # safetensors raises several types for truncated/mismatched files
        raise CheckpointError(f"checkpoint {str(ckpt)!r} does not fit this model: "
                              f"{str(exc).splitlines()[0][:300]}.") from None


def load(ckpt: Path, model) -> Loaded:
    """Verify checksums, load weights into ``model`` and return the trainer state."""
    import torch

    meta = read_meta(ckpt)
    verify(ckpt, meta)
    load_weights(ckpt, model)
    try:
        state = torch.load(ckpt / "state.pt", map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CheckpointError(f"checkpoint {str(ckpt)!r} is corrupt: cannot read state.pt "
                              f"({str(exc).splitlines()[0][:200]}).") from None
    return Loaded(ckpt, meta, state)
