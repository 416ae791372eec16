"""SPT fidelity against a PyTorch implementation of the protocol, with matched randomness.

- `dump_randomness.py` (sptlib): writes everything random in an SPT → finetune run of sptlib
  to one `.npz`: initial parameters (under PyTorch's parameter names), the fresh finetuning
  head, every training batch, every pretraining mask and the validation masks, plus the
  validation and test sets.
- `torch_spt_paired.py` (PyTorch, optional): the same protocol in `torch.nn`
  (`TransformerEncoder`, `optim.AdamW`) fed that file, so both sides see identical draws.

Neither is imported by sptlib, its tests or CI. See docs/reproducing.md, "SPT fidelity vs a
PyTorch peer".
"""
