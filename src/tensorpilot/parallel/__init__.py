"""Many processes, one run: DDP, FSDP2, tensor and pipeline parallelism on a DeviceMesh, distributed
checkpoints, and launching through torchrun, SLURM or Kubernetes.

    mesh.py       process group + DeviceMesh ("dp", "pp", "tp") from torchrun's/SLURM's environment
    runtime.py    ``Parallel``: parallelize(model) in a fixed order and the per-step hooks the trainer calls
    ddp.py, fsdp.py, tensor.py, pipeline.py    one strategy each, applied from outside the model
    dcp.py        torch.distributed.checkpoint save/load, resumable at another world size
    launch.py     re-launch through torchrun; sbatch scripts and Kubeflow PyTorchJob manifests
    command.py    the ``tensorpilot launch`` subcommand (argparse only)

Importing this package imports nothing heavy; the modules import torch.distributed themselves.
"""
