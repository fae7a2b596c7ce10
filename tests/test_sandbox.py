"""Protects HumanEval+ scoring against hostile and careless completions: each is contained by the
bubblewrap sandbox (melt_core/evaluation/sandbox.py) and scored by whether every test ran and passed, and the
scorer, its files, its process group and its network survive. Under CI a missing bubblewrap is a
failure (envs/setup.sh installs it); elsewhere these tests skip with the reason."""

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest
from lighteval.models.model_output import ModelResponse

from melt_core.evaluation import code_tasks, sandbox
from melt_core.evaluation.code_tasks import PassesTests, humaneval_prompt

if not sandbox.available():
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail("bubblewrap (bwrap) is not installed: envs/setup.sh installs it", pytrace=False)
    pytest.skip("bubblewrap (bwrap) is not installed (apt-get install bubblewrap)", allow_module_level=True)

ROW = {"task_id": "HumanEval/0", "prompt": "def add(a, b):\n    \"\"\"a + b\"\"\"\n", "canonical_solution": "",
       "entry_point": "add", "test": "def check(candidate):\n    assert candidate(2, 3) == 5\n"
                                     "    assert candidate(-1, 1) == 0\n"}
RIGHT = "    return a + b\n"
WRONG = "    return a - b\n"


def block(code: str) -> str:
    return f"<think>...</think>\n```python\n{code}\n```"


# The same problem with an input/output test in evalplus's shape (judged in the scorer)
IO_ROW = {**ROW, "test": "import numpy as np\n\ndef assertion(out, exp, atol):\n    assert out == exp\n\n"
                         "def check(candidate):\n    inputs = [[2, 3], [-1, 1]]\n    results = [5, 0]\n"
                         "    for i, (inp, exp) in enumerate(zip(inputs, results)):\n"
                         "        assertion(candidate(*inp), exp, 0)\n"}


def score(completion: str, row: dict = ROW) -> float:
    return PassesTests()(humaneval_prompt(row, "humaneval"), ModelResponse(input="", text=[completion]))


def wrong_then(tail: str) -> str:
    return block(f"import os, sys, atexit\ndef add(a, b):\n    return a - b\n{tail}")


def right_then(tail: str) -> str:
    return block(f"import os, sys, atexit\n{tail}\ndef add(a, b):\n    return a + b\n")


NONCE_LIKE = "0123456789abcdef0123456789abcdef"
ATTACKS = {
    "prints pass-signal-like lines, then os._exit(0)":
        f"os.write(1, b'\\n{NONCE_LIKE}\\n'); print('{NONCE_LIKE}'); os._exit(0)",
    "prints a reply-like line": "print('{\"v\": 5}'); print('{\"verdict\": \"pass\"}')",
    "exit under __main__": "if __name__ == '__main__':\n    exit()",
    "SystemExit(0) in the call": "def add(a, b):\n    raise SystemExit(0)",
    "atexit hook exits 0": "atexit.register(lambda: os._exit(0))",
    "excepthook exits 0": "sys.excepthook = lambda *a: os._exit(0)",
    "fork, then the parent exits 0": "if os.fork():\n    os._exit(0)",
    "an object equal to everything": "class Any:\n    def __eq__(self, other): return True\n"
                                     "    def __ne__(self, other): return False\n"
                                     "def add(a, b):\n    return Any()",
    "an int subclass equal to everything": "class I(int):\n    def __eq__(self, other): return True\n"
                                           "def add(a, b):\n    return I(0)",
    "reads the expected value from the caller's frames":
        "def add(a, b):\n    f = sys._getframe(1)\n    while f:\n        for k in ('exp', 'expected', 'results'):\n"
        "            if k in f.f_locals: return f.f_locals[k]\n        f = f.f_back\n    return -1",
    "a fake numpy in sys.modules": "import types\nfake = types.ModuleType('numpy')\nfake.testing = fake\n"
                                   "fake.assert_allclose = lambda *a, **k: None\nsys.modules['numpy'] = fake",
    "patches builtins and AssertionError": "import builtins\nbuiltins.AssertionError = type('E', (Exception,), {})\n"
                                           "builtins.isinstance = lambda *a: True\nbuiltins.abs = lambda x: 0",
    "redefines the entry point after import": "def add(a, b):\n    return a - b\n_real = add\nadd = _real",
    "writes to every inherited descriptor": "for fd in range(0, 64):\n    try:\n"
                                            "        os.write(fd, b'{\"v\": 5}\\n{\"verdict\": \"pass\"}\\n')\n"
                                            "    except OSError:\n        pass",
    "replies with JSON nested past any parser": "for fd in range(0, 64):\n    try:\n"
                                                "        os.write(fd, b'[' * 200000 + b']' * 200000 + b'\\n')\n"
                                                "    except OSError:\n        pass",
    "scans globals for a secret": "import re\nfor v in list(globals().values()):\n"
                                  "    if isinstance(v, str) and re.fullmatch('[0-9a-f]{32}', v):\n"
                                  "        os.write(1, ('\\n' + v + '\\n').encode())\nos._exit(0)",
}


