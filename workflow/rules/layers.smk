# Which config files make up a run. No --configfile: the embedded default (config/default.yaml).
# Otherwise exactly the files given, each preceded by the config it declares it overlays
# (`overlays: paper.yaml`, a path relative to the overlay), so `--configfile config/paper.yaml`
# runs paper.yaml alone: nothing of the embedded task can merge under it.
from pathlib import Path

import yaml


def config_layers(given):
    """Base files Snakemake must load under the command line's files, in order (base first)."""
    if not given:
        return ["config/default.yaml"]
    given = [Path(f).resolve() for f in given]
    bases = []

    def add_bases(path, chain):
        raw = yaml.safe_load(path.read_text()) or {}
        base = raw.get("overlays")
        if not base:
            return
        base = (path.parent / base).resolve()
        if base in chain:
            raise ValueError(f"{path}: `overlays:` forms a cycle through {base}")
        if not base.is_file():
            raise ValueError(f"{path}: overlays {base}, which does not exist")
        add_bases(base, chain + [base])
        if base not in given and base not in bases:
            bases.append(base)

    for f in given:
        add_bases(f, [f])
    return [str(b) for b in bases]


for _base in config_layers(workflow.overwrite_configfiles):

    configfile: _base


config.pop("overlays", None)  # layering only; not part of the experiment's config
# An overlay that serves several base configs (the rehearsal: v2 and v3) keeps their outputs apart
# with `{paper_version}` in its name, outdir and MLflow settings.
for _key, _holder in (("name", config), ("outdir", config), ("tracking_uri", config.get("mlflow", {})),
                      ("experiment", config.get("mlflow", {}))):
    if isinstance(_holder.get(_key), str) and "{paper_version}" in _holder[_key]:
        _holder[_key] = _holder[_key].replace("{paper_version}", str(config.get("paper_version")))
