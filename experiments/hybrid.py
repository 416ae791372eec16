r"""A free hybrid stack and Hyena beside the Transformer and S4D, with the state-size column.

    python -m sptlib.compare --config=experiments/hybrid.py --workdir=runs/hybrid

Task: generated Lines gratings (`sptlib.data.orientation`, style `gratings`), 8 x 8 images read
as L = 64 continuous intensities, noise 0.25, 4 classes (as `experiments/quickstart.py`), 2,000
training images, 500 validation and 500 test images. Models, 2 layers, d = 32, trained from
scratch for STEPS steps (batch 32, AdamW 2e-3 cosine; SSM parameters lr 1e-3, no decay), 1 seed:

- ``transformer``, ``s4d``: the zoo's recipes;
- ``s4d-attention``: the free hybrid stack `config.model.layers = "s4d,attention"` (an S4D block,
  then an attention block; the S4D recipe's sizes, no encoder positions: the S4D layer gives the
  attention layer its order);
- ``hyena``: `config.model.mixer = "hyena"` (sptlib.layers.hyena) in the S4D recipe's blocks.

It checks the plumbing of hybrid stacks, Hyena and the state accounting in a real comparison
(comparison.md's compute table shows parameters, state per sequence at L = 64 and training
FLOPs), not a verdict: one seed and 300 steps. Its table is in docs/reproducing.md.

    get_config("[model,regime][,steps=<steps>]")
"""

from sptlib.configs import common, cpu_sized

POSITIONAL = ("model", "regime")
STEPS = 300
# The model names beyond the zoo's presets: (preset whose recipe it takes, config.model changes).
EXTRA = {"s4d-attention": ("s4d", {"layers": "s4d,attention"}),
         "hyena": ("s4d", {"mixer": "hyena"})}


def get_config(arg=""):
    a = common.parse_arg(arg, POSITIONAL)
    model = a.get("model", "s4d-attention")
    preset, changes = EXTRA.get(model, (model, {}))
    steps = int(a.get("steps", STEPS))
    c = cpu_sized.lines(
        preset, a.get("regime", "scratch"), resolution=8, num_train=2000, num_eval=500,
        n_layers=2, d_model=32, n_heads=2, steps=steps, pretrain_steps=steps, batch_size=32,
        lr=2e-3, eval_every=100, target="l1", noise=0.25, style="gratings",
        compare=dict(models=("transformer", "s4d", "s4d-attention", "hyena"),
                     regimes=("scratch",), seeds=(0,),
                     title="Hybrid stack and Hyena: Lines gratings 8x8 (L=64), scratch"))
    with c.unlocked():
        c.model.update(changes)
        c.model.hyena.update(filter_order=32, emb_dim=9)
    return c
