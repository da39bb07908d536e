"""``tensorpilot profile``: a profiled run and a diagnosis -- where the step time goes, why, and
which train flag changes it. (The package is ``profiling`` because ``tensorpilot.profile`` is the
Python API function, tensorpilot/api.py.)

    run.py        the measurement: the trainer's own setup, warm-up, timed and profiled steps
    events.py     torch.profiler's event tree as plain ``Ev`` values (and the GPU kernels)
    breakdown.py  one step's wall time split into categories, per module (pure)
    roofline.py   per op class: FLOPs and bytes (traced step) over measured time, vs ceilings
    findings.py   ranked findings {kind, share_of_step, evidence, fix, flag} (pure)
    report.py     console table, profile.json, the Chrome trace;  plots.py: profile.png
    command.py    the subcommand (train's options plus --steps/--warmup/--out/--json/--apply)

Nothing heavy is imported here: ``tensorpilot --help`` must not import torch.
"""
