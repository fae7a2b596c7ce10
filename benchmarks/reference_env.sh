#!/usr/bin/env bash
# A separate environment for benchmarks/reference_ouro.py: the reference Ouro modeling code
# targets transformers 4.57 (the project pins transformers 5), so it gets its own venv.
# Only the benchmark uses it; the pipeline and the tests never do.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv-ref
.venv-ref/bin/pip install --disable-pip-version-check -q torch==2.13.0 transformers==4.57.6 safetensors
.venv-ref/bin/pip install --disable-pip-version-check -q --no-deps -e .
.venv-ref/bin/python -c "import torch, transformers, melt_core; print('reference env:', torch.__version__, transformers.__version__)"
