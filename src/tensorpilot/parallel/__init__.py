"""Many processes, one run: DDP, FSDP2, tensor and pipeline parallelism on a DeviceMesh.

    mesh.py       process group + DeviceMesh ("dp", "pp", "tp") from torchrun's/SLURM's environment
    runtime.py    ``Parallel``: parallelize(model) in a fixed order and the per-step hooks the trainer calls
    ddp.py, fsdp.py, tensor.py, pipeline.py    one strategy each, applied from outside the model;
                  what is model-specific (which layers split how, where a pipeline cuts) comes from
                  the workload's spec (tensorpilot.workloads.specs)

Distributed checkpoints are training's (tensorpilot.training.dcp); starting the processes is
tensorpilot.launch's. Importing this package imports nothing heavy.
"""
