r"""Sequential CIFAR-10 (sCIFAR: RGB pixels as a 1,024-step sequence of 3 channels).

    get_config("<model>,<regime>[,scale=<f>]")   model / regime as in experiments/lra.py

    python -m sptlib.main --config=experiments/scifar.py:s4,spt-masked --workdir=W
    python -m sptlib.compare --config=experiments/scifar.py --workdir=W

Masked SPT: 50% of the pixels, L1 reconstruction of the normalised values (mask-indicator channel
appended). Settings follow the authors' released `configs/experiment/cifar/` files
(docs/reproducing.md): Transformer 6 x 256, 4 heads, FFN x2, rotary positions, lr 1e-3, weight
decay 0.05, batch 50, 200 epochs, constant schedule after 2,000 warmup steps; S4 6 x 512,
post-norm, dropout 0.1, lr 0.01, batch 50, 200 epochs (cosine to finetune, constant to pretrain).
Sized for a v4-8 (batch 50 split over 2 data shards x 2 tensor shards). Data: TFDS `cifar10`.
Paper (section 3.7): SPT also helps on sCIFAR; S4 from scratch reaches ~91% (S4 paper); compare
the SPT gain for Transformer and S4 with 3 seeds.
"""

from sptlib.configs import common, presets

POSITIONAL = ("model", "regime")


def get_config(arg="s4,spt-masked"):
    a = common.parse_arg(arg, POSITIONAL)
    config = presets.build("scifar", a.get("model", "s4"), a.get("regime", "spt-masked"),
                           scale=float(a.get("scale", 1.0)))
    with config.unlocked():
        presets.add_compare(config, models=("transformer", "s4"),
                            regimes=("scratch", "spt-masked"), seeds=(0, 1, 2),
                            title="sCIFAR (paper sizes)")
    return config
