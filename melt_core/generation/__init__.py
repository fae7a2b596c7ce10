"""melt_core's own inference engine: continuous-batched generation with chunk-wise prefill
(generate) and the fixed-shape decode step a CUDA graph can capture (static_decode).

May import: modeling.
"""
