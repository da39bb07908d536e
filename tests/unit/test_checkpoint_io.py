"""Checkpoint files: exact round trips, newest-first discovery, pruning, atomicity under a
crash, and refusal of corrupt, incompatible or code-carrying checkpoints."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from torch import nn

from malicious import EXECUTED, Payload   # a pickle that runs code when loaded
from tensorpilot.errors import CheckpointError
from tensorpilot.training import checkpoint as ckpt
from tensorpilot.workloads.gpt import GPT, GPTConfig


def tiny_gpt(seed: int = 0, d_model: int = 16) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=256, seq_len=8, n_layer=2, n_head=2, d_model=d_model))


def trained_state(model: nn.Module) -> tuple[torch.optim.Optimizer, dict]:
    """An AdamW after two real steps (non-trivial exp_avg / exp_avg_sq / step tensors)."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.randint(0, 256, (2, 8))
    for _ in range(2):
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
    return opt, {"optimizer": opt.state_dict(), "step": 2, "data_position": 64,
                 "rng": torch.get_rng_state()}


def assert_same(a, b):
    """Exact structural equality of nested state (tensors bit-identical)."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    else:
        assert a == b


# --------------------------------------------------------------------------- round trip

def test_round_trip_weights_and_optimizer_state(tmp_path):
    model = tiny_gpt(seed=0)
    opt, state = trained_state(model)
    path = ckpt.save(tmp_path / "checkpoints", 2, model, state, {"run": "test"}, keep=2)
    assert path == tmp_path / "checkpoints" / "step_00000002"
    assert sorted(p.name for p in path.iterdir()) == ["meta.json", "model.safetensors", "state.pt"]

    fresh = tiny_gpt(seed=1)                              # different initial weights
    assert not torch.equal(fresh.blocks[0].attn.qkv.weight, model.blocks[0].attn.qkv.weight)
    loaded = ckpt.load(path, fresh)

    assert fresh.state_dict().keys() == model.state_dict().keys()
    for name, t in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[name], t), name
    assert fresh.head.weight is fresh.tok_emb.weight       # tie intact after loading
    assert_same(loaded.state, state)
    assert loaded.meta["run"] == "test" and loaded.meta["step"] == 2

    # the loaded optimizer state drives a fresh optimizer to the identical next step
    opt2 = torch.optim.AdamW(fresh.parameters(), lr=1e-2)
    opt2.load_state_dict(loaded.state["optimizer"])
    x = torch.randint(0, 256, (2, 8))
    for m, o in ((model, opt), (fresh, opt2)):
        m(x).square().mean().backward()
        o.step()
    for (n, a), b in zip(model.named_parameters(), fresh.parameters()):
        assert torch.equal(a, b), n


def test_tied_weight_is_stored_once(tmp_path):
    from safetensors import safe_open

    model = tiny_gpt()
    path = ckpt.save(tmp_path, 1, model, {"step": 1}, {}, keep=1)
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    # tok_emb.weight and head.weight are one tensor of 256 x 16: exactly one of them on disk
    assert len(keys & {"tok_emb.weight", "head.weight"}) == 1
    assert len(keys) == len(model.state_dict()) - 1


def test_meta_records_step_and_checksums(tmp_path):
    import hashlib

    path = ckpt.save(tmp_path, 7, tiny_gpt(), {"step": 7}, {"note": "x"}, keep=1)
    meta = json.loads((path / "meta.json").read_text())
    assert meta["step"] == 7 and meta["note"] == "x"
    for f in ("model.safetensors", "state.pt"):
        assert meta["sha256"][f] == hashlib.sha256((path / f).read_bytes()).hexdigest()


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2-exchange", "two-renames"])
def test_saving_an_existing_step_replaces_it_with_this_runs_weights(tmp_path, monkeypatch, exchange):
    # an earlier run left step 5; a new run's step 5 must hold the new weights (issue 13: a save
    # that returned early kept the first run's weights under the second run's summary)
    if not exchange:                                   # the fallback where the OS cannot swap names
        from tensorpilot import files

        monkeypatch.setattr(files, "_exchange", lambda a, b: False)
    ckpt.save(tmp_path, 5, tiny_gpt(seed=0), {"step": 5}, {}, keep=2)
    newer = tiny_gpt(seed=1)
    again = ckpt.save(tmp_path, 5, newer, {"step": 5}, {}, keep=2)
    assert again == tmp_path / "step_00000005"
    loaded = tiny_gpt(seed=2)
    ckpt.load(again, loaded)                           # checksums verified, weights loaded
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), newer.state_dict().values()))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000005"]   # nothing left aside


# ---------------------------------------------------------------------- find and prune

def test_find_checkpoint_picks_newest_and_keep_prunes(tmp_path):
    root = tmp_path / "checkpoints"
    model = tiny_gpt()
    for step in (9, 10, 100, 1000):
        ckpt.save(root, step, model, {"step": step}, {}, keep=3)
    # keep=3: step 9 was deleted once the fourth save succeeded; order is numeric
    assert [p.name for p in ckpt.list_checkpoints(root)] == \
        ["step_00000010", "step_00000100", "step_00001000"]
    assert not (root / "step_00000009").exists()
    assert ckpt.find_checkpoint(tmp_path) == root / "step_00001000"
    # a checkpoint directory itself is taken as given
    assert ckpt.find_checkpoint(root / "step_00000100") == root / "step_00000100"


def test_keep_one(tmp_path):
    model = tiny_gpt()
    for step in (1, 2, 3):
        ckpt.save(tmp_path, step, model, {"step": step}, {}, keep=1)
    assert [p.name for p in tmp_path.iterdir()] == ["step_00000003"]


def test_find_checkpoint_errors(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        ckpt.find_checkpoint(tmp_path / "nope")
    (tmp_path / "run").mkdir()
    with pytest.raises(CheckpointError, match="no complete checkpoint"):
        ckpt.find_checkpoint(tmp_path / "run")


# ----------------------------------------------------------------------------- crashes

def test_crash_mid_write_keeps_previous_checkpoint(tmp_path, monkeypatch):
    run = tmp_path / "run"
    root = run / "checkpoints"
    model = tiny_gpt(seed=0)
    good = ckpt.save(root, 1, model, {"step": 1}, {}, keep=2)
    good_files = {f.name: f.read_bytes() for f in good.iterdir()}

    real_save = torch.save
    seen = {}

    def crash(obj, f, *a, **kw):
        # checkpoint.save has already written the weights into its temporary directory
        tmp = Path(f).parent
        seen["tmp"] = tmp
        seen["weights_written"] = (tmp / "model.safetensors").stat().st_size > 0
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", crash)
    with torch.no_grad():
        model.tok_emb.weight.add_(1.0)                   # new weights for step 2
    with pytest.raises(OSError, match="disk full"):
        ckpt.save(root, 2, model, {"step": 2}, {}, keep=2)
    monkeypatch.setattr(torch, "save", real_save)

    assert seen["weights_written"] and ".tmp-" in seen["tmp"].name
    assert not (root / "step_00000002").exists()
    assert not seen["tmp"].exists()                      # the partial directory was removed
    assert ckpt.find_checkpoint(run) == good
    assert {f.name: f.read_bytes() for f in good.iterdir()} == good_files
    restored = tiny_gpt(seed=3)
    ckpt.load(ckpt.find_checkpoint(run), restored)
    assert torch.equal(restored.tok_emb.weight, tiny_gpt(seed=0).tok_emb.weight)


def test_leftover_tmp_directory_is_ignored_then_cleaned(tmp_path):
    # a hard kill (no except clause runs) leaves step_*.tmp-<pid> behind, even a complete one
    run = tmp_path / "run"
    root = run / "checkpoints"
    model = tiny_gpt()
    good = ckpt.save(root, 1, model, {"step": 1}, {}, keep=5)
    stale = root / "step_00000002.tmp-999999"
    shutil.copytree(good, stale)
    assert ckpt.list_checkpoints(root) == [good]
    assert ckpt.find_checkpoint(run) == good
    ckpt.save(root, 3, model, {"step": 3}, {}, keep=5)
    assert not stale.exists()
    assert ckpt.find_checkpoint(run) == root / "step_00000003"


# --------------------------------------------------------------------- corrupt / refused

def _flip_byte(path: Path, offset_from_end: int = 10) -> None:
    data = bytearray(path.read_bytes())
    data[-offset_from_end] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("name", ["model.safetensors", "state.pt"])
def test_flipped_byte_is_reported_corrupt(tmp_path, name):
    path = ckpt.save(tmp_path, 1, tiny_gpt(), {"step": 1}, {}, keep=1)
    _flip_byte(path / name)
    with pytest.raises(CheckpointError, match="corrupt") as info:
        ckpt.load(path, tiny_gpt())
    assert name in str(info.value)


@pytest.mark.parametrize("name", ["model.safetensors", "state.pt"])
def test_missing_file_is_reported_incomplete(tmp_path, name):
    path = ckpt.save(tmp_path, 1, tiny_gpt(), {"step": 1}, {}, keep=1)
    (path / name).unlink()
    with pytest.raises(CheckpointError, match=name):
        ckpt.load(path, tiny_gpt())


def test_truncated_meta_json(tmp_path):
    path = ckpt.save(tmp_path, 1, tiny_gpt(), {"step": 1}, {}, keep=1)
    text = (path / "meta.json").read_text()
    (path / "meta.json").write_text(text[: len(text) // 2])
    with pytest.raises(CheckpointError, match="corrupt"):
        ckpt.load(path, tiny_gpt())


def test_missing_meta_json(tmp_path):
    path = ckpt.save(tmp_path, 1, tiny_gpt(), {"step": 1}, {}, keep=1)
    (path / "meta.json").unlink()
    with pytest.raises(CheckpointError, match="meta.json"):
        ckpt.load(path, tiny_gpt())


def test_meta_json_that_is_not_an_object(tmp_path):
    path = ckpt.save(tmp_path, 1, tiny_gpt(), {"step": 1}, {}, keep=1)
    (path / "meta.json").write_text("[]")            # valid JSON, not a checkpoint description
    with pytest.raises(CheckpointError, match="corrupt"):
        ckpt.load(path, tiny_gpt())


def _rewrite_checksum(path: Path, name: str) -> None:
    import hashlib

    meta = json.loads((path / "meta.json").read_text())
    meta["sha256"][name] = hashlib.sha256((path / name).read_bytes()).hexdigest()
    (path / "meta.json").write_text(json.dumps(meta))


def test_truncated_state_with_matching_checksum_is_corrupt(tmp_path):
    # the checksum guards against bit rot; torch.load must still fail cleanly on a bad file
    path = ckpt.save(tmp_path, 1, tiny_gpt(), {"step": 1}, {}, keep=1)
    data = (path / "state.pt").read_bytes()
    (path / "state.pt").write_bytes(data[: len(data) // 2])
    _rewrite_checksum(path, "state.pt")
    with pytest.raises(CheckpointError, match="corrupt"):
        ckpt.load(path, tiny_gpt())


def test_loading_into_a_different_shape(tmp_path):
    path = ckpt.save(tmp_path, 1, tiny_gpt(d_model=16), {"step": 1}, {}, keep=1)
    with pytest.raises(CheckpointError, match="does not fit"):
        ckpt.load(path, tiny_gpt(d_model=32))


def test_loading_into_a_model_with_fewer_layers(tmp_path):
    path = ckpt.save(tmp_path, 1, tiny_gpt(), {"step": 1}, {}, keep=1)
    torch.manual_seed(0)
    one_layer = GPT(GPTConfig(vocab_size=256, seq_len=8, n_layer=1, n_head=2, d_model=16))
    with pytest.raises(CheckpointError, match="does not fit"):
        ckpt.load(path, one_layer)




def test_state_with_pickled_object_is_refused(tmp_path):
    path = ckpt.save(tmp_path, 1, tiny_gpt(), {"step": 1}, {}, keep=1)
    torch.save({"step": 1, "extra": Payload()}, path / "state.pt")
    _rewrite_checksum(path, "state.pt")                # checksums match: only weights_only stops it

    EXECUTED.clear()
    with pytest.raises(CheckpointError, match="state.pt"):
        ckpt.load(path, tiny_gpt())
    assert EXECUTED == []

    # the file itself is a readable pickle: a full unpickler would have run the payload
    assert torch.load(path / "state.pt", weights_only=False)["extra"] == "pwned"
    assert EXECUTED == [True]
