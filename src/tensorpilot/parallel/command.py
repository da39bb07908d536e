"""``tensorpilot launch slurm|k8s``: write the job files for a multi-node run (argparse only here;
the writers live in parallel/launch.py)."""

from __future__ import annotations

import argparse


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nodes", type=int, default=2, metavar="N", help="Nodes (default: 2).")
    p.add_argument("--gpus", type=int, default=8, metavar="G", help="GPUs per node (default: 8).")
    p.add_argument("--name", default="tensorpilot", help="Job name (default: tensorpilot).")
    p.add_argument("--out", metavar="FILE", help="Write here (default: <name>.sbatch / <name>.yaml).")
    p.add_argument("train_args", nargs=argparse.REMAINDER, metavar="-- TRAIN ARGS",
                   help="Arguments of `tensorpilot train` after `--`, e.g. -- --size large --steps 5000.")


def register(sub) -> dict[str, argparse.ArgumentParser]:
    la = sub.add_parser("launch", help="Write an sbatch script or a Kubernetes PyTorchJob for a multi-node run.",
                        description="Write the job file that runs `tensorpilot train` on N nodes x G GPUs "
                        "through torchrun (c10d rendezvous, restarts, shared checkpoint directory).")
    kinds = la.add_subparsers(dest="launch_kind", metavar="{slurm,k8s}", required=True)
    sl = kinds.add_parser("slurm", help="An sbatch script (srun + torchrun).")
    _common(sl)
    sl.add_argument("--time", default="24:00:00", help="Wall-clock limit (default: 24:00:00).")
    sl.add_argument("--partition", help="SLURM partition.")
    sl.add_argument("--checkpoint-dir", default="$HOME/tensorpilot-runs/$SLURM_JOB_NAME",
                    help="Run directory on storage all nodes share.")
    k8 = kinds.add_parser("k8s", help="A Kubeflow PyTorchJob manifest plus its checkpoint volume claim.")
    _common(k8)
    k8.add_argument("--image", default="ghcr.io/example/tensorpilot:latest", help="Container image.")
    k8.add_argument("--namespace", default="default", help="Namespace (default: default).")
    k8.add_argument("--pvc-size", default="100Gi", help="Checkpoint volume size (default: 100Gi).")
    k8.add_argument("--storage-class", help="StorageClass of the ReadWriteMany checkpoint volume.")
    k8.add_argument("--max-restarts", type=int, default=3, help="Group restarts (default: 3).")
    la.set_defaults(func=cmd_launch)
    return {"launch": la}


def cmd_launch(args: argparse.Namespace) -> int:
    from pathlib import Path

    from tensorpilot.parallel import launch

    launch.check_job_size(args.nodes, args.gpus)
    train_args = [a for a in args.train_args if a != "--"] if args.train_args else []
    if args.launch_kind == "slurm":
        text = launch.sbatch_script(nodes=args.nodes, gpus=args.gpus, train_args=train_args,
                                    job_name=args.name, time=args.time, partition=args.partition,
                                    checkpoint_dir=args.checkpoint_dir)
        out = Path(args.out or f"{args.name}.sbatch")
    else:
        import json

        pvc = launch.checkpoint_pvc(name=f"{args.name}-checkpoints", size=args.pvc_size,
                                    namespace=args.namespace, storage_class=args.storage_class)
        job = launch.pytorchjob_manifest(name=args.name, nodes=args.nodes, gpus=args.gpus, image=args.image,
                                         train_args=train_args, pvc=pvc["metadata"]["name"],
                                         namespace=args.namespace, max_restarts=args.max_restarts)
        # JSON is valid YAML: two documents, no YAML library needed
        text = "---\n".join(json.dumps(doc, indent=2) + "\n" for doc in (pvc, job))
        out = Path(args.out or f"{args.name}.yaml")
    out.write_text(text)
    print(f"wrote {out} ({args.nodes} node(s) x {args.gpus} GPU(s))")
    return 0