@pytest.mark.parametrize("name", list(ATTACKS))
@pytest.mark.parametrize("row", [ROW, IO_ROW], ids=["assert-test", "io-test"])
def test_a_wrong_answer_cannot_score_itself(name, row):
    """Each attack inside a wrong answer scores 0, inside a right answer 1 where the attack leaves
    the function's values intact (the scorer judges values, whatever else the program does)."""
    assert score(wrong_then(ATTACKS[name]), row) == 0.0, name


@pytest.mark.parametrize("name", ["prints a reply-like line", "a fake numpy in sys.modules",
                                  "atexit hook exits 0",
                                  "excepthook exits 0"])
@pytest.mark.parametrize("row", [ROW, IO_ROW], ids=["assert-test", "io-test"])
def test_a_right_answer_still_passes_beside_the_noise(name, row):
    """(A program that breaks its own interpreter, e.g. builtins.isinstance, or writes into its
    reply channel breaks the server that reports its values: that only ever costs its own pass.)"""
    assert score(right_then(ATTACKS[name]), row) == 1.0, name


@pytest.mark.parametrize("row", [ROW, IO_ROW], ids=["assert-test", "io-test"])
def test_right_and_wrong_answers_score_as_they_deserve(row):
    assert score(RIGHT, row) == 1.0 and score(WRONG, row) == 0.0
    assert score(block("def add(a, b):\n    return a + b"), row) == 1.0
    assert score(block("import numpy as np\ndef add(a, b):\n    return int(np.add(a, b))"), row) == 1.0


def test_long_and_noisy_correct_solutions_pass(monkeypatch):
    """200 KiB of code (it travels as a file, not an argument), 50 MB printed (the scorer keeps a
    bounded tail), a child holding the output pipe open (no timeout: the namespace dies with main)."""
    filler = "\n".join(f"_pad_{i} = {i}" for i in range(20_000))  # > 200 KiB
    assert len(filler) > 200 * 1024
    assert score(block(f"{filler}\ndef add(a, b):\n    return a + b")) == 1.0
    assert score(block("print('x' * 50_000_000)\ndef add(a, b):\n    return a + b")) == 1.0
    monkeypatch.setattr(code_tasks, "TIMEOUT_S", 10.0)
    start = time.time()
    holder = "import os, time\nif os.fork() == 0:\n    time.sleep(60)\ndef add(a, b):\n    return a + b"
    assert score(block(holder)) == 1.0
    assert time.time() - start < 8


def test_output_flood_keeps_the_scorer_small():
    result = sandbox.run_untrusted("import sys\nfor _ in range(64):\n    sys.stdout.write('y' * (1 << 20))\n",
                                   limits=sandbox.Limits(output_bytes=4096))
    assert result.output_total == 64 << 20 and len(result.output) == 4096


