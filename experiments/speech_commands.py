r"""Speech Commands (35 classes, raw 16 kHz audio: 16,000 steps of one channel).

    get_config("<model>,<regime>[,scale=<f>]")   model / regime as in experiments/lra.py

    python -m sptlib.main --config=experiments/speech_commands.py:s4,spt-masked --workdir=W
    python -m sptlib.compare --config=experiments/speech_commands.py --workdir=W

Masked SPT: 25% of the samples, L1 reconstruction. The Transformer uses local attention (window
4,096) at this length. Data: TFDS `speech_commands`. Paper (section 3.7): S4 ~96-98% from scratch
on raw audio; SPT narrows the Transformer's gap.
"""

from sptlib import experiments_lib as lib

POSITIONAL = ("model", "regime")


def get_config(arg="s4,spt-masked"):
    a = lib.parse_arg(arg, POSITIONAL)
    config = lib.build("speech_commands", a.get("model", "s4"), a.get("regime", "spt-masked"),
                       scale=float(a.get("scale", 1.0)))
    with config.unlocked():
        lib.add_compare(config, models=("transformer", "s4"), regimes=("scratch", "spt-masked"),
                        seeds=(0, 1, 2), title="Speech Commands (paper sizes)")
    return config
