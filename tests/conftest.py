import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import melt_core

# The suite runs in two pytest-xdist workers (pyproject: -n 2; -n 0 runs it in this process), one
# torch thread each: two workers of two OpenMP threads on two cores wait on each other's cores.
# A user's OMP_NUM_THREADS is kept; the jobs the tests start inherit it.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

# Files whose tests run in one worker, one at a time (every other test goes to whichever worker is
# free): the sandbox's tests count the host's sandbox folders and processes, so no other worker may
# be scoring code meanwhile; the SLURM tests' jobs each take the one-node cluster's two CPUs.
SHARED_WORKER = {"test_sandbox.py": "sandbox", "test_code_scoring.py": "sandbox", "test_lighteval_suite.py": "sandbox",
                 "test_slurm.py": "slurm"}

FIXTURES = Path(__file__).resolve().parent / "fixtures"
FIXTURE = FIXTURES / "ouro-tiny-reference"  # in the project: a user's clone has every file a test reads


def under_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _fail_skips_under_ci(report) -> None:
    if report.skipped and under_ci():
        reason = report.longrepr[-1] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"skipped under CI (CI=true), which counts as a failure: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under CI a skipped test (or module, below) is a failure: a skip can never read as a pass there."""
    outcome = yield
    _fail_skips_under_ci(outcome.get_result())


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the marks into the test ids it schedules by
def pytest_collection_modifyitems(config, items):
    """The groups first: a worker starts each long serial group while the other takes the rest."""
    for item in items:
        if item.path.name in SHARED_WORKER:
            item.add_marker(pytest.mark.xdist_group(SHARED_WORKER[item.path.name]))
    items.sort(key=lambda item: item.path.name not in SHARED_WORKER)


def pytest_configure(config):
    config.addinivalue_line("markers", "xdist_group(name): run in the same pytest-xdist worker as its group")


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    _fail_skips_under_ci(outcome.get_result())


@pytest.fixture(scope="session")
def fixture_dir(tmp_path_factory) -> Path:
    """The reference checkpoint as the pipeline holds a hub snapshot: brought in by the download
    rule's code (melt_core.ops.download.fetch: structure checked, checksums.json written), since every
    load verifies that manifest. The repository keeps the snapshot in the hub's own layout."""
    assert FIXTURE.is_dir(), f"reference fixture missing at {FIXTURE} (it is part of the repository)"
    from melt_core.ops.download import fetch

    return fetch(tmp_path_factory.mktemp("fixture") / FIXTURE.name, local_dir=FIXTURE)


@pytest.fixture(scope="session")
def reference(fixture_dir):
    return load_file(str(fixture_dir / "reference_outputs.safetensors"))


@pytest.fixture()
def ouro(fixture_dir):
    return melt_core.load_pretrained(fixture_dir)


@pytest.fixture(autouse=True)
def _deterministic():
    """Each test starts as a fresh process would: seeded, grad on (importing lighteval turns grad off
    for the whole process, so without this a test's outcome would depend on which ran before it in
    the same worker)."""
    torch.manual_seed(0)
    torch.set_grad_enabled(True)


@pytest.fixture(autouse=True)
def _in_its_group(request):
    """A file of SHARED_WORKER really runs in one worker: xdist schedules by test id, which carries
    the group (``...@sandbox``) only if the mark was there before xdist read it."""
    group = SHARED_WORKER.get(request.node.path.name)
    if group and os.environ.get("PYTEST_XDIST_WORKER") and request.config.getvalue("loadgroup"):
        assert request.node.nodeid.endswith(f"@{group}"), (
            f"{request.node.nodeid} is not in xdist group {group!r}: it may run beside another worker's tests")