def test_host_files_environment_and_project_are_out_of_reach(tmp_path, monkeypatch):
    secret = tmp_path / "secret.txt"
    secret.write_text("TOPSECRET-FILE")
    canary = tmp_path / "canary.txt"
    canary.write_text("still here")
    monkeypatch.setenv("MELT_TEST_SECRET", "TOPSECRET-ENV")
    probe = f"""
import os, glob, shutil
for path in [{str(secret)!r}, '/proc/1/environ', '/proc/self/environ', os.path.expanduser('~/.bashrc')]:
    try:
        print(open(path, 'rb').read()[:200])
    except OSError as err:
        print('denied', path, type(err).__name__)
for path in [{str(canary)!r}, {str(tmp_path)!r}, {os.getcwd()!r}]:
    shutil.rmtree(path, ignore_errors=True)
    try:
        os.remove(path)
    except OSError:
        pass
print(sorted(os.listdir('/')))
"""
    result = sandbox.run_untrusted(probe)
    out = result.output.decode()
    assert result.returncode == 0, out
    assert "TOPSECRET" not in out and canary.read_text() == "still here"
    assert os.path.isdir(os.getcwd()) and (tmp_path / "secret.txt").exists()


def test_signals_cannot_reach_the_scorer_or_its_group():
    """Snakemake and its jobs share a process group: a bystander in ours must survive the program
    killing its parent and its process group."""
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        for attack in ("os.kill(os.getppid(), 9)", "os.killpg(0, 9)", f"os.kill({os.getpid()}, 9)",
                       f"os.killpg({os.getpgrp()}, 9)"):
            sandbox.run_untrusted(f"import os\ntry:\n    {attack}\nexcept OSError:\n    pass\n")
        assert bystander.poll() is None
    finally:
        bystander.send_signal(signal.SIGKILL)
        bystander.wait()


def test_no_network_not_even_loopback():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        server.settimeout(1.0)
        port = server.getsockname()[1]
        probe = f"import socket\ns = socket.socket()\nprint(s.connect_ex(('127.0.0.1', {port})))"
        result = sandbox.run_untrusted(probe)
        with pytest.raises(socket.timeout):
            server.accept()
    assert result.output.strip() != b"0"


def test_forked_processes_die_with_the_program_and_their_count_is_capped():
    marker = "melt_fork_marker_7f3a"
    prog = f"""
import os, time
made = 0
for _ in range(50):
    try:
        if os.fork() == 0:
            time.sleep(120)  # {marker}
            os._exit(0)
        made += 1
    except OSError:
        break
print('forked', made)
"""
    result = sandbox.run_untrusted(prog, limits=sandbox.Limits(max_processes=8))
    assert int(result.output.split()[-1]) < 50
    left = settled(lambda: subprocess.run(["pgrep", "-f", "/sandbox/program.py"], capture_output=True,
                                          text=True).stdout.split())
    assert not left, left  # the children sleep 120 s: one that survived the namespace is still there


@pytest.mark.skipif(not sandbox.cgroup_in_use(), reason="no cgroup may be created here: rlimits bound memory")
def test_memory_of_all_processes_together_is_capped():
    prog = """
import os, time
kids = []
for _ in range(3):
    pid = os.fork()
    if pid == 0:
        b = bytearray(700 << 20)
        for j in range(0, len(b), 4096):
            b[j] = 1
        time.sleep(1)
        os._exit(0)
    kids.append(pid)
print([os.waitpid(k, 0)[1] for k in kids])
"""
    result = sandbox.run_untrusted(prog, limits=sandbox.Limits(memory_bytes=1 << 30, timeout_s=60))
    statuses = eval(result.output.decode().strip().splitlines()[-1])  # noqa: S307 - our own program's list
    assert any(s != 0 for s in statuses), "3 x 700 MB ran within a 1 GB cap"


def test_one_process_is_capped_where_no_cgroup_can_be_made(monkeypatch):
    """Without root or cgroup delegation (a cluster login), the address-space limit alone must stop
    a process that allocates past memory_bytes."""
    monkeypatch.setattr(sandbox._Cgroup, "__init__", lambda self, limits: setattr(self, "dirs", []))
    assert not sandbox.cgroup_in_use()
    prog = "try:\n    b = bytearray(1536 << 20)\n    print('allocated')\nexcept MemoryError:\n    print('refused')\n"
    out = sandbox.run_untrusted(prog, limits=sandbox.Limits(memory_bytes=1 << 30, timeout_s=30)).output.decode()
    assert "refused" in out and "allocated" not in out, out


