"""Datasets of the built-in workloads. All offline, all deterministic.

Every dataset is map-style and *sample i is a pure function of (seed, i)*, so the data position
of a run is one integer (samples consumed): resuming restarts the sampler there and the batches
are bit-identical to an uninterrupted run. ``__getitems__`` builds a whole micro-batch at once
(the DataLoader calls it instead of per-sample ``__getitem__``).
"""

from __future__ import annotations

import math
import os
import sysconfig
import zlib
from pathlib import Path

import numpy as np
import torch

from tensorpilot.errors import ConfigError, first_line

_MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def splitmix64(x: np.ndarray) -> np.ndarray:
    """A fast, well-mixed 64-bit hash (Steele et al., SplitMix, OOPSLA 2014), vectorised."""
    with np.errstate(over="ignore"):
        z = (x.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)) & _MASK64
        z = ((z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)) & _MASK64
        z = ((z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)) & _MASK64
        return z ^ (z >> np.uint64(31))


def sample_hash(seed: int, indices: list[int] | np.ndarray) -> np.ndarray:
    idx = np.asarray(indices, dtype=np.uint64)
    return splitmix64(idx ^ splitmix64(np.asarray([seed], dtype=np.uint64)))


# ----------------------------------------------------------------------------------- text

class ByteWindows(torch.utils.data.Dataset):
    """Random windows of a byte corpus: sample i = (x, y) with y = x shifted by one byte."""

    def __init__(self, data: torch.Tensor, seq_len: int, seed: int, length: int = 2**40):
        if data.numel() < seq_len + 1:
            raise ConfigError(f"the text corpus has {data.numel()} bytes, fewer than one window of "
                              f"{seq_len + 1}; give more text or a smaller model.seq_len.")
        self.data, self.seq_len, self.seed, self.length = data, seq_len, seed, length
        self._span = torch.arange(seq_len + 1)

    def __len__(self) -> int:
        return self.length

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        n_starts = self.data.numel() - self.seq_len          # last start: numel - (seq_len + 1)
        starts = torch.from_numpy((sample_hash(self.seed, indices) % np.uint64(n_starts)).astype(np.int64))
        windows = self.data[starts[:, None] + self._span].long()      # (B, T+1)
        return windows[:, :-1], windows[:, 1:]                        # (B, T), (B, T)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.__getitems__([i])
        return x[0], y[0]


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _text_files(root: Path) -> list[Path]:
    if root.is_file():
        return [root]
    if root == stdlib_root():                 # its .py files; site-packages (tens of thousands of
        files = []                            # files in a torch environment) is never walked
        for folder, subdirs, names in os.walk(root):
            subdirs[:] = [d for d in subdirs if d != "site-packages"]
            files += [Path(folder, n) for n in names if n.endswith(".py")]
    else:  # skip hidden files and folders (.git, .venv, ...)
        files = [p for p in root.rglob("*") if p.is_file()
                 and not any(part.startswith(".") for part in p.relative_to(root).parts)]
    return sorted(files)


def load_text_corpus(path: str | None, val_fraction: float, max_bytes: int
                     ) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """(train bytes, validation bytes, description) as uint8 tensors.

    Several files are split by file (a file goes to validation when crc32 of its relative path
    falls in the validation share), so no text is shared between the splits; a single usable
    file is split at its last ``val_fraction`` of bytes. Files with NUL bytes (binaries) are
    skipped; at most ``max_bytes`` are read, in sorted path order.
    """
    root = Path(path).expanduser() if path else stdlib_root()
    if not root.exists():
        raise ConfigError(f"data path {str(root)!r} does not exist.")
    usable: list[tuple[Path, bytes]] = []
    total = 0
    for f in _text_files(root):
        if total >= max_bytes:
            break
        try:
            with open(f, "rb") as fh:                # never more than is still wanted: a corpus
                blob = fh.read(max_bytes - total)    # may be larger than memory
        except OSError:
            continue
        if blob and b"\x00" not in blob:
            usable.append((f, blob))
            total += len(blob)
    train_parts: list[bytes] = []
    val_parts: list[bytes] = []
    if len(usable) == 1:
        blob = usable[0][1]
        cut = int(len(blob) * (1 - val_fraction))
        train_parts, val_parts = [blob[:cut]], [blob[cut:]]
    for f, blob in usable if len(usable) > 1 else []:
        rel = f.relative_to(root).as_posix().encode()
        (val_parts if zlib.crc32(rel) % 10_000 < val_fraction * 10_000 else train_parts).append(blob)
    if not val_parts and len(train_parts) > 1:
        val_parts.append(train_parts.pop())
    if not train_parts and len(val_parts) > 1:
        train_parts.append(val_parts.pop(0))
    train, val = b"".join(train_parts), b"".join(val_parts)
    if not train or not val:
        raise ConfigError(f"no usable text found in {str(root)!r} (empty or binary files only).")
    desc = {"source": "python-stdlib" if path is None else str(root), "files": len(usable),
            "train_bytes": len(train), "val_bytes": len(val)}
    to_tensor = lambda b: torch.frombuffer(bytearray(b), dtype=torch.uint8)  # noqa: E731
    return to_tensor(train), to_tensor(val), desc


