"""``python -m melt_core.modeling.convert OURO_DIR MELT_DIR [--gate ...]``: Ouro -> MELT checkpoint."""

from __future__ import annotations

import argparse

from .checkpoint import convert_ouro_to_melt
from .config import GATE_H0, GATE_VARIANTS


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("src", help="Ouro checkpoint directory (config.json + safetensors)")
    p.add_argument("dst", help="where to write the MELT checkpoint directory")
    p.add_argument("--gate", choices=GATE_VARIANTS, default="elementwise")
    p.add_argument("--gate-h0", choices=GATE_H0, default="zeros")
    p.add_argument("--ema-z", type=float, default=0.2)
    p.add_argument("--window", type=int, default=0, help="v3 sliding window W (0 = v2)")
    p.add_argument("--gate-init-std", type=float, default=0.02)
    p.add_argument("--gate-bias-init", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    out = convert_ouro_to_melt(a.src, a.dst, gate=a.gate, window=a.window, gate_h0=a.gate_h0,
                               ema_z=a.ema_z, gate_init_std=a.gate_init_std,
                               gate_bias_init=a.gate_bias_init, seed=a.seed)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
