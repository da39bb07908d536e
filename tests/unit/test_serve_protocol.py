"""v2 request validation: every malformed request is a BadRequest with a message, never a crash."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorpilot.serve import protocol as P
from tensorpilot.serve.model import TensorSpec

IMG = TensorSpec("input", "FP32", (3, 2, 2))
OUT = TensorSpec("logits", "FP32", (10,))
IDS = TensorSpec("input_ids", "INT64", (-1,), max_dim=8, min_value=0, max_value=255)


def body(spec=IMG, **over):
    t = {"name": spec.name, "shape": [2, 3, 2, 2], "datatype": spec.datatype, "data": list(range(24))}
    t.update(over)
    return {"inputs": [t]}


def test_valid_request_flat_or_nested():
    x, rid = P.parse_infer(dict(body(), id="r1"), IMG, OUT, 4)
    assert rid == "r1" and x.shape == (2, 3, 2, 2) and x.dtype == torch.float32
    assert x.reshape(-1).tolist() == list(range(24))
    nested = torch.arange(24.0).reshape(2, 3, 2, 2).tolist()
    assert torch.equal(P.parse_infer(body(data=nested), IMG, OUT, 4)[0], x)


def test_token_ids_free_length_and_range():
    x, _ = P.parse_infer(body(IDS, shape=[1, 3], data=[1, 2, 255]), IDS, OUT, 4)
    assert x.dtype == torch.int64 and x.shape == (1, 3)
    for bad in ({"shape": [1, 9], "data": [1] * 9}, {"shape": [1, 2], "data": [1, 256]},
                {"shape": [1, 2], "data": [1.5, 2]}, {"shape": [1, 2], "data": [True, False]},
                {"shape": [1, 2], "data": [1, 2 ** 70]}):
        with pytest.raises(P.BadRequest):
            P.parse_infer(body(IDS, **bad), IDS, OUT, 4)


@pytest.mark.parametrize("over, words", [
    ({"name": "x"}, "unknown input"), ({"datatype": "INT8"}, "datatype"),
    ({"shape": [2, 3, 2]}, "dimensions"), ({"shape": [0, 3, 2, 2]}, "rows"), ({"shape": [5, 3, 2, 2]}, "rows"),
    ({"shape": [2, 3, 2, 3]}, "does not fit"), ({"data": [1] * 23}, "elements"), ({"data": "abc"}, "array"),
    ({"data": [float("inf")] * 24}, "non-finite"), ({"shape": "2"}, "list of integers"),
    ({"shape": [2.0, 3, 2, 2]}, "list of integers"), ({"data": [[1, 2], [3]]}, "equal-length"),
])
def test_bad_tensor_messages(over, words):
    with pytest.raises(P.BadRequest, match=words):
        P.parse_infer(body(**over), IMG, OUT, 4)


def test_bad_envelopes():
    for obj in ([], "x", {}, {"inputs": []}, {"inputs": [1]}, {"inputs": body()["inputs"] * 2},
                dict(body(), id=3), dict(body(), outputs=[{"name": "other"}])):
        with pytest.raises(P.BadRequest):
            P.parse_infer(obj, IMG, OUT, 4)
    with pytest.raises(P.BadRequest):
        P.loads(b"{nope")


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
                           max_leaves=30)


@settings(max_examples=200, deadline=None)
@given(shape=st.lists(st.integers(-3, 10 ** 15), max_size=5), data=json_values, name=st.sampled_from(["input", "x"]),
       datatype=st.sampled_from(["FP32", "FP64", "INT64", "BYTES"]))
def test_any_tensor_object_parses_or_raises_bad_request(shape, data, name, datatype):
    try:
        x, _ = P.parse_infer({"inputs": [{"name": name, "shape": shape, "datatype": datatype, "data": data}]},
                             IMG, OUT, 4)
    except P.BadRequest:
        return
    assert x.shape[1:] == IMG.sample_shape


def test_generate_parameters():
    p = P.parse_generate({"text_input": "hi", "parameters": {"max_tokens": 5, "temperature": 0}}, 10)
    assert (p.prompt, p.max_tokens, p.temperature, p.top_k) == ("hi", 5, 0.0, 40)
    for bad in ({"text_input": 1}, {"text_input": "a", "parameters": {"max_tokens": 11}},
                {"text_input": "a", "parameters": {"temperature": -1}}, {"text_input": "a", "parameters": []},
                {"text_input": "a", "parameters": {"top_k": 1.5}}, {"text_input": "a", "parameters": {"seed": -1}}):
        with pytest.raises(P.BadRequest):
            P.parse_generate(bad, 10)


def test_response_shape():
    out = json.loads(P.infer_response("cnn", "7", OUT, torch.zeros(2, 10)))
    assert out == {"model_name": "cnn", "id": "7", "outputs": [
        {"name": "logits", "datatype": "FP32", "shape": [2, 10], "data": [0.0] * 20}]}


# ------------------------------------------------------------------ nesting depth, before parsing

def _nest(depth: int, inner: str = "1", key: str | None = None) -> bytes:
    """``depth`` levels of arrays (or of {"key": ...} objects) around ``inner``."""
    if key is None:
        return ("[" * depth + inner + "]" * depth).encode()
    return (f'{{"{key}":' * depth + inner + "}" * depth).encode()


@pytest.mark.parametrize("text", [_nest(64), _nest(64, key="a"), _nest(32, _nest(32, key="k").decode()),
                                  json.dumps({"s": "[[[[{{{{" * 100, "data": [[1, 2]] * 500}).encode(),
                                  json.dumps({"s": '\\"[' * 100}).encode()])
def test_depth_up_to_64_is_parsed(text):
    P.loads(text)                                  # brackets inside strings do not nest


@pytest.mark.parametrize("text", [_nest(65), _nest(65, key="a"), _nest(100_000, key="a"), b"[" * 100_000,
                                  b"[" * 70 + b"]" * 69 + b"]", _nest(40, _nest(30, key="k").decode())])
def test_deeper_than_64_is_a_bad_request_before_the_parser_runs(text, monkeypatch):
    # the parser must not even see it (orjson < 3.9.15 crashed the process on deep objects)
    monkeypatch.setattr(P, "_orjson", None)
    monkeypatch.setattr(P, "json", None)
    with pytest.raises(P.BadRequest, match="more than 64 levels deep"):
        P.loads(text)


@pytest.mark.parametrize("text", [b"]" * 70 + b"[" * 70, b"[" + b"[]," * 70,
                                  b"[[]]]" * 30, b"[" * 60 + b"]" * 65])
def test_brackets_that_do_not_pair_up_are_a_bad_request(text):
    with pytest.raises(P.BadRequest, match="not valid JSON"):    # the depth check's or the parser's
        P.loads(text)


def test_a_large_nested_infer_body_is_accepted():
    # a realistic large request: 512 images of 3 x 32 x 32, nested (about 5 MiB of JSON)
    data = torch.rand(512, 3, 32, 32).tolist()
    text = json.dumps({"inputs": [{"name": "input", "shape": [512, 3, 32, 32], "datatype": "FP32",
                                   "data": data}]}).encode()
    assert P.loads(text)["inputs"][0]["shape"] == [512, 3, 32, 32]
