"""Benchmarks: melt_core's own eval loop (evaluate), lighteval's tasks and metrics run through our
engines (lighteval_adapter, lighteval_tasks, metrics), and code benchmarks scored by running the
model's code inside the sandbox (code_tasks, code_harness, sandbox).

May import: modeling, generation, serving, and the leaves data and tracking.
"""
