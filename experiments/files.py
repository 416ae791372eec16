r"""Your own data files, compared: scratch vs masked SPT for each model (docs/your_data.md).

    python -m sptlib.compare --config=experiments/files.py:train=data/train.parquet \
        --workdir=runs/mine [--models=transformer,s4d,my_pkg.mixers:MyMixer]

Task `files` (`sptlib.data.user_files`): the file paths and column names go in the argument,
`train=..[,validation=..][,test=..][,label=<column>][,inputs=<column>][,kind=tokens|text|
floats][,text_vocab=bytes|chars|<spm model>]`; missing validation / test splits are carved from
train. The input kind picks the model's encoder (token embedding, or a linear map of float
channels) and the masked target (tokens, or L1 on the normalised floats). Every model gets the
same width, depth, optimiser and budget (`sptlib.configs.cpu_sized.comparison`); a model name
may be the import path of your own mixer (`package.module:Class`, docs/api.md), which then
replaces the SSM block's mixer and takes the SSM learning rate for the parameters it marks.
Sizes take `--config.x=y` overrides as every config does.

    get_config("train=..[,...][,model=..][,regime=..][,steps=..][,pretrain_steps=..]
               [,d_model=..][,n_layers=..][,batch=..]")
"""

from sptlib.data import user_code
from sptlib.configs import common, cpu_sized
from sptlib.data import config as data_config, user_files
from sptlib.errors import DataError

POSITIONAL = ("model", "regime")
# `arg` key -> config.data.files field.
FILE_KEYS = {"train": "train", "validation": "validation", "test": "test", "label": "label_column",
             "inputs": "input_column", "kind": "kind", "text_vocab": "text_vocab",
             "format": "format"}


def get_config(arg=""):
    a = common.parse_arg(arg, POSITIONAL)
    files = data_config.data_config().files
    for key, field in FILE_KEYS.items():
        if key in a:
            files[field] = a[key]
    data = dict(task="files", input_type="tokens", max_length=int(a.get("max_length", 0)))
    if files.train:  # the input kind picks the encoder and the masked target
        probe = data_config.data_config()
        probe.task, probe.files = "files", files
        probe.max_length = data["max_length"]
        try:
            if user_files.infer(probe)["kind"] == "floats":
                data["input_type"] = "continuous"
        except DataError:
            pass  # bad files: the run's preflight reports them in one line, before anything

    model = a.get("model", "transformer")
    own = user_code.is_import_path(model)
    c = cpu_sized.comparison(
        "s4d" if own else model, a.get("regime", "spt-masked"), data=data, generate={},
        n_layers=int(a.get("n_layers", 2)), d_model=int(a.get("d_model", 64)),
        steps=int(a.get("steps", 200)), pretrain_steps=int(a.get("pretrain_steps", 200)),
        batch_size=int(a.get("batch", 32)), lr=2e-3, eval_every=int(a.get("eval_every", 50)),
        mask_rate=0.15, target="l1",
        compare=dict(models=("transformer", "s4d"), regimes=("scratch", "spt-masked"),
                     seeds=(0,), title=f"Your data: {files.train or '(no train file given)'}"))
    with c.unlocked():
        c.data.files.update(files.to_dict())
        if own:
            c.model.mixer, c.model.pattern = model, "uniform"
    c.lock()
    return c
