#!/usr/bin/env bash
# Creates .venv with the pinned environment (idempotent: reinstalls only when the pins change)
# and makes the Snakemake profiles `local` and `slurm` reachable by name.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
req=envs/requirements-cpu.txt
stamp=.venv/.installed-requirements
if [[ "${1:-}" == "--refresh" ]]; then rm -f "$stamp"; fi
if [[ ! -x .venv/bin/python ]] || ! cmp -s "$req" "$stamp"; then
  python3 -m venv .venv
  log=.venv/pip-install.log
  echo "setup: installing the pinned environment into .venv (log: $log)"
  if ! { .venv/bin/pip install --disable-pip-version-check -r "$req" \
         && .venv/bin/pip install --disable-pip-version-check --no-deps --no-build-isolation -e .; } \
       > "$log" 2>&1; then
    tail -n 40 "$log" >&2
    echo "setup: pip install failed; see $log" >&2
    exit 1
  fi
  .venv/bin/python -c "import melt_core, torch, snakemake" # fail loudly if the install did not take
  cp "$req" "$stamp"
fi
# HumanEval+ scoring runs model-written code only inside bubblewrap (melt_core/sandbox.py): install
# it where we may (root with apt); elsewhere ask for it, since scoring refuses to run without it.
if ! command -v bwrap >/dev/null; then
  if [[ $EUID -eq 0 ]] && command -v apt-get >/dev/null; then
    echo "setup: installing bubblewrap (the sandbox for model-written code)"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        bubblewrap; } > .venv/apt-bubblewrap.log 2>&1 || { tail -n 20 .venv/apt-bubblewrap.log >&2; exit 1; }
  else
    echo "setup: bubblewrap (bwrap) is missing; install it (e.g. apt-get install bubblewrap) before scoring" \
         "HumanEval+" >&2
  fi
fi
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
