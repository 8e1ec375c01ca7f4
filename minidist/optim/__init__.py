"""Optimizers, gradient clipping and learning-rate schedules.

- ``Optimizer``: param groups and per-parameter state, as in PyTorch (optimizer.py)
- ``SGD`` (sgd.py), ``Adam`` / ``AdamW`` (adam.py), ``LAMB`` (lamb.py), ``LARS`` (lars.py):
  each file states its update rule and keeps the arithmetic in a plain function
  over arrays (``sgd_update``, ``adam_update``, ...) that ZeRO reuses on shards
- ``Muon`` (muon.py): momentum, then the Newton-Schulz iteration on each whole matrix;
  ``muon_param_groups`` splits a model between Muon and AdamW
- ``clip_grad_norm_`` and its two halves for sharded gradients (clip.py)
- ``warmup_cosine``, ``LambdaLR``, ``WarmupCosine`` and the batch-size scaling
  rules (schedules.py)
"""
from minidist.optim.adam import Adam, AdamW, adam_direction, adam_update, adamw_update
from minidist.optim.clip import (clip_grad_norm_, clip_grads_with_norm_, grad_norm,
                                 grad_norm_share, grad_sq_sum, norm_from_share,
                                 total_grad_share, total_grad_norm, whole_norm)
from minidist.optim.lamb import LAMB, lamb_update, trust_ratio
from minidist.optim.lars import LARS, lars_update
from minidist.optim.muon import Muon, muon_param_groups, muon_update, newton_schulz
from minidist.optim.optimizer import Optimizer
from minidist.optim.schedules import (LambdaLR, LRScheduler, WarmupCosine, linear_scaled_lr,
                                      sqrt_scaled_lr, warmup_cosine, warmup_steps_for)
from minidist.optim.sgd import SGD, sgd_update

__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "LAMB", "LARS", "Muon",
           "muon_param_groups", "muon_update", "newton_schulz",
           "sgd_update", "adam_update", "adamw_update", "adam_direction", "lamb_update",
           "lars_update", "trust_ratio",
           "clip_grad_norm_", "clip_grads_with_norm_", "grad_norm", "grad_sq_sum",
           "grad_norm_share", "norm_from_share", "total_grad_share", "total_grad_norm",
           "whole_norm",
           "LRScheduler", "LambdaLR", "WarmupCosine", "warmup_cosine",
           "linear_scaled_lr", "sqrt_scaled_lr", "warmup_steps_for"]
