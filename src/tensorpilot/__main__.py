# `python -m tensorpilot ...` and `torchrun -m tensorpilot ...` enter here.
from tensorpilot.cli import main

raise SystemExit(main())
