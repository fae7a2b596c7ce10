import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import melt_core

SHARED = Path(os.environ.get("MELT_SHARED", Path(__file__).resolve().parents[2] / "shared"))
FIXTURE = SHARED / "fixtures" / "ouro-tiny-reference"


@pytest.fixture(scope="session")
def fixture_dir() -> Path:
    if not FIXTURE.is_dir():
        msg = (f"reference fixture not found at {FIXTURE}: the tests expect the project's shared/ "
               "beside the checkout, or MELT_SHARED pointing at it")
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(msg)  # under CI a missing fixture is a failure, never a silent skip
        pytest.skip(msg)
    return FIXTURE


@pytest.fixture(scope="session")
def reference(fixture_dir):
    return load_file(str(fixture_dir / "reference_outputs.safetensors"))


@pytest.fixture()
def ouro(fixture_dir):
    return melt_core.load_pretrained(fixture_dir)


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(0)