def test_endless_loop_times_out(monkeypatch):
    monkeypatch.setattr(code_tasks, "TIMEOUT_S", 2.0)
    assert score(block("def add(a, b):\n    while True:\n        pass")) == 0.0


def test_refuses_without_bubblewrap_unless_opted_in(monkeypatch):
    monkeypatch.setattr(sandbox, "BWRAP_PATHS", ("/nonexistent/bwrap",))
    with pytest.raises(sandbox.SandboxUnavailable, match="bubblewrap.*unsafe_no_sandbox: true"):
        score(RIGHT)
    unsafe = PassesTests(unsafe_no_sandbox=True)
    assert unsafe(humaneval_prompt(ROW, "humaneval"), ModelResponse(input="", text=[RIGHT])) == 1.0


def test_nothing_of_the_scorers_environment_is_readable_inside(monkeypatch):
    """bwrap runs as PID 1 of the namespace: its environment, /proc/1/environ, is readable inside,
    so bwrap itself must start with nothing of ours."""
    monkeypatch.setenv("MELT_TEST_SECRET", "TOPSECRET-ENV")
    probe = """
import os
seen = {}
for pid in [p for p in os.listdir('/proc') if p.isdigit()]:
    try:
        seen[pid] = open(f'/proc/{pid}/environ', 'rb').read()
    except OSError as err:
        seen[pid] = type(err).__name__.encode()
print(seen)
"""
    out = sandbox.run_untrusted(probe).output.decode()
    assert "b'PATH=/usr/bin:/bin" in out  # /proc/1/environ was read: it holds bwrap's three fixed variables
    assert "TOPSECRET" not in out and "MELT_TEST_SECRET" not in out and "PYTEST" not in out, out


