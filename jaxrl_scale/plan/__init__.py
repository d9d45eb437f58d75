"""`jaxrl-scale plan`: compile a run's programs for a Cloud TPU topology without a TPU.

  chips.py     TPU generations (peak FLOP/s, HBM, bandwidth) and slice names
  programs.py  the run's programs, built by the run's own code over the topology's devices
  hlo_cost.py  loop-aware FLOPs and bytes from the compiled HLO
  report.py    compile, measure, roofline, the table and the JSON object
  command.py   the CLI
"""
