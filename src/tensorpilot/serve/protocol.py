"""Open Inference Protocol (KServe v2) request parsing and validation: pure functions, no I/O.

A bad request raises :class:`BadRequest` with one sentence that names the field and what was
expected; the app answers 400 with ``{"error": message}`` (the v2 error shape). Shapes are
checked before any tensor is allocated, so a claimed shape of 10^18 elements costs nothing.

Spec: https://kserve.github.io/website/latest/modelserving/data_plane/v2_protocol/ (REST); the
generate routes follow Triton's generate extension (``text_input`` -> ``text_output``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

try:                                   # 5-10x faster than json for the float arrays of /infer
    import orjson as _orjson
except ImportError:                    # pragma: no cover - orjson is in the serve extra
    _orjson = None
import json

from tensorpilot.serve.model import V2_DTYPES, TensorSpec

FLOAT_TYPES = ("FP32", "FP64", "FP16", "BF16")
INT_TYPES = ("INT64", "INT32", "INT16", "INT8", "UINT8")


class BadRequest(Exception):
    """The request is malformed or does not fit the model (HTTP 400)."""


# v2 bodies nest a few levels (object > inputs > tensor > data rows); 64 is far beyond any real
# one. orjson before 3.9.15 recursed without a limit and crashed the process on deep objects
# (CVE-2024-27454), so the depth is checked here, whichever parser and version is installed.
MAX_DEPTH = 64
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)     # a JSON string, escapes included
_STEPS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")                # +1 / -1 as int8
_NOT_BRACKET = bytes(c for c in range(256) if c not in b"[]{}")


def check_depth(body: bytes, limit: int = MAX_DEPTH) -> None:
    """BadRequest if ``body`` nests arrays/objects deeper than ``limit`` or its brackets do not
    pair up; brackets inside strings do not count. Most bodies are settled by the first line;
    the rest take a few C-speed passes (tens of ms for 8 MiB of nested arrays on one core)."""
    if body.count(b"[") + body.count(b"{") <= limit:       # cannot be deeper than its brackets
        return
    import numpy as np

    if b'"' in body:
        body = _STRING.sub(b"", body)
    # depth after each bracket; int16 wraps only past 32767, and a depth climbs by one at a
    # time, so any body that deep passed limit < 32767 first and is refused all the same
    depth = np.frombuffer(body.translate(_STEPS, _NOT_BRACKET), dtype=np.int8).astype(np.int16)
    if not depth.size:
        return
    np.cumsum(depth, out=depth)
    if depth.max() > limit:
        raise BadRequest(f"the body nests arrays or objects more than {limit} levels deep.")
    if depth.min() < 0 or depth[-1] != 0:
        raise BadRequest("the body is not valid JSON: its brackets do not pair up.")


def loads(body: bytes) -> Any:
    check_depth(body)
    try:
        return _orjson.loads(body) if _orjson is not None else json.loads(body)
    except (ValueError, TypeError, RecursionError):
        raise BadRequest("the body is not valid JSON.") from None


def dumps(obj: Any) -> bytes:
    if _orjson is not None:
        return _orjson.dumps(obj)
    return json.dumps(obj, separators=(",", ":")).encode()


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _describe(spec: TensorSpec) -> str:
    return f"{spec.name!r} ({spec.datatype}, shape {[-1, *spec.sample_shape]})"


def check_shape(shape: Any, spec: TensorSpec, max_rows: int) -> tuple[int, ...]:
    if not isinstance(shape, list) or not all(_is_int(d) for d in shape):
        raise BadRequest("inputs[0].shape must be a list of integers.")
    want = len(spec.sample_shape) + 1
    if len(shape) != want:
        raise BadRequest(f"inputs[0].shape {shape} has {len(shape)} dimensions; input {_describe(spec)} "
                         f"needs {want} (batch first).")
    if not 1 <= shape[0] <= max_rows:
        raise BadRequest(f"inputs[0].shape[0] (rows) must be between 1 and {max_rows}, got {shape[0]}.")
    for i, (got, exp) in enumerate(zip(shape[1:], spec.sample_shape), start=1):
        if exp == -1:
            if not 1 <= got <= (spec.max_dim or got):
                raise BadRequest(f"inputs[0].shape[{i}] must be between 1 and {spec.max_dim}, got {got}.")
        elif got != exp:
            raise BadRequest(f"inputs[0].shape {shape} does not fit input {_describe(spec)}.")
    return tuple(shape)


def to_tensor(data: Any, shape: tuple[int, ...], datatype: str, spec: TensorSpec):
    """v2 ``data`` (flat row-major, or nested) -> tensor of ``shape`` in the model's dtype."""
    import torch

    if not isinstance(data, list):
        raise BadRequest("inputs[0].data must be a JSON array.")
    floating = spec.datatype in FLOAT_TYPES
    try:
        t = torch.tensor(data, dtype=torch.float32 if floating else None)
    except (TypeError, ValueError, RuntimeError, OverflowError):
        kind = "numbers" if floating else "integers"
        raise BadRequest(f"inputs[0].data must be an array of {kind} of equal-length rows.") from None
    if t.numel() != math.prod(shape):
        raise BadRequest(f"inputs[0].data has {t.numel()} elements but shape {list(shape)} needs "
                         f"{math.prod(shape)}.")
    if floating:
        if not bool(torch.isfinite(t).all()):
            raise BadRequest("inputs[0].data holds a non-finite number (NaN, Infinity or beyond fp32 range).")
    else:
        if t.dtype not in (torch.int64, torch.int32):
            raise BadRequest(f"inputs[0].data must be integers for {datatype} input {spec.name!r}.")
        lo, hi = spec.min_value, spec.max_value
        if t.numel() and ((lo is not None and int(t.min()) < lo) or (hi is not None and int(t.max()) > hi)):
            raise BadRequest(f"inputs[0].data values must be between {lo} and {hi} (token ids).")
        t = t.to(getattr(torch, V2_DTYPES[spec.datatype]))
    return t.reshape(shape)


