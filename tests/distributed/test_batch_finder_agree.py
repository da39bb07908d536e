"""The batch-size finder under multi-process training: two gloo ranks with different memory
budgets (as on GPUs shared with other processes) both end with the smaller rank's answer."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap

WORKER = textwrap.dedent("""
    import json, os, sys, torch, torch.distributed as dist
    from torch import nn
    from tensorpilot.training import autotune as at
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 4))
    budget = [8 * 1024, 40 * 1024][rank]              # rank 1 has five times the memory

    def run(n):
        with at.ActivationBudget(budget, model.parameters()):
            model(torch.randn(n, 16)).sum().backward()
        model.zero_grad(set_to_none=True)

    alone = at.find_batch_size(run, limit=128, agree=lambda n: n)
    agreed = at.find_batch_size(run, limit=128)
    print(json.dumps({"rank": rank, "alone": alone, "agreed": agreed}))
    dist.destroy_process_group()
""")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ranks_agree_on_the_smallest_batch():
    port = _free_port()
    procs = [subprocess.Popen([sys.executable, "-c", WORKER], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=dict(os.environ, RANK=str(r), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                                                  MASTER_PORT=str(port), OMP_NUM_THREADS="1"))
             for r in range(2)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-3000:]
        outs.append(json.loads(out.strip().splitlines()[-1]))
    alone = [o["alone"] for o in sorted(outs, key=lambda o: o["rank"])]
    assert 0 < alone[0] < alone[1]                         # the budgets really differ
    assert {o["agreed"] for o in outs} == {min(alone)}
