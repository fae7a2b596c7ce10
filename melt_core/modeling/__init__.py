"""The networks and what they are made of: ModelConfig and its presets, the gate, the KV caches,
LoopedLM (Ouro and MELT), the exit rules, the losses, the dense baselines, and checkpoints (read,
write, convert Ouro to MELT).

May import: nothing else of melt_core (the bottom layer).
"""