def parse_infer(obj: Any, spec: TensorSpec, out_spec: TensorSpec, max_rows: int):
    """A v2 inference request -> (input tensor (rows, *sample_shape), request id or None)."""
    if not isinstance(obj, dict):
        raise BadRequest("the body must be a JSON object with an 'inputs' array.")
    inputs = obj.get("inputs")
    if not isinstance(inputs, list) or len(inputs) != 1 or not isinstance(inputs[0], dict):
        raise BadRequest(f"'inputs' must be an array with exactly one tensor object: {_describe(spec)}.")
    req_id = obj.get("id")
    if req_id is not None and not isinstance(req_id, str):
        raise BadRequest("'id' must be a string.")
    outputs = obj.get("outputs")
    if outputs is not None:
        if not isinstance(outputs, list) or not all(isinstance(o, dict) for o in outputs):
            raise BadRequest("'outputs' must be an array of objects with a 'name'.")
        unknown = [o.get("name") for o in outputs if o.get("name") != out_spec.name]
        if unknown:
            raise BadRequest(f"unknown output {unknown[0]!r}: this model has one output {out_spec.name!r}.")
    tensor = inputs[0]
    name, datatype = tensor.get("name"), tensor.get("datatype")
    if name != spec.name:
        raise BadRequest(f"unknown input {name!r}: this model takes one input {_describe(spec)}.")
    allowed = FLOAT_TYPES[:2] if spec.datatype in FLOAT_TYPES else ("INT64", "INT32")
    if datatype not in allowed:
        raise BadRequest(f"inputs[0].datatype must be {' or '.join(allowed)} for input {spec.name!r}, "
                         f"got {datatype!r}.")
    shape = check_shape(tensor.get("shape"), spec, max_rows)
    return to_tensor(tensor.get("data"), shape, datatype, spec), req_id


def infer_response(model_name: str, req_id: str | None, out_spec: TensorSpec, y) -> bytes:
    """(rows, *out_shape) float tensor -> v2 response body."""
    out = {"name": out_spec.name, "datatype": "FP32", "shape": list(y.shape),
           "data": y.reshape(-1).tolist()}
    body = {"model_name": model_name, "outputs": [out]}
    if req_id is not None:
        body["id"] = req_id
    return dumps(body)


@dataclass(frozen=True, slots=True)
class GenerateParams:
    prompt: str
    max_tokens: int
    temperature: float
    top_k: int
    seed: int


def parse_generate(obj: Any, max_new_tokens: int) -> GenerateParams:
    if not isinstance(obj, dict) or not isinstance(obj.get("text_input"), str):
        raise BadRequest("the body must be a JSON object with a string 'text_input'.")
    p = obj.get("parameters", {})
    if not isinstance(p, dict):
        raise BadRequest("'parameters' must be an object.")
    max_tokens = p.get("max_tokens", min(64, max_new_tokens))
    if not _is_int(max_tokens) or not 1 <= max_tokens <= max_new_tokens:
        raise BadRequest(f"parameters.max_tokens must be an integer between 1 and {max_new_tokens}.")
    temperature = p.get("temperature", 0.8)
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) \
            or not 0 <= temperature <= 100 or temperature != temperature:
        raise BadRequest("parameters.temperature must be a number between 0 (greedy) and 100.")
    top_k = p.get("top_k", 40)
    if not _is_int(top_k) or top_k < 0:
        raise BadRequest("parameters.top_k must be a non-negative integer (0: all tokens).")
    seed = p.get("seed", 0)
    if not _is_int(seed) or not 0 <= seed < 2 ** 63:
        raise BadRequest("parameters.seed must be a non-negative integer below 2^63.")
    return GenerateParams(obj["text_input"], max_tokens, float(temperature), top_k, seed)


# ---------------------------------------------------------------------------- OpenAPI schemas
# The routes read raw bytes (fast path, one parse); these schemas document them in /openapi.json
# and drive the property-based tests.

def infer_request_schema(spec: TensorSpec) -> dict:
    return {
        "type": "object", "required": ["inputs"],
        "properties": {
            "id": {"type": "string"},
            "parameters": {"type": "object"},
            "inputs": {"type": "array", "minItems": 1, "maxItems": 1, "items": {
                "type": "object", "required": ["name", "shape", "datatype", "data"],
                "properties": {
                    "name": {"type": "string", "example": spec.name},
                    "shape": {"type": "array", "items": {"type": "integer"},
                              "example": [1, *spec.full_sample_shape]},
                    "datatype": {"type": "string", "example": spec.datatype},
                    "data": {"type": "array", "items": {"type": "number"}},
                    "parameters": {"type": "object"}}}},
            "outputs": {"type": "array", "items": {"type": "object", "properties": {"name": {"type": "string"}}}},
        },
    }


GENERATE_REQUEST_SCHEMA = {
    "type": "object", "required": ["text_input"],
    "properties": {
        "text_input": {"type": "string"},
        "parameters": {"type": "object", "properties": {
            "max_tokens": {"type": "integer"}, "temperature": {"type": "number"},
            "top_k": {"type": "integer"}, "seed": {"type": "integer"}}},
    },
}
