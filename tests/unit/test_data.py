"""Built-in datasets: sample i is a pure function of (seed, i); corpus splits share no file;
user tensor files load without unpickling code."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
import torch

from malicious import EXECUTED, Payload   # a pickle that runs code when loaded
from tensorpilot.errors import ConfigError
from tensorpilot.workloads.data import (
    ByteWindows,
    ShuffledEpochs,
    SyntheticClasses,
    Tensors,
    load_tensors,
    load_text_corpus,
    split_tensors,
)


def random_bytes(n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n,), generator=g, dtype=torch.uint8)


def find_window(data: torch.Tensor, x: torch.Tensor) -> int:
    """Start of the unique occurrence of ``x`` in ``data`` (a brute-force search)."""
    T = x.numel()
    hits = [s for s in range(data.numel() - T + 1) if torch.equal(data[s:s + T].long(), x)]
    assert len(hits) == 1, hits
    return hits[0]


# ---------------------------------------------------------------------------- ByteWindows

def test_byte_windows_are_a_function_of_seed_and_index():
    data = random_bytes(5000)
    a, b = ByteWindows(data, seq_len=16, seed=3), ByteWindows(data.clone(), seq_len=16, seed=3)
    idx = [0, 1, 7, 123_456_789, 2**40 - 1]
    for i in idx:
        xa, ya = a[i]
        xb, yb = b[i]
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
        assert torch.equal(a[i][0], xa)                # asking twice changes nothing
    # a batch is the stack of its samples, whatever the batch composition
    xs, ys = a.__getitems__(idx)
    assert xs.shape == (5, 16) and ys.shape == (5, 16) and xs.dtype == torch.int64
    for row, i in enumerate(idx):
        assert torch.equal(xs[row], a[i][0]) and torch.equal(ys[row], a[i][1])
    xs2, _ = a.__getitems__(idx[::-1])
    assert torch.equal(xs2.flip(0), xs)


def test_byte_windows_seed_matters():
    data = random_bytes(5000)
    a, c = ByteWindows(data, 16, seed=3), ByteWindows(data, 16, seed=4)
    xa, _ = a.__getitems__(list(range(20)))
    xc, _ = c.__getitems__(list(range(20)))
    assert not torch.equal(xa, xc)


def test_byte_windows_target_is_input_shifted_by_one():
    data = random_bytes(3000, seed=1)        # random: a 24-byte window occurs once
    ds = ByteWindows(data, seq_len=24, seed=0)
    for i in range(10):
        x, y = ds[i]
        s = find_window(data, x)
        assert torch.equal(x, data[s:s + 24].long())
        assert torch.equal(y, data[s + 1:s + 25].long())


def test_byte_windows_cover_the_whole_corpus():
    # 40 bytes, windows of 8 + 1: valid starts are 0..31, so every byte, the last included,
    # can be a target; 4000 random windows hit all 32 starts (miss chance ~ 32 * (31/32)**4000)
    data = torch.arange(40, dtype=torch.uint8)
    ds = ByteWindows(data, seq_len=8, seed=0)
    xs, ys = ds.__getitems__(list(range(4000)))
    assert set(ys.flatten().tolist()) == set(range(1, 40))
    assert set(xs[:, 0].tolist()) == set(range(32))


def test_byte_windows_corpus_of_exactly_one_window():
    # seq_len + 1 bytes hold exactly one (x, y) pair: x = bytes 0..7, y = bytes 1..8
    data = torch.arange(9, dtype=torch.uint8)
    x, y = ByteWindows(data, seq_len=8, seed=0)[5]
    assert x.tolist() == list(range(8)) and y.tolist() == list(range(1, 9))


def test_byte_windows_too_short_corpus():
    with pytest.raises(ConfigError, match="fewer than one window"):
        ByteWindows(torch.zeros(10, dtype=torch.uint8), seq_len=16, seed=0)


# ------------------------------------------------------------------------- text corpus

def make_corpus(root, n_files: int = 40):
    """Files whose content is unique, so each can be traced to a split."""
    contents = {}
    for i in range(n_files):
        rel = f"pkg{i % 3}/mod_{i:03d}.py"
        text = f"# <file {i:03d}>\n" + f"value_{i} = {i}\n" * (5 + i % 7)
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
        contents[rel] = text.encode()
    return contents


def test_directory_split_by_file(tmp_path):
    contents = make_corpus(tmp_path)
    (tmp_path / ".hidden").write_text("# <hidden>\n")
    train, val, desc = load_text_corpus(str(tmp_path), val_fraction=0.25, max_bytes=10**9)
    train_b, val_b = bytes(train.tolist()), bytes(val.tolist())
    in_train = {rel for rel, c in contents.items() if c in train_b}
    in_val = {rel for rel, c in contents.items() if c in val_b}
    assert not in_train & in_val                          # no file in both splits
    assert in_train | in_val == set(contents)              # and none lost
    assert in_train and in_val
    assert b"<hidden>" not in train_b + val_b
    assert len(train_b) + len(val_b) == sum(map(len, contents.values()))
    assert desc["train_bytes"] == len(train_b) and desc["val_bytes"] == len(val_b)
    # the documented rule: validation iff crc32(relative path) falls in the validation share
    assert in_val == {rel for rel in contents if zlib.crc32(rel.encode()) % 10_000 < 2_500}


def test_directory_split_is_deterministic(tmp_path):
    make_corpus(tmp_path)
    t1, v1, _ = load_text_corpus(str(tmp_path), 0.2, 10**9)
    t2, v2, _ = load_text_corpus(str(tmp_path), 0.2, 10**9)
    assert torch.equal(t1, t2) and torch.equal(v1, v2)
    assert t1.dtype == torch.uint8


def test_binary_files_are_skipped(tmp_path):
    contents = make_corpus(tmp_path, n_files=10)
    (tmp_path / "blob.bin").write_bytes(b"ELF\x00\x01\x02binary")
    train, val, _ = load_text_corpus(str(tmp_path), 0.2, 10**9)
    assert b"ELF" not in bytes(train.tolist()) + bytes(val.tolist())
    assert train.numel() + val.numel() == sum(map(len, contents.values()))


def test_single_file_is_split_at_the_tail(tmp_path):
    text = bytes(range(32, 127)) * 10 + b"\n"               # 951 printable bytes
    path = tmp_path / "corpus.txt"
    path.write_bytes(text)
    train, val, _ = load_text_corpus(str(path), val_fraction=0.1, max_bytes=10**9)
    # cut = int(951 * 0.9) = 855
    assert bytes(train.tolist()) == text[:855]
    assert bytes(val.tolist()) == text[855:]


def test_max_bytes_caps_the_corpus(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_bytes(b"abcdefghij" * 100)
    train, val, _ = load_text_corpus(str(path), val_fraction=0.1, max_bytes=200)
    assert train.numel() + val.numel() == 200
    assert bytes(train.tolist()) + bytes(val.tolist()) == (b"abcdefghij" * 20)


def test_empty_directory(tmp_path):
    with pytest.raises(ConfigError, match="no usable text"):
        load_text_corpus(str(tmp_path), 0.1, 10**9)


def test_binary_only_directory(tmp_path):
    for i in range(3):
        (tmp_path / f"f{i}.bin").write_bytes(b"\x00\x01\x02" * 50)
    with pytest.raises(ConfigError, match="no usable text"):
        load_text_corpus(str(tmp_path), 0.1, 10**9)


def test_missing_corpus_path(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_text_corpus(str(tmp_path / "absent"), 0.1, 10**9)


# ---------------------------------------------------------------------- synthetic data

def test_synthetic_classes_deterministic_per_index():
    a = SyntheticClasses([6], num_classes=4, seed=11, length=1000)
    b = SyntheticClasses([6], num_classes=4, seed=11, length=1000)
    assert torch.equal(a.prototypes, b.prototypes)
    for i in (0, 5, 999):
        xa, ya = a[i]
        xb, yb = b[i]
        assert torch.equal(xa, xb) and int(ya) == int(yb)
    xs, ys = a.__getitems__([5, 0, 999])
    assert xs.shape == (3, 6) and ys.dtype == torch.int64
    assert torch.equal(xs[0], a[5][0]) and torch.equal(xs[2], a[999][0])
    ys_many = a.__getitems__(list(range(200)))[1]
    assert ys_many.min() >= 0 and ys_many.max() <= 3 and len(set(ys_many.tolist())) == 4


def test_synthetic_sample_is_prototype_plus_noise():
    ds = SyntheticClasses([1000], num_classes=3, seed=0, length=10)
    x, y = ds[4]
    noise = x - ds.prototypes[y]
    # standard normal noise: mean ~ 0 (sd 1/sqrt(1000) ~ 0.03), sd ~ 1
    assert abs(noise.mean().item()) < 0.15 and 0.9 < noise.std().item() < 1.1


def test_synthetic_images_deterministic():
    a = SyntheticClasses([3, 8, 8], num_classes=5, seed=2, length=100)
    b = SyntheticClasses([3, 8, 8], num_classes=5, seed=2, length=100)
    assert torch.equal(a[17][0], b[17][0]) and a[17][0].shape == (3, 8, 8)


def test_synthetic_seed_changes_noise():
    a = SyntheticClasses([6], num_classes=4, seed=1, length=10)
    b = SyntheticClasses([6], num_classes=4, seed=2, length=10)
    assert not torch.equal(a[0][0], b[0][0])


# ------------------------------------------------------------------------ user tensors

X = torch.arange(12, dtype=torch.float32).reshape(6, 2)
Y = torch.tensor([0, 1, 2, 0, 1, 2])


def check(inputs, targets):
    assert inputs.dtype == torch.float32 and targets.dtype == torch.int64
    assert torch.equal(inputs, X) and torch.equal(targets, Y)


@pytest.mark.parametrize("obj", [
    {"inputs": X, "targets": Y},
    {"x": X, "y": Y},
    (X, Y),
    [X.double(), Y.int()],            # converted to float32 / int64
])
def test_load_tensors_pt(tmp_path, obj):
    path = tmp_path / "data.pt"
    torch.save(obj, path)
    check(*load_tensors(str(path), None))


def test_load_tensors_npz(tmp_path):
    path = tmp_path / "data.npz"
    np.savez(path, inputs=X.numpy().astype(np.float64), targets=Y.numpy())
    check(*load_tensors(str(path), None))
    np.savez(path, x=X.numpy(), y=Y.numpy().astype(np.int32))
    check(*load_tensors(str(path), None))


def test_load_tensors_npy_with_targets(tmp_path):
    np.save(tmp_path / "x.npy", X.numpy())
    np.save(tmp_path / "y.npy", Y.numpy())
    check(*load_tensors(str(tmp_path / "x.npy"), str(tmp_path / "y.npy")))
    with pytest.raises(ConfigError, match="targets_path"):
        load_tensors(str(tmp_path / "x.npy"), None)


def test_load_tensors_mismatched_lengths(tmp_path):
    path = tmp_path / "data.pt"
    torch.save({"inputs": X, "targets": Y[:5]}, path)
    with pytest.raises(ConfigError, match="same number of samples"):
        load_tensors(str(path), None)


@pytest.mark.parametrize("targets", [Y.float(), Y.reshape(3, 2)])
def test_load_tensors_targets_must_be_integer_vector(tmp_path, targets):
    path = tmp_path / "data.pt"
    torch.save({"inputs": X[: targets.shape[0]], "targets": targets}, path)
    with pytest.raises(ConfigError, match="targets"):
        load_tensors(str(path), None)


def test_load_tensors_missing_names(tmp_path):
    path = tmp_path / "data.npz"
    np.savez(path, features=X.numpy(), labels=Y.numpy())
    with pytest.raises(ConfigError, match="inputs"):
        load_tensors(str(path), None)


def test_load_tensors_unsupported_suffix_and_garbage(tmp_path):
    (tmp_path / "data.csv").write_text("1,2\n")
    with pytest.raises(ConfigError, match="unsupported"):
        load_tensors(str(tmp_path / "data.csv"), None)
    (tmp_path / "bad.pt").write_bytes(b"not a torch file")
    with pytest.raises(ConfigError, match="cannot read"):
        load_tensors(str(tmp_path / "bad.pt"), None)




def test_load_tensors_refuses_pickled_objects(tmp_path):
    path = tmp_path / "data.pt"
    torch.save({"inputs": X, "targets": Y, "extra": Payload()}, path)
    EXECUTED.clear()
    with pytest.raises(ConfigError, match="cannot read"):
        load_tensors(str(path), None)
    assert EXECUTED == []
    assert torch.load(path, weights_only=False)["extra"] == "pwned"    # a full unpickle would run it


def test_load_tensors_npy_object_array_refused(tmp_path):
    np.save(tmp_path / "x.npy", np.array([{"a": 1}, {"b": 2}], dtype=object), allow_pickle=True)
    np.save(tmp_path / "y.npy", np.array([0, 1]))
    with pytest.raises(ConfigError, match="cannot read"):
        load_tensors(str(tmp_path / "x.npy"), str(tmp_path / "y.npy"))


# ------------------------------------------------------------------ shuffled epochs

def test_shuffled_epochs_visit_every_row_once_per_epoch():
    inputs, targets = torch.arange(10).float()[:, None], torch.arange(10)
    ds = ShuffledEpochs(Tensors(inputs, targets), seed=0)
    orders = []
    for epoch in range(3):
        xs, ys = ds.__getitems__(list(range(epoch * 10, epoch * 10 + 10)))
        assert sorted(ys.tolist()) == list(range(10))
        assert torch.equal(xs[:, 0].long(), ys)                  # rows stay paired
        orders.append(ys.tolist())
    assert orders[0] != orders[1] or orders[1] != orders[2]      # a fresh permutation per epoch
    # sample i depends only on (seed, i): a new instance, asked out of order, agrees
    again = ShuffledEpochs(Tensors(inputs, targets), seed=0)
    for i in (25, 3, 17, 3):
        assert torch.equal(again[i][1], ds.__getitems__([i])[1][0])


def test_shuffled_epochs_of_a_dataset_without_getitems():
    class Plain(torch.utils.data.Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return torch.tensor([float(i)]), i

    ds = ShuffledEpochs(Plain(), seed=1)
    items = ds.__getitems__([0, 1, 2, 3])
    assert isinstance(items, list) and sorted(y for _, y in items) == [0, 1, 2, 3]


def test_split_tensors_is_a_partition():
    inputs, targets = torch.arange(20).float()[:, None], torch.arange(20)
    (xt, yt), (xv, yv) = split_tensors(inputs, targets, 0.25, seed=0)
    assert len(yv) == 5 and len(yt) == 15                      # int(20 * 0.25)
    assert sorted(yt.tolist() + yv.tolist()) == list(range(20))
    assert torch.equal(xt[:, 0].long(), yt) and torch.equal(xv[:, 0].long(), yv)


def test_a_huge_dataset_is_shuffled_without_storing_a_permutation(monkeypatch):
    from tensorpilot.workloads.data import ShuffledEpochs

    class Range(torch.utils.data.Dataset):
        def __init__(self, n):
            self.n = n

        def __len__(self):
            return self.n

        def __getitem__(self, i):
            return i

    # above the threshold each epoch is a computed permutation: still every row exactly once
    monkeypatch.setattr(ShuffledEpochs, "STORED_PERMUTATION_MAX", 10)
    view = ShuffledEpochs(Range(97), seed=3)
    epoch0, epoch1 = [view[i] for i in range(97)], [view[i] for i in range(97, 194)]
    assert sorted(epoch0) == sorted(epoch1) == list(range(97)) and epoch0 != epoch1
    # 10^12 rows: answered at once, nothing of that size is allocated
    big = ShuffledEpochs(Range(10**12), seed=3)
    assert 0 <= big[5] < 10**12 and big[5] == ShuffledEpochs(Range(10**12), seed=3)[5]


def test_the_text_reader_reads_no_more_than_it_keeps(tmp_path):
    from tensorpilot.workloads.data import load_text_corpus

    huge = tmp_path / "huge.txt"
    with open(huge, "wb") as fh:                    # 64 GiB, sparse: reading it whole would never end
        fh.write(b"def f():\n    return 1\n" * 100)
        fh.truncate(64 * 2**30)
    train, val, _ = load_text_corpus(str(huge), 0.1, 1000)
    assert train.numel() + val.numel() == 1000
