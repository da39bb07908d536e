"""Starting a run on many processes: ``tensorpilot launch`` and ``train --nproc/--nnodes``.

    torchrun.py   re-launch ``tensorpilot train`` through torchrun's elastic agent (one node or many)
    jobfiles.py   SLURM sbatch scripts and Kubeflow PyTorchJob manifests that do the same on a cluster
    command.py    the ``tensorpilot launch`` subcommand (argparse only)

The processes it starts join their group in ``tensorpilot.parallel``; this package sits above
training (it reads a run directory's checkpoints and writes its configuration).
"""