@pytest.fixture()
def open_folder():
    """A folder in the system's temp folder that nobody (whom the sandbox runs as under root) may
    read: pytest's tmp_path is 0700. Removed afterwards."""
    folder = __import__("pathlib").Path(tempfile.mkdtemp(prefix="melt-test-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_a_bwrap_that_cannot_start_raises_and_is_never_scored(monkeypatch, open_folder):
    """As on clusters that block user namespaces: the task fails when built, and a scoring call
    raises instead of reading bwrap's failure as the program's."""
    fake = open_folder / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to creating new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setattr(sandbox, "BWRAP_PATHS", (str(fake),))
    with pytest.raises(sandbox.SandboxError, match="could not start the sandbox.*No permissions.*namespace"):
        sandbox.self_test()
    with pytest.raises(sandbox.SandboxError, match="could not start"):
        score(RIGHT)
    with pytest.raises(sandbox.SandboxError, match="could not start"):
        score(RIGHT, IO_ROW)


@pytest.mark.parametrize("busy_starts", [2, len(sandbox.START_WAITS_S) + 1])
def test_a_start_refused_for_a_moment_is_tried_again(monkeypatch, busy_starts, open_folder):
    """bwrap's clone() may get EAGAIN while the kernel still reaps the last sandbox's processes:
    such a start is tried again after a pause, a few times, and then fails as any other."""
    real = sandbox.bwrap_path()  # the sandbox asks bwrap for its --help once: not a start
    tries = open_folder / "tries"
    tries.mkdir()
    tries.chmod(0o777)  # the sandbox starts bwrap as nobody under root
    fake = open_folder / "bwrap"
    fake.write_text(f"""#!/bin/sh
case $1 in --help) exec {real} --help;; esac
n=$(ls {tries} | wc -l)
touch {tries}/$n
if [ $n -lt {busy_starts} ]; then
  echo 'bwrap: Creating new namespace failed: Resource temporarily unavailable' >&2
  exit 1
fi
exec {real} "$@"
""")
    fake.chmod(0o755)
    monkeypatch.setattr(sandbox, "BWRAP_PATHS", (str(fake),))
    monkeypatch.setattr(sandbox, "START_WAITS_S", (0.01,) * len(sandbox.START_WAITS_S))
    if busy_starts <= len(sandbox.START_WAITS_S):
        assert sandbox.run_untrusted("print(6 * 7)").output.strip() == b"42"
    else:
        with pytest.raises(sandbox.SandboxError, match="could not start.*Resource temporarily unavailable"):
            sandbox.run_untrusted("print(6 * 7)")
    assert len(list(tries.iterdir())) == min(busy_starts + 1, len(sandbox.START_WAITS_S) + 1)


def test_self_test_passes_on_a_working_sandbox():
    sandbox.self_test()


def settled(probe, seconds: float = 5.0):
    """``probe()`` once it reports nothing (every item empty), or as it is after ``seconds``: the
    kernel reaps a killed namespace's processes asynchronously, slower on a busy machine."""
    deadline = time.monotonic() + seconds
    while any(found := probe()) and time.monotonic() < deadline:
        time.sleep(0.1)
    return found


def _host_state() -> tuple[set, set]:
    tmp = {p.name for p in __import__("pathlib").Path(tempfile.gettempdir()).glob("melt-sandbox-*")}
    procs = set(subprocess.run(["pgrep", "-f", "harness.py|program.py"], capture_output=True, text=True).stdout.split())
    return tmp, procs


@pytest.mark.parametrize("name,bomb", [
    ("fork bomb", "while True:\n    try:\n        os.fork()\n    except OSError:\n        pass"),
    ("memory bomb", "blocks = []\nwhile True:\n    blocks.append(bytearray(1 << 26))"),
    ("disk fill", "i = 0\nfor d in ('/tmp', '/work', '/', '/sandbox'):\n    try:\n        while True:\n"
                  "            open(f'{d}/fill{i}', 'wb').write(b'x' * (1 << 24))\n            i += 1\n"
                  "    except OSError:\n        pass"),
])
def test_bombs_fail_and_leave_the_host_as_it_was(name, bomb, monkeypatch, open_folder):
    """Nothing new is left: no sandbox folder (in a temp folder of this test's own) and no process
    of a sandbox (one still dying from an earlier test may end meanwhile); a bomb left running
    outlives the seconds allowed for the kernel to reap the namespace."""
    monkeypatch.setattr(code_tasks, "TIMEOUT_S", 5.0)
    monkeypatch.setattr(tempfile, "tempdir", str(open_folder))
    before = _host_state()
    assert score(wrong_then(bomb)) == 0.0, name
    assert score(wrong_then(bomb), IO_ROW) == 0.0, name
    left = settled(lambda: [now - was for now, was in zip(_host_state(), before)])
    assert left == [set(), set()], _described(left[1])  # no sandbox folder, no process of ours left behind


def _described(pids: set) -> str:
    if not pids:
        return ""
    return subprocess.run(["ps", "-o", "pid,ppid,stat,wchan:20,etimes,args", "-p", ",".join(pids)],
                          capture_output=True, text=True).stdout


def test_writable_space_inside_is_bounded():
    """/tmp and /work take at most tmp_bytes where bwrap can size them, are charged to the cgroup
    where there is one, and do not exist as writable space otherwise; the root is read-only."""
    probe = """
import os
for d in ('/tmp', '/work', '/'):
    n = 0
    try:
        with open(os.path.join(d, 'fill'), 'wb') as f:
            while n < (256 << 20):
                f.write(b'x' * (1 << 20)); f.flush(); n += 1 << 20
    except OSError:
        pass
    print(d, n)
"""
    limits = sandbox.Limits(memory_bytes=1 << 30, file_bytes=1 << 30, tmp_bytes=32 << 20)
    written = dict(line.split() for line in sandbox.run_untrusted(probe, limits=limits).output.decode().splitlines())
    assert int(written["/"]) == 0
    for d in ("/tmp", "/work"):
        assert int(written[d]) <= (limits.memory_bytes if sandbox.cgroup_in_use() else limits.tmp_bytes), written
