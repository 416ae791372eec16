"""Reserved token ids shared by every tokeniser, objective and encoder.

Every vocabulary in sptlib keeps `<pad>` and `<mask>` at fixed ids so that an embedding trained
during self-pretraining (where `<mask>` is used) transfers unchanged to finetuning.
"""

PAD_ID = 0  # padding; never attended to, never counted in a loss
MASK_ID = 1  # masked-denoising replacement token
NUM_SPECIAL = 2  # real tokens start at this id
