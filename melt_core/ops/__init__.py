"""Operations around the runs: memory and speed profiling at the paper's shapes (profiler), the cost
plan of a config (plan), and checkpoint download from the hub (download).

May import: every other layer; nothing imports ops.
"""
