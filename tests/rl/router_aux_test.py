"""The MoE load-balancing loss in the train step: `optim.router_aux_loss_coef` (null = the
model's own) adds coef x the router's balance term to the policy loss, with its gradient into
the router, and the step logs the term (`load_balancing_loss`) whether or not it is added."""

import dataclasses

import jax
import numpy as np
import pytest

from jaxrl_scale import config
from jaxrl_scale.parallel import mesh as mesh_lib
from jaxrl_scale.rl import train_step
from tests.models import moe_train_test as moe_setup


def _trainer(coef, model_coef=0.0):
  cfg = dataclasses.replace(moe_setup.CFG, router_aux_loss_coef=model_coef)
  mesh = mesh_lib.single_device_mesh()
  old = moe_setup.CFG
  moe_setup.CFG = cfg  # _model builds moe_setup.CFG
  try:
    model = moe_setup._model(mesh)  # pylint: disable=protected-access
  finally:
    moe_setup.CFG = old
  opt = config.OptimConfig(lr=1e-3, warmup_steps=0, router_aux_loss_coef=coef)
  return train_step.Trainer(model, mesh, opt,
                            train_step.RLObjective(config.RLConfig(), temperature=1.0),
                            micro_batches=2, compiler_options=moe_setup.FAST_COMPILE)


def _balance_by_hand(trainer, batch):
  """The mean over the 2 micro-batches of E * sum_e f_e P_e, from the router's own
  probabilities recomputed here in NumPy (float64) from the sparse layer's input."""
  model = trainer.model()
  tokens, positions, mask = trainer.objective.model_inputs(batch)
  rows = lambda x: np.asarray(x).reshape(-1, x.shape[-1])
  tokens, positions, mask = rows(tokens), rows(positions), rows(mask)
  e, k = moe_setup.CFG.num_experts, moe_setup.CFG.experts_per_token
  router = np.asarray(model.layers.moe.router[...], np.float64)[1]  # layer 1 is sparse
  values = []
  for half in (slice(0, None, 2), slice(1, None, 2)):  # prompt i is in micro-batch i % 2
    # The sparse layer's input: rerun the model and capture it.
    p_rows = np.arange(tokens.shape[0]).reshape(moe_setup.P, moe_setup.G)[half].ravel()
    h = np.asarray(_sparse_input(model, tokens[p_rows], positions[p_rows], mask[p_rows]),
                   np.float64)
    real = np.asarray(mask[p_rows]).ravel().astype(bool)
    logits = h.reshape(-1, h.shape[-1])[real] @ router
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    top = np.argsort(-probs, axis=-1)[:, :k]
    chosen = np.bincount(top.ravel(), minlength=e) / real.sum()
    values.append(e * np.sum(chosen * probs.mean(0)))
  return float(np.mean(values))


def _sparse_input(model, tokens, positions, mask):
  """The hidden state entering layer 1's router, captured from the running model (a host
  callback: the layers run inside a scan)."""
  from jaxrl_scale.models import moe  # pylint: disable=g-import-not-at-top
  seen = []
  real_scores = moe.MoE.scores

  def scores(self, x_ND):
    jax.debug.callback(lambda v: seen.append(np.asarray(v)), x_ND)
    return real_scores(self, x_ND)

  moe.MoE.scores = scores
  try:
    jax.block_until_ready(model.hidden_states_with_stats(tokens, positions, mask))
  finally:
    moe.MoE.scores = real_scores
  assert len(seen) == 1, len(seen)  # one sparse layer
  return seen[0]


@pytest.mark.parametrize("coef,model_coef,expect", [(None, 0.0, 0.0), (None, 0.05, 0.05),
                                                     (0.05, 0.0, 0.05), (0.0, 0.05, 0.0)])
def test_the_coefficient_defaults_to_the_models_own(coef, model_coef, expect):
  assert _trainer(coef, model_coef).router_aux_coef == expect


def test_the_balance_term_is_logged_added_and_differentiated():
  batch = moe_setup._batch(3)  # pylint: disable=protected-access
  off, on = _trainer(0.0), _trainer(0.5)
  lb = _balance_by_hand(off, batch)
  loss_off, grads_off = off.loss_and_grads(batch)
  loss_on, grads_on = on.loss_and_grads(batch)
  np.testing.assert_allclose(float(loss_on) - float(loss_off), 0.5 * lb, rtol=1e-4)
  router = lambda g: np.asarray(g["layers"]["moe"]["router"][...])[1]
  assert np.abs(router(grads_on) - router(grads_off)).max() > 1e-4
  # The experts' gradients do not see the term (f_e carries no gradient, P_e is the router's).
  gate = lambda g: np.asarray(g["layers"]["moe"]["gate_proj"][...])
  np.testing.assert_allclose(gate(grads_on), gate(grads_off), atol=1e-6)
  logged = jax.device_get(off.step(batch))["load_balancing_loss"]
  np.testing.assert_allclose(logged, lb, rtol=1e-4)
  assert lb >= moe_setup.CFG.experts_per_token * 0.999  # its minimum is perfect balance