# ------------------------------------------------------------------------------ tensors

class SyntheticClasses(torch.utils.data.Dataset):
    """Class-conditional Gaussians: x = prototype[y] + noise, y = hash(i) mod classes.

    Learnable (the loss falls) yet never exhausted; sample i depends only on (seed, i).
    """

    MAX_PROTOTYPE_BYTES = 4 * 2**30     # the class prototypes live in memory: a sane bound

    def __init__(self, input_shape: list[int], num_classes: int, seed: int, length: int,
                 signal: float = 0.5):
        size = num_classes * math.prod(input_shape) * 4
        if size > self.MAX_PROTOTYPE_BYTES:
            raise ConfigError(f"synthetic data of {num_classes:,} classes of shape {list(input_shape)} "
                              f"needs {size / 2**30:,.1f} GiB of class prototypes (at most "
                              f"{self.MAX_PROTOTYPE_BYTES / 2**30:g} GiB); use fewer --data.num_classes or a "
                              "smaller --data.input_shape.")
        g = torch.Generator().manual_seed(seed)
        if len(input_shape) == 3:
            # images: smooth class patterns (4x4 noise upsampled), which convolutions and pooling
            # can detect; white-noise prototypes would average away under global pooling
            c, h, w = input_shape
            coarse = torch.randn(num_classes, c, 4, 4, generator=g)
            protos = torch.nn.functional.interpolate(coarse, size=(h, w), mode="bilinear", align_corners=False)
            self.prototypes = protos / protos.std() * signal
        else:
            self.prototypes = torch.randn(num_classes, *input_shape, generator=g) * signal
        self.num_classes, self.seed, self.length = num_classes, seed, length
        self.input_shape = list(input_shape)

    def __len__(self) -> int:
        return self.length

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        h = sample_hash(self.seed, indices)
        y = torch.from_numpy((h % np.uint64(self.num_classes)).astype(np.int64))
        noise = np.stack([np.random.Generator(np.random.Philox(key=int(k))).standard_normal(
            self.input_shape, dtype=np.float32) for k in h])
        return self.prototypes[y] + torch.from_numpy(noise), y      # (B, *shape), (B,)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.__getitems__([i])
        return x[0], y[0]


class ShuffledEpochs(torch.utils.data.Dataset):
    """Endless view of a finite map-style dataset: sample i is item perm_e[i mod N] of epoch
    e = i // N, with a fresh seeded permutation per epoch (so sample i depends on (seed, i))."""

    def __init__(self, dataset, seed: int):
        self.dataset, self.seed, self.n = dataset, seed, len(dataset)
        if self.n == 0:
            raise ConfigError("the dataset is empty.")
        self._perm: tuple[int, torch.Tensor] | None = None

    def __len__(self) -> int:
        return 2**40

    # Above this many samples the permutation is computed, not stored: randperm of 10^9 rows
    # would take 8 GB before the first step
    STORED_PERMUTATION_MAX = 2**24

    def _rows(self, indices: list[int]) -> list[int]:
        rows = []
        for i in indices:
            epoch = i // self.n
            if self._perm is None or self._perm[0] != epoch:
                g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
                self._perm = (epoch, torch.randperm(self.n, generator=g) if self.n <= self.STORED_PERMUTATION_MAX
                              else _affine_permutation(self.n, g))
            perm = self._perm[1]
            rows.append(int(perm[i % self.n]) if isinstance(perm, torch.Tensor) else perm(i % self.n))
        return rows

    def __getitems__(self, indices: list[int]):
        rows = self._rows(indices)
        if hasattr(self.dataset, "__getitems__"):
            return self.dataset.__getitems__(rows)
        return [self.dataset[r] for r in rows]          # collated by the loader

    def __getitem__(self, i: int):
        return self.dataset[self._rows([i])[0]]


def _affine_permutation(n: int, g: torch.Generator):
    """A seeded permutation of range(n) in O(1) memory: j -> (a j + b) mod n with a coprime to n
    (a bijection of Z_n). Less random than a shuffle -- consecutive positions step by a fixed
    stride -- but every sample is seen once per epoch in a seed-dependent order."""
    a = int(torch.randint(1, n, (1,), generator=g))
    while math.gcd(a, n) != 1:
        a = a % (n - 1) + 1
    b = int(torch.randint(0, n, (1,), generator=g))
    return lambda j: (a * j + b) % n


