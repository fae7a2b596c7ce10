"""Browse a finished run's MLflow store as a researcher does, and fail on what they would miss.

    python .ci/check_browse.py results/smoke

Starts a real `mlflow server` on <outdir>/mlflow.db, then
1. through its REST API: every rule's run finished under an invocation parent with the tags
   docs/WORKFLOW.md promises; for each gate of the gate ablation, its training (phase) runs and its eval runs,
   each eval linked to the training run (same gate and seed) that wrote its checkpoint, with its
   per-question results and its log attached as artifacts;
2. in a real headless browser (Debian's chromium-headless-shell, driven over the DevTools protocol
   on a pipe): opens docs/WORKFLOW.md's runs-table URL filtered to the gate ablation, expands the
   invocation, and finds every gate-ablation training run by its name in the rendered table.
"""

import fcntl
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import yaml

OUT = Path(sys.argv[1]).resolve()
CFG = yaml.safe_load((OUT / "config.resolved.yaml").read_text())
problems: list[str] = []


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def call(base: str, path: str, body: dict | None = None) -> dict:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read())


def all_runs(base: str, exp_id: str) -> list[dict]:
    runs, token = [], None
    while True:
        page = call(base, "/api/2.0/mlflow/runs/search",
                    {"experiment_ids": [exp_id], "max_results": 1000, **({"page_token": token} if token else {})})
        runs += page.get("runs", [])
        token = page.get("next_page_token")
        if not token:
            return runs


def artifacts(base: str, run_id: str, path: str = "") -> list[str]:
    q = urllib.parse.urlencode({"run_id": run_id, "path": path})
    return [f["path"] for f in call(base, f"/api/2.0/mlflow/artifacts/list?{q}").get("files", [])]


def check_rest(base: str) -> tuple[str, list[str]]:
    """The store through REST; returns the experiment id and the gate-ablation training run names."""
    exp = call(base, "/api/2.0/mlflow/experiments/get-by-name?experiment_name="
               + urllib.parse.quote(CFG["mlflow"]["experiment"]))["experiment"]
    runs = all_runs(base, exp["experiment_id"])
    tags = {r["info"]["run_id"]: {t["key"]: t["value"] for t in r["data"].get("tags", [])} for r in runs}
    by_id = {r["info"]["run_id"]: r for r in runs}
    latest = {}  # a retried job: its last attempt counts
    for r in sorted(runs, key=lambda r: r["info"]["start_time"]):
        latest[(tags[r["info"]["run_id"]].get("rule"), r["info"]["run_name"])] = r
    for (rule, name), r in latest.items():
        t = tags[r["info"]["run_id"]]
        if r["info"]["status"] != "FINISHED":
            problems.append(f"run {name!r} ({rule}) ended {r['info']['status']}")
        if rule == "invocation":
            continue
        missing = [k for k in ("stage", "config_hash", "mlflow.source.git.commit", "mlflow.user") if not t.get(k)]
        if missing:
            problems.append(f"run {name!r} ({rule}) lacks tags {missing}")
        parent = tags.get(t.get("mlflow.parentRunId", ""), {})
        if parent.get("rule") not in ("invocation", "phase"):
            problems.append(f"run {name!r} ({rule}) is not a child of an invocation (or its phase job)")
    gate_recipe, seeds = CFG["ablations"]["gate_recipe"], [str(s) for s in CFG["seeds"]]
    names = []
    for gate in CFG["ablations"]["gates"]:
        phases = [r for r in latest.values() if tags[r["info"]["run_id"]].get("rule") == "phase"
                  and tags[r["info"]["run_id"]].get("gate") == gate]
        evals = [r for r in latest.values()
                 if tags[r["info"]["run_id"]].get("rule") in ("eval", "eval_model", "eval_seed")
                 and tags[r["info"]["run_id"]].get("gate") == gate
                 and tags[r["info"]["run_id"]].get("recipe") == gate_recipe]
        trained_seeds = {tags[r["info"]["run_id"]].get("seed") for r in phases}
        if trained_seeds != set(seeds):
            problems.append(f"gate {gate}: phase runs for seeds {sorted(trained_seeds, key=str)}, expected {seeds}")
        if not evals:
            problems.append(f"gate {gate}: no eval run tagged gate={gate}, recipe={gate_recipe}")
        names += [r["info"]["run_name"] for r in phases]
        for r in evals:
            t, name = tags[r["info"]["run_id"]], r["info"]["run_name"]
            trained = tags.get(t.get("training_run_id", ""), {})
            if (trained.get("rule"), trained.get("gate"), trained.get("seed")) != ("phase", gate, t.get("seed")):
                found = (trained.get("rule"), trained.get("gate"), trained.get("seed"))
                problems.append(f"eval {name!r}: training_run_id does not lead to its gate's phase run of seed "
                                f"{t.get('seed')} (found rule, gate, seed = {found})")
            if not t.get("checkpoint") or not Path(t["checkpoint"]).exists():
                problems.append(f"eval {name!r}: checkpoint tag {t.get('checkpoint')!r} is not a directory here")
            listed = artifacts(base, r["info"]["run_id"])
            if not {"logs", "results"} <= set(listed):
                problems.append(f"eval {name!r}: artifacts {listed}, expected logs/ and results/")
            elif not any(p.endswith(".json") for p in artifacts(base, r["info"]["run_id"], "results")):
                problems.append(f"eval {name!r}: no per-question results JSON under results/")
    if not by_id:
        problems.append("the store holds no runs")
    print(f"REST: {len(runs)} runs, {len(names)} gate-ablation training runs")
    return exp["experiment_id"], names


