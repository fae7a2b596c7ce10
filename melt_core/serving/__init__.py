"""Which engine runs a model and the vLLM side of it: inference picks melt_core's engine or vLLM for
an eval's model (and says why a model stays native); vllm_engine starts vLLM in the serving
environment and talks to it; vllm_plugin, vllm_models, vllm_scheduler and vllm_worker run inside
vLLM's processes (Ouro and MELT as vLLM models, MELT's chunk-wise prompts through vLLM's scheduler).

May import: modeling, generation. Only the vllm_* modules may import vLLM, and only they run in
the serving environment (.venv-vllm).
"""
