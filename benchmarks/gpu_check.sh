#!/usr/bin/env bash
# The CUDA paths of tensorpilot, exercised in one short lease of a single GPU (docs/support-matrix.md
# records what each step showed). Every step has its own time limit and the script a deadline, so a
# step that fails or hangs costs its limit and the later steps still run; the most valuable come first
# (those a deadline under ~700 s skips were verified on the first lease).
#
#   OUT=/tmp/gpu-check bash benchmarks/gpu_check.sh [deadline_s]
#
# Writes under $OUT: log.txt (everything printed), hw.json, the summaries of the training runs,
# peers_gpu.json, and runs.tar.gz (run directories without checkpoints, TensorBoard events included).
# Uses the python3 of the machine (its torch), this checkout's src/ on PYTHONPATH (nothing installed).
# The serve step needs the serve extra; where the machine lacks it, carry its wheels in .whl/
# (git-ignored), fetched for the machine's Python on a machine with a package registry:
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux2014_x86_64 -d .whl fastapi starlette pydantic pydantic-core \
#       annotated-types typing-inspection uvicorn orjson opentelemetry-api importlib-metadata
# Results of the first lease: benchmarks/RESULTS.md, "First GPU lease".
set -u
OUT=${OUT:-/tmp/gpu-check}
DEADLINE=${1:-500}
mkdir -p "$OUT"
RUNS=$(mktemp -d)
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore
export TENSORPILOT_CACHE="$RUNS/cache"
exec > >(tee -a "$OUT/log.txt") 2>&1
PY=python3
TP="$PY -m tensorpilot"
# the serve extra, where the machine lacks it: wheels carried in .whl/ (see .library device notes)
if [ -d .whl ] && ! $PY -c "import fastapi, uvicorn" 2>/dev/null; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi

step() {      # step NAME LIMIT_S COMMAND...: runs it unless the deadline is too near
    local name=$1 limit=$2; shift 2
    local left=$((DEADLINE - SECONDS))
    if (( left < 15 )); then echo "=== $name: skipped ($left s left of the deadline)"; return; fi
    (( limit > left )) && limit=$left
    echo "=== $name (limit ${limit} s, at ${SECONDS} s): $*"
    local t0=$SECONDS
    timeout -k 5 "$limit" "$@"
    echo "=== $name: exit $? after $((SECONDS - t0)) s"
}

keep() {      # keep SRC DEST: copy a result file under $OUT if it exists
    [ -f "$1" ] && cp "$1" "$OUT/$2"
}

step env 30 bash -c "nvidia-smi --query-gpu=name,memory.total,power.limit,clocks.max.sm,driver_version --format=csv;
  $PY -c 'import torch, sys; print(sys.version.split()[0], torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0), torch.cuda.get_device_capability(0))';
  $PY -m pip list 2>/dev/null | grep -iE '^(torch|timm|transformers|accelerate|lightning|nvidia-ml-py|fastapi|uvicorn|torchao) '"
# the traced step's device-time breakdown (kernels only, cuBLAS's nvjet GEMMs as matmuls); first:
# 6fa83d9 moved the profiler's own cost off the host share and has not run on a GPU yet)
step profile 60 $TP profile --size small --steps 30 --run-dir "$RUNS/profile" --out "$RUNS/profile/report"
# planned before running vs measured: models nobody here wrote, eager and torch.compile'd, against the
# predictions committed before the lease (benchmarks/results/compiled_planned_c.json for an H100,
# compiled_planned_h200.json for an H200); the third lease measured every eager step, and these four
# compiled ones were cut by its time limits (inductor took 33-74 s a model on that VM, over 100 s for
# efficientnet_b0)
step compiled-steps 330 $PY benchmarks/compiled_steps.py measure --out "$OUT/compiled_measured.json" \
    --models hf_pythia,vit_base,mobilenetv3,efficientnet_b0 --limit-s 160
# the main job as a user types it: built-in default, device/precision/compile chosen automatically
step train-default 120 $TP train --run-dir "$RUNS/default"
keep "$RUNS/default/summary.json" train_default.json
# detection, datasheet peaks, measured ceilings (matmul per dtype, copy, pageable/pinned host<->device)
step hw 20 $TP hw
step hw-probe 90 bash -c "$TP hw --probe --allreduce-procs 0 --json > $OUT/hw.json && $TP hw --probe --allreduce-procs 0"
# serving the default run on the GPU over loopback: readiness, a greedy generate, a malformed body
cat > "$RUNS/serve_check.py" <<'PYEOF'
import json, signal, subprocess, sys, time, urllib.error, urllib.request
run, port = sys.argv[1], 8765
srv = subprocess.Popen([sys.executable, "-m", "tensorpilot", "serve", "--run", run, "--device", "cuda",
                        "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
base = f"http://127.0.0.1:{port}"
def call(path, body=None):
    req = urllib.request.Request(base + path, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError as e:
        return None, str(e)
t0 = time.time()
while time.time() - t0 < 60 and call("/v2/health/ready")[0] != 200:
    time.sleep(0.5)
print("ready after %.1f s" % (time.time() - t0))
print("metadata", *call("/v2/models/gpt"))
q = json.dumps({"text_input": "def ", "parameters": {"max_tokens": 32, "temperature": 0, "seed": 0}}).encode()
for i in range(2):
    t = time.time(); st, body = call("/v2/models/gpt/generate", q)
    print("generate", st, "%.3f s" % (time.time() - t), body[:300])
print("malformed", *call("/v2/models/gpt/generate", b"{bad"))
st, body = call("/metrics")
print("metrics", st, [l for l in body.splitlines() if l.startswith("tensorpilot_")][:6])
srv.send_signal(signal.SIGTERM)
out, _ = srv.communicate(timeout=30)
print("server exit", srv.returncode); print(out[-2500:])
PYEOF
step serve 75 $PY "$RUNS/serve_check.py" "$RUNS/default"
# models tensorpilot did not write, against the loops people write (bf16 hand loop, Accelerate,
# Lightning compiled), each arm in its own process; tensorpilot's summary carries its prediction
# tp-bf16 is tensorpilot with the bf16 hand loop's exact technique: the engine's own cost on a GPU
step peers 100 $PY benchmarks/peers.py --device cuda --model nanogpt --steps 200 \
    --arms bf16,tp-bf16 --out "$OUT/peers_gpu.json"
# fp16 with GradScaler, a larger model, eager
step train-fp16 60 $TP train --size small --precision fp16 --compile off --steps 60 --run-dir "$RUNS/fp16" --logging.progress lines
keep "$RUNS/fp16/summary.json" train_fp16.json
# resume on the GPU from the fp16 run's checkpoint (atomic safetensors + weights_only state)
step train-resume 45 $TP train --resume "$RUNS/fp16" --steps 80 --logging.progress lines
# choice by prediction and trials: micro-batch finder (OOM-bounded), compile, CUDA graphs
step train-optimize 100 $TP train --size small --optimize auto --steps 400 --run-dir "$RUNS/opt" --logging.progress lines
keep "$RUNS/opt/summary.json" train_optimize.json
# precision ladder (fp8 included) and NVML energy through bench's suites
step bench 90 $TP bench --quick precision energy --device cuda --out "$RUNS/bench"
keep "$RUNS/bench/bench.json" bench.json
(cd "$RUNS" && find . -name 'checkpoint*' -prune -o -type f -size -4M -print | grep -v '^./cache/' \
    | tar -czf "$OUT/runs.tar.gz" -T - 2>/dev/null)
echo "=== done at ${SECONDS} s; $OUT:"; ls -la "$OUT"
