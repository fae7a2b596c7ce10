"""Protects HumanEval+ scoring against hostile and careless completions: each is contained by the
bubblewrap sandbox (melt_core/sandbox.py) and scored by whether every test ran and passed, and the
scorer, its files, its process group and its network survive. Under CI a missing bubblewrap is a
failure (envs/setup.sh installs it); elsewhere these tests skip with the reason."""

import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from lighteval.models.model_output import ModelResponse

from melt_core import code_tasks, sandbox
from melt_core.code_tasks import PassesTests, humaneval_prompt

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


def score(completion: str) -> float:
    return PassesTests()(humaneval_prompt(ROW, "humaneval"), ModelResponse(input="", text=[completion]))


def wrong_then(tail: str) -> str:
    return block(f"import os, sys, atexit\ndef add(a, b):\n    return a - b\n{tail}")


@pytest.mark.parametrize("name,completion", [
    ("exit under __main__", wrong_then("if __name__ == '__main__':\n    exit()")),
    ("os._exit(0)", wrong_then("os._exit(0)")),
    ("atexit hook exits 0", wrong_then("atexit.register(lambda: os._exit(0))")),
    ("excepthook exits 0", wrong_then("sys.excepthook = lambda *a: os._exit(0)")),
    ("SystemExit(0) after a wrong answer", wrong_then("raise SystemExit(0)")),
    ("fork, then the parent exits 0", wrong_then("if os.fork():\n    os._exit(0)")),
])
def test_early_exits_do_not_pass(name, completion):
    assert score(completion) == 0.0, name


def test_right_and_wrong_answers_score_as_they_deserve():
    assert score(RIGHT) == 1.0 and score(WRONG) == 0.0
    assert score(block("def add(a, b):\n    return a + b")) == 1.0


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
    time.sleep(0.5)
    left = subprocess.run(["pgrep", "-f", "/sandbox/program.py"], capture_output=True, text=True).stdout.split()
    assert not left, left


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


def test_endless_loop_times_out(monkeypatch):
    monkeypatch.setattr(code_tasks, "TIMEOUT_S", 2.0)
    assert score(block("def add(a, b):\n    while True:\n        pass")) == 0.0


def test_refuses_without_bubblewrap_unless_opted_in(monkeypatch):
    monkeypatch.setattr(sandbox, "available", lambda: False)
    with pytest.raises(sandbox.SandboxUnavailable, match="bubblewrap.*unsafe_no_sandbox: true"):
        score(RIGHT)
    unsafe = PassesTests(unsafe_no_sandbox=True)
    assert unsafe(humaneval_prompt(ROW, "humaneval"), ModelResponse(input="", text=[RIGHT])) == 1.0
