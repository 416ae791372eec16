r"""Speech Commands (35 classes, raw 16 kHz audio: 16,000 steps of one channel).

    get_config("<model>,<regime>[,scale=<f>]")   model / regime as in experiments/lra.py

    python -m sptlib.main --config=experiments/speech_commands.py:s4,spt-masked --workdir=W
    python -m sptlib.compare --config=experiments/speech_commands.py --workdir=W

SC35: all 35 words of Speech Commands v0.02 (train 84,843 / validation 9,981 / test 11,005 clips),
read from the raw release under `--config.data.speech_commands_dir` (docs/data.md); TFDS's own
`speech_commands` has only 12 classes. Settings follow the authors' released `configs/experiment/sc/`
files (docs/reproducing.md): Transformer 4 x 128, 4 heads, FFN x1, rotary positions, local
attention (window 4,000; O(L · window) kernel), max pooling, lr 1e-3, weight decay 0.05, batch 16,
200 epochs; S4 6 x 128, batch norm, max pooling, lr 0.01 (SSM 1e-3), cosine, batch 16, 40 epochs.
Masked SPT: 25% of the samples, L1 reconstruction. Sized for a v4-8 (4 clips per chip, each layer
rematerialised). Paper (section 3.7): S4 ~96-98% from scratch on raw audio; SPT narrows the
Transformer's gap.
"""

from sptlib.configs import common, presets

POSITIONAL = ("model", "regime")


def get_config(arg="s4,spt-masked"):
    a = common.parse_arg(arg, POSITIONAL)
    config = presets.build("speech_commands", a.get("model", "s4"),
                           a.get("regime", "spt-masked"), scale=float(a.get("scale", 1.0)))
    with config.unlocked():
        presets.add_compare(config, models=("transformer", "s4"),
                            regimes=("scratch", "spt-masked"), seeds=(0, 1, 2),
                            title="Speech Commands (paper sizes)")
    return config