class Tensors(torch.utils.data.Dataset):
    """(inputs[i], targets[i]); a whole batch is one indexing operation."""

    def __init__(self, inputs: torch.Tensor, targets: torch.Tensor):
        self.inputs, self.targets = inputs, targets

    def __len__(self) -> int:
        return self.inputs.shape[0]

    def __getitems__(self, rows: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.tensor(rows)
        return self.inputs[idx], self.targets[idx]

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.inputs[i], self.targets[i]


def _pick(mapping: dict, names: tuple[str, ...], path: str) -> torch.Tensor:
    for n in names:
        if n in mapping:
            return torch.as_tensor(np.asarray(mapping[n])) if not isinstance(mapping[n], torch.Tensor) else mapping[n]
    raise ConfigError(f"{path!r} must hold tensors named {names[0]!r} and 'targets' (or 'x' and 'y').")


def load_tensors(path: str, targets_path: str | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and integer targets from .pt (dict or pair; loaded without unpickling code),
    .npz (arrays inputs/targets or x/y) or .npy (+ ``targets_path`` .npy)."""
    p = Path(path).expanduser()
    suffix = p.suffix.lower()
    try:
        if suffix == ".pt" or suffix == ".pth":
            obj = torch.load(p, map_location="cpu", weights_only=True)
            if isinstance(obj, (tuple, list)) and len(obj) == 2:
                inputs, targets = obj
            elif isinstance(obj, dict):
                inputs, targets = _pick(obj, ("inputs", "x"), path), _pick(obj, ("targets", "y"), path)
            else:
                raise ConfigError(f"{path!r} must hold a dict with 'inputs' and 'targets' or an (inputs, targets) pair.")
        elif suffix == ".npz":
            with np.load(p, allow_pickle=False) as z:
                inputs, targets = _pick(z, ("inputs", "x"), path), _pick(z, ("targets", "y"), path)
        elif suffix == ".npy":
            if not targets_path:
                raise ConfigError(f"{path!r} holds inputs only: give the targets with --data.targets_path.")
            inputs = torch.from_numpy(np.load(p, allow_pickle=False))
            try:
                targets = torch.from_numpy(np.load(Path(targets_path).expanduser(), allow_pickle=False))
            except Exception as exc:            # name the targets file, not the inputs file
                raise ConfigError(f"cannot read targets file {targets_path!r}: {first_line(exc)}.") from None
        else:
            raise ConfigError(f"unsupported data file {path!r}: use .pt, .npz or .npy.")
    except ConfigError:
        raise
    except Exception as exc:  # corrupt/unreadable file: say which, without a traceback
        raise ConfigError(f"cannot read data file {path!r}: {exc}".rstrip(".") + ".") from None
    try:
        inputs, targets = torch.as_tensor(inputs), torch.as_tensor(targets)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise ConfigError(f"{path!r} must hold numeric arrays: {first_line(exc)}.") from None
    check_classification(inputs, targets, path)
    return inputs.float(), targets.long()


MAX_CLASSES = 2**24   # 16.8M: ~800x ImageNet-21k's classes, ~60x the largest LM vocabularies


def check_classification(inputs: torch.Tensor, targets: torch.Tensor, path: str) -> None:
    """Inputs with one row per sample and targets of class indices 0..C-1, or a ConfigError."""
    if inputs.dim() == 0 or targets.dim() == 0:
        raise ConfigError(f"{path!r} holds a single value (a 0-d array), not one row per sample.")
    if inputs.dim() < 2:
        raise ConfigError(f"inputs of {path!r} have shape {tuple(inputs.shape)}: one sample per row "
                          f"needs at least 2 dimensions, (samples, features...); for one feature "
                          f"per sample save them as shape ({inputs.shape[0]}, 1).")
    if inputs.shape[0] != targets.shape[0] or inputs.shape[0] < 2:
        raise ConfigError(f"inputs ({tuple(inputs.shape)}) and targets ({tuple(targets.shape)}) must "
                          "have the same number of samples, at least 2.")
    if targets.dtype.is_floating_point or targets.dtype.is_complex or targets.dtype == torch.bool \
            or targets.dim() != 1:
        raise ConfigError("targets must be a 1-D tensor of integer class indices.")
    if inputs.dtype.is_complex:
        raise ConfigError(f"inputs of {path!r} are complex numbers; give real-valued inputs.")
    low, high = int(targets.min()), int(targets.max())
    if low < 0:
        raise ConfigError(f"targets of {path!r} hold the class index {low}: class indices start at 0.")
    if high >= MAX_CLASSES:
        raise ConfigError(f"targets of {path!r} hold the class index {high}: class indices must be "
                          f"0..C-1 with C below {MAX_CLASSES:,} classes.")


def split_tensors(inputs: torch.Tensor, targets: torch.Tensor, val_fraction: float, seed: int):
    n = inputs.shape[0]
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    n_val = max(1, int(n * val_fraction))
    val, train = perm[:n_val], perm[n_val:]
    return (inputs[train], targets[train]), (inputs[val], targets[val])