class Chromium:
    """Headless Chromium driven over the DevTools protocol on a pipe (fds 3 and 4, NUL-framed JSON)."""

    def __init__(self, binary: str):
        to_chrome_r, self._w = os.pipe()
        self._r, from_chrome_w = os.pipe()
        # the child's ends above fd 9, so that placing them at 3 and 4 cannot overwrite one another
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_chrome_r, from_chrome_w)]
        os.close(to_chrome_r)
        os.close(from_chrome_w)

        def fds():  # in the child: the pipe ends at the fds Chromium expects
            os.dup2(high[0], 3)
            os.dup2(high[1], 4)

        flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--remote-debugging-pipe",
                 "--window-size=1600,4000"]
        self.proc = subprocess.Popen([binary, *flags, "about:blank"], pass_fds=(3, 4),
                                     preexec_fn=fds, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for fd in high:
            os.close(fd)
        self._buf, self._id = b"", 0

    def send(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params or {}, **({"sessionId": session} if session else {})}
        os.write(self._w, json.dumps(msg).encode() + b"\0")
        while True:
            while b"\0" not in self._buf:
                chunk = os.read(self._r, 1 << 16)
                if not chunk:
                    raise RuntimeError("chromium closed its DevTools pipe")
                self._buf += chunk
            raw, self._buf = self._buf.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]

    def close(self):
        self.proc.kill()
        self.proc.wait(timeout=30)


def check_browser(base: str, exp_id: str, names: list[str]) -> None:
    binary = shutil.which("chromium-headless-shell") or shutil.which("chromium")
    if binary is None:
        problems.append("no headless Chromium (apt-get install chromium-headless-shell; envs/setup.sh does as root)")
        return
    flt = urllib.parse.quote("tags.rule = 'phase'")
    url = f"{base}/#/experiments/{exp_id}/runs?workflowType=machine_learning&searchFilter={flt}"
    browser = Chromium(binary)
    try:
        target = browser.send("Target.createTarget", {"url": url})["targetId"]
        session = browser.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]

        def page(expr: str):
            return browser.send("Runtime.evaluate", {"expression": expr, "returnByValue": True, "awaitPromise": True},
                                session)["result"].get("value")

        text, deadline = "", time.time() + 120
        while time.time() < deadline:  # the table renders, then each invocation row is expanded
            page("document.querySelectorAll('[role=gridcell] button[data-component-id*=runnamecellrenderer]')"
                 ".forEach(b => { if (!b.dataset.opened) { b.dataset.opened = 1; b.click(); } })")
            text = page("document.body.innerText") or ""
            if all(n in text for n in names):
                break
            time.sleep(1)
        missing = [n for n in names if n not in text]
        if missing:
            problems.append(f"browser: the runs table at {url} does not show {missing[:5]} "
                            f"({len(missing)} of {len(names)} gate-ablation runs)")
        else:
            print(f"browser: all {len(names)} gate-ablation training runs found by name in the runs table")
    finally:
        browser.close()


port = free_port()
mlflow = shutil.which("mlflow", path=str(Path(sys.executable).parent)) or "mlflow"
server = subprocess.Popen([mlflow, "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
                           "--backend-store-uri", f"sqlite:///{OUT / 'mlflow.db'}"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                          # the server's job runner (four huey consumers) does nothing for a browse
                          env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
base = f"http://127.0.0.1:{port}"
try:
    deadline = time.time() + 120
    while True:
        try:
            urllib.request.urlopen(f"{base}/health", timeout=2)
            break
        except OSError:
            if time.time() > deadline:
                raise SystemExit("mlflow server did not come up in 120 s") from None
            time.sleep(0.5)
    exp_id, gate_runs = check_rest(base)
    if gate_runs:
        check_browser(base, exp_id, gate_runs)
finally:
    server.terminate()
    server.wait(timeout=30)
if problems:
    print("browse check FAILED:\n- " + "\n- ".join(problems))
    sys.exit(1)
print("browse check passed")
