"""Policy losses: gradients against hand-written NumPy formulas and finite differences,
behaviour on hand-built tokens, masking, micro-batch composition, the registry."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_scale import config
from jaxrl_scale.errors import UserError
from jaxrl_scale.rl import aggregation
from jaxrl_scale.rl import losses

AGGREGATIONS = ["sample_avg", "prompt_avg", "token_avg"]


def random_batch(seed=0, P=4, G=3, T=6, ratio_scale=0.5):
  """Ragged completions, one filtered prompt, one empty completion, ratios on both sides of
  every clip (log-ratio ~ N(0, ratio_scale))."""
  rng = np.random.default_rng(seed)
  logp_train = rng.normal(-1.5, 0.7, (P, G, T)).astype(np.float32)
  logp_gen = (logp_train - rng.normal(0.0, ratio_scale, (P, G, T))).astype(np.float32)
  lengths = rng.integers(1, T + 1, (P, G))
  lengths[1, 2] = 0
  mask = (np.arange(T)[None, None, :] < lengths[..., None]).astype(np.float32)
  mask[0, 0, 0] = 0.0  # a forced-interruption token in the middle of a completion
  adv = rng.normal(0.0, 1.0, (P, G)).astype(np.float32)
  weight = np.ones((P, G), np.float32)
  weight[2] = 0.0  # zero-variance filtered prompt
  adv[2] = 0.0
  return logp_train, losses.LossBatch(logp_gen, adv, mask, weight)


# ---- Independent NumPy reference (float64) -------------------------------------------


def np_coef(mask, weight, agg):
  """Per-token coefficient and unit count of each aggregation, written from the paper."""
  mask = mask.astype(np.float64)
  length = mask.sum(-1)
  if agg == "token_avg":
    coef = mask * weight[..., None]
    return coef, coef.sum()
  if agg == "sample_avg":
    inv = np.divide(1.0, length, out=np.zeros_like(length), where=length > 0)
    return mask * (weight * inv)[..., None], float(np.sum(weight * (length > 0)))
  tokens = (weight * length).sum(-1)
  inv = np.divide(1.0, tokens, out=np.zeros_like(tokens), where=tokens > 0)
  return mask * weight[..., None] * inv[:, None, None], float(np.sum(tokens > 0))


def np_loss_and_grad(name, params, lt, batch, agg):
  """Value and d loss / d logp_train from hand-derived formulas."""
  lt = lt.astype(np.float64)
  lg = batch.logp_gen_PGT.astype(np.float64)
  mask = batch.mask_PGT.astype(np.float64)
  adv = batch.advantages_PG.astype(np.float64)
  coef, n = np_coef(mask, batch.weight_PG.astype(np.float64), agg)
  coef = coef / n
  rho = np.exp(lt - lg)
  A = adv[..., None]
  if name == "cispo":
    w = np.minimum(rho, params.eps_max)
    per_token, dper_token = -w * A * lt, -w * A
  elif name in ("grpo", "dapo"):
    lo, hi = 1 - params.clip_low, 1 + params.clip_high
    per_token = -np.minimum(rho * A, np.clip(rho, lo, hi) * A)
    active = ~(((A > 0) & (rho > hi)) | ((A < 0) & (rho < lo)))
    dper_token = -rho * A * active
  elif name == "reinforce":
    per_token, dper_token = -A * lt, -A * np.ones_like(lt)
  elif name == "gspo":
    length = np.maximum(mask.sum(-1), 1.0)
    log_s = (mask * (lt - lg)).sum(-1)
    dlog_s = mask  # d log s_i / d logp_{i,t}
    if params.length_norm:
      log_s, dlog_s = log_s / length, mask / length[..., None]
    s = np.exp(log_s)
    lo, hi = 1 - params.clip_low, 1 + params.clip_high
    loss_seq = -np.minimum(s * adv, np.clip(s, lo, hi) * adv)
    active = ~(((adv > 0) & (s > hi)) | ((adv < 0) & (s < lo)))
    c_seq = coef.sum(-1)  # the sequence loss sits at every token of the completion
    value = float(np.sum(c_seq * loss_seq))
    grad = c_seq[..., None] * (-adv * s * active)[..., None] * dlog_s
    return value, grad
  else:
    raise AssertionError(name)
  return float(np.sum(coef * per_token)), coef * dper_token


LOSS_CASES = [
    ("cispo", losses.CispoParams()),
    ("cispo", losses.CispoParams(eps_max=1.3)),  # truncation active on many tokens
    ("grpo", losses.ClipParams()),
    ("dapo", losses.DapoParams()),
    ("gspo", losses.GspoParams()),
    ("gspo", losses.GspoParams(clip_low=0.05, clip_high=0.1)),
    ("gspo", losses.GspoParams(clip_low=0.3, clip_high=0.5, length_norm=False)),
    ("reinforce", losses.NoParams()),
]


def case_id(case):
  name, params = case
  fields = ",".join(f"{k}={v}" for k, v in dataclasses.asdict(params).items())
  return f"{name}({fields})"


@pytest.mark.parametrize("name, params", LOSS_CASES, ids=map(case_id, LOSS_CASES))
def test_value_and_gradient_match_numpy(name, params):
  lt, batch = random_batch(seed=1)

  @jax.jit
  def all_aggregations(x):  # one compilation for the three aggregations
    return {agg: jax.value_and_grad(
        lambda y, agg=agg: losses.policy_loss(name, y, batch, params=params,
                                              aggregation=agg)[0])(x)
            for agg in AGGREGATIONS}

  got = all_aggregations(jnp.asarray(lt))
  for agg in AGGREGATIONS:
    value, grad = got[agg]
    want_value, want_grad = np_loss_and_grad(name, params, lt, batch, agg)
    np.testing.assert_allclose(value, want_value, rtol=1e-5, atol=1e-6, err_msg=agg)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-5, atol=1e-6, err_msg=agg)
    assert np.abs(want_grad).max() > 1e-3  # the comparison is not between two zeros


# CISPO is left out on purpose (see below); GSPO's default clip is left out because it
# clips nearly every sequence of this batch, leaving few nonzero derivatives to compare.
FD_CASES = [(n, p) for n, p in LOSS_CASES if n != "cispo" and p != losses.GspoParams()]


@pytest.mark.parametrize("name, params", FD_CASES, ids=map(case_id, FD_CASES))
def test_gradient_matches_float64_finite_differences(name, params):
  # CISPO's stop-gradient makes its gradient differ from the derivative of its value by
  # design; the NumPy test above covers it.
  lt, batch = random_batch(seed=2)
  agg = "sample_avg" if name == "gspo" else "prompt_avg"
  with jax.enable_x64(True):
    batch64 = jax.tree.map(lambda x: jnp.asarray(x, jnp.float64), batch)
    f = jax.jit(lambda x: losses.policy_loss(name, x, batch64, params=params,
                                             aggregation=agg)[0])
    x0 = jnp.asarray(lt, jnp.float64)
    grad = np.asarray(jax.grad(f)(x0))
    idx = [tuple(i) for i in np.argwhere(batch.mask_PGT * batch.weight_PG[..., None] > 0)]
    h = 1e-6
    for k in np.random.default_rng(0).choice(len(idx), 8, replace=False):
      e = np.zeros(lt.shape)
      e[idx[k]] = h
      fd = (float(f(x0 + e)) - float(f(x0 - e))) / (2 * h)
      np.testing.assert_allclose(grad[idx[k]], fd, rtol=1e-5, atol=1e-8)


# ---- Behaviour on hand-built tokens -----------------------------------------------------


def one_token_batch(log_ratio, adv):
  """[1, 2, 1]: two one-token completions with the given log-ratios and advantages."""
  lt = np.full((1, 2, 1), -1.0, np.float32)
  lg = lt - np.asarray(log_ratio, np.float32).reshape(1, 2, 1)
  return lt, losses.LossBatch(lg, np.asarray(adv, np.float32).reshape(1, 2),
                              np.ones((1, 2, 1), np.float32), np.ones((1, 2), np.float32))


def grad_and_diag(name, params, lt, batch, agg="token_avg"):
  """d loss / d logp_train (flat) and the diagnostics, from one compiled call."""
  loss = losses.make_policy_loss(name, params, agg)
  f = jax.jit(jax.grad(lambda x: loss(x, batch), has_aux=True))
  grad, diag = f(jnp.asarray(lt))
  return np.asarray(grad).reshape(-1), diag


def grad_of(name, params, lt, batch, agg="token_avg"):
  return grad_and_diag(name, params, lt, batch, agg)[0]


@pytest.mark.parametrize("name", losses.LOSSES.names())
def test_one_step_raises_positive_and_lowers_negative_advantage_tokens(name):
  # A tiny softmax policy over 3 tokens at each of 2 positions; completion 0 sampled
  # token 0 with advantage +1, completion 1 sampled token 1 with advantage -1, on-policy.
  logits = jnp.zeros((1, 2, 1, 3))
  tokens = jnp.array([0, 1]).reshape(1, 2, 1)

  def logp(lg):
    return jnp.take_along_axis(jax.nn.log_softmax(lg), tokens[..., None], -1)[..., 0]

  lg0 = jax.lax.stop_gradient(logp(logits))
  batch = losses.LossBatch(lg0, jnp.array([[1.0, -1.0]]), jnp.ones((1, 2, 1)), jnp.ones((1, 2)))
  loss_fn = losses.make_policy_loss(name, aggregation="token_avg")
  loss = jax.jit(lambda lg: loss_fn(logp(lg), batch)[0])
  new_logits = logits - 0.5 * jax.jit(jax.grad(loss))(logits)
  p0, p1 = np.exp(logp(logits)).reshape(-1), np.exp(logp(new_logits)).reshape(-1)
  assert p1[0] > p0[0] + 1e-3 and p1[1] < p0[1] - 1e-3
  if name != "cispo":  # CISPO's value is a gradient carrier, not a surrogate
    assert loss(new_logits) < loss(logits)


def test_cispo_keeps_gradient_above_the_cap_unlike_ppo_clip():
  # log-ratios 1 (rho 2.7) and 2 (rho 7.4 > eps_max 5), both advantage +1.
  lt, batch = one_token_batch([1.0, 2.0], [1.0, 1.0])
  g_cispo, diag = grad_and_diag("cispo", None, lt, batch)
  np.testing.assert_allclose(g_cispo, [-np.e / 2, -5.0 / 2], rtol=1e-5)  # token_avg over 2
  np.testing.assert_allclose(grad_of("grpo", None, lt, batch), [0.0, 0.0], atol=0)
  assert float(diag["clipped_frac"]) == pytest.approx(0.5)  # only rho 7.4 is truncated


def test_cispo_has_no_lower_clip():
  # rho = e^-3 with a negative advantage: the PPO clip (rho < 0.8) stops the gradient,
  # CISPO pushes the token further down with weight rho.
  lt, batch = one_token_batch([-3.0, -3.0], [-1.0, -1.0])
  g_cispo, diag_cispo = grad_and_diag("cispo", None, lt, batch)
  g_grpo, diag_grpo = grad_and_diag("grpo", None, lt, batch)
  np.testing.assert_allclose(g_cispo, [np.exp(-3.0) / 2] * 2, rtol=1e-5)
  np.testing.assert_allclose(g_grpo, [0.0, 0.0], atol=0)
  assert float(diag_cispo["clipped_frac"]) == 0.0 and float(diag_grpo["clipped_frac"]) == 1.0


def test_dapo_clips_higher_than_grpo_only_on_the_upper_side():
  up, neg = np.log(1.25), np.log(0.75)
  # rho 1.25 with A > 0: inside DAPO's 1.28, outside GRPO's 1.2.
  lt, batch = one_token_batch([up, up], [1.0, 1.0])
  assert np.all(grad_of("dapo", None, lt, batch) < 0)
  assert np.all(grad_of("grpo", None, lt, batch) == 0)
  assert np.all(grad_of("dapo", losses.DapoParams(clip_high=0.2), lt, batch) == 0)
  # rho 0.75 with A < 0: both lower bounds are 0.8, both clip.
  lt, batch = one_token_batch([neg, neg], [-1.0, -1.0])
  assert np.all(grad_of("dapo", None, lt, batch) == 0)
  assert np.all(grad_of("grpo", None, lt, batch) == 0)
  # rho 1.25 with A < 0 is never clipped (min picks the unclipped, larger penalty).
  lt, batch = one_token_batch([up, up], [-1.0, -1.0])
  np.testing.assert_allclose(grad_of("grpo", None, lt, batch), [1.25 / 2] * 2, rtol=1e-5)


def test_gspo_clips_whole_sequences_and_spreads_the_gradient_evenly():
  # Completion 0: token log-ratios +0.02, -0.01, +0.02 -> sequence log-ratio 0.01
  # (rho_seq 1.01 > 1.005, clipped for A > 0). Completion 1: log-ratios 0, 0, 0.003
  # -> rho_seq e^0.001, inside the clip: every token gets s * A / |y| / G.
  lt = np.full((1, 2, 3), -1.0, np.float32)
  log_ratio = np.array([[[0.02, -0.01, 0.02], [0.0, 0.0, 0.003]]], np.float32)
  batch = losses.LossBatch(lt - log_ratio, np.ones((1, 2), np.float32),
                           np.ones((1, 2, 3), np.float32), np.ones((1, 2), np.float32))
  g, diag = grad_and_diag("gspo", None, lt, batch, "sample_avg")
  g = g.reshape(2, 3)
  np.testing.assert_array_equal(g[0], 0.0)
  np.testing.assert_allclose(g[1], [-np.exp(0.001) / 3 / 2] * 3, rtol=1e-5)
  assert float(diag["clipped_frac"]) == pytest.approx(0.5)


def test_gspo_length_norm_option_uses_the_raw_sequence_ratio():
  lt = np.full((1, 1, 4), -1.0, np.float32)
  batch = losses.LossBatch(lt - 0.1, np.ones((1, 1), np.float32), np.ones((1, 1, 4), np.float32),
                           np.ones((1, 1), np.float32))
  wide = dict(clip_low=0.9, clip_high=10.0)
  for norm, s in [(True, np.exp(0.1)), (False, np.exp(0.4))]:
    params = losses.GspoParams(length_norm=norm, **wide)
    value, _ = losses.policy_loss("gspo", jnp.asarray(lt), batch, params=params,
                                  aggregation="sample_avg")
    assert float(value) == pytest.approx(-s, rel=1e-5)


# ---- Masks, weights, composition ----------------------------------------------------------


@pytest.mark.parametrize("name", losses.LOSSES.names())
def test_masked_positions_with_garbage_give_zero_gradient_and_no_nan(name):
  lt, batch = random_batch(seed=3)
  invalid = batch.mask_PGT == 0
  lt_bad = np.where(invalid, -np.inf, lt).astype(np.float32)
  lg_bad = np.where(invalid, np.nan, batch.logp_gen_PGT).astype(np.float32)
  bad = batch._replace(logp_gen_PGT=lg_bad)
  fn = losses.make_policy_loss(name, aggregation="prompt_avg")
  vg = jax.jit(jax.value_and_grad(lambda x, b: fn(x, b), has_aux=True))
  (value, diag), grad = vg(jnp.asarray(lt_bad), bad)
  (clean_value, clean_diag), clean_grad = vg(jnp.asarray(lt), batch)
  assert np.isfinite(value) and np.all(np.isfinite(grad))
  assert np.all(np.asarray(grad)[invalid] == 0)
  np.testing.assert_allclose(value, clean_value, rtol=1e-6)
  np.testing.assert_allclose(grad, clean_grad, rtol=1e-6)
  for k, v in diag.items():
    np.testing.assert_allclose(v, clean_diag[k], rtol=1e-6, err_msg=k)


def test_filtered_prompt_has_no_effect_on_loss_or_gradient():
  lt, batch = random_batch(seed=4)
  fn = losses.make_policy_loss("cispo", aggregation="prompt_avg")
  vg = jax.jit(jax.value_and_grad(lambda x, b: fn(x, b)[0]))
  lt2 = lt.copy()
  lt2[2] += 3.0  # prompt 2 has weight 0
  adv2 = batch.advantages_PG.copy()
  adv2[2] = 5.0
  v1, _ = vg(jnp.asarray(lt), batch)
  v2, g2 = vg(jnp.asarray(lt2), batch._replace(advantages_PG=adv2))
  assert float(v1) == pytest.approx(float(v2), rel=1e-6)
  np.testing.assert_array_equal(np.asarray(g2)[2], 0.0)


@pytest.mark.parametrize("name, agg", [("cispo", "sample_avg"), ("cispo", "prompt_avg"),
                                       ("cispo", "token_avg"), ("gspo", "prompt_avg")])
def test_micro_batches_sum_to_the_full_batch(name, agg):
  lt, batch = random_batch(seed=5, P=6)
  fn = losses.make_policy_loss(name, aggregation=agg)
  vg = jax.jit(jax.value_and_grad(lambda x, b, n: fn(x, b, n)[0]))
  units = lambda b: aggregation.denominator(agg, b.mask_PGT, b.weight_PG)
  full_v, full_g = vg(jnp.asarray(lt), batch, units(batch))
  vs, gs, local = [], [], 0.0
  for a, b in [(0, 2), (2, 6)]:
    micro = jax.tree.map(lambda x, a=a, b=b: x[a:b], batch)
    v, g = vg(jnp.asarray(lt[a:b]), micro, units(batch))
    vs.append(v)
    gs.append(g)
    local += float(vg(jnp.asarray(lt[a:b]), micro, units(micro))[0])
  np.testing.assert_allclose(sum(vs), full_v, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(np.concatenate(gs), full_g, rtol=1e-5, atol=1e-7)
  # The full batch's denominator is what makes it exact: micro-batch-local averages do
  # not add up to the full-batch loss.
  assert abs(local - float(full_v)) > 1e-3


def test_jit_matches_eager_and_diagnostics_are_scalars():
  lt, batch = random_batch(seed=6)
  fn = losses.make_policy_loss("cispo")
  eager = fn(jnp.asarray(lt), batch)
  jitted = jax.jit(fn)(jnp.asarray(lt), batch)
  np.testing.assert_allclose(eager[0], jitted[0], rtol=1e-6)
  assert set(eager[1]) == set(jitted[1])
  for k, v in jitted[1].items():
    assert v.shape == () and np.isfinite(v), k
    np.testing.assert_allclose(v, eager[1][k], rtol=1e-5, err_msg=k)


# ---- Registry and params ----------------------------------------------------------------


def test_unknown_loss_suggests_the_nearest_name():
  with pytest.raises(UserError, match=r"rl.loss: unknown loss 'cipso'; did you mean 'cispo'"):
    losses.get_loss("cipso")
  with pytest.raises(UserError, match="unknown aggregation 'prompt_average'.*'prompt_avg'"):
    losses.make_policy_loss("cispo", aggregation="prompt_average")


def test_make_params_overrides_and_errors():
  assert losses.make_params("cispo", {"eps_max": 4.0}) == losses.CispoParams(eps_max=4.0)
  assert losses.make_params("dapo") == losses.DapoParams(clip_low=0.2, clip_high=0.28)
  with pytest.raises(UserError, match=r"rl.loss_params.eps: not a parameter of loss 'cispo'"):
    losses.make_params("cispo", {"eps": 4.0})
  with pytest.raises(UserError, match=r"rl.loss_params.clip_low: must be in \[0, 1\), got 2"):
    losses.make_params("grpo", {"clip_low": 2})
  with pytest.raises(UserError, match="takes CispoParams, got ClipParams"):
    losses.make_policy_loss("cispo", losses.ClipParams())


def test_params_from_config():
  rl = config.Config().rl
  assert losses.params_from_config(rl) == losses.CispoParams(eps_max=rl.eps_max)
  assert losses.params_from_config(dataclasses.replace(rl, loss="grpo")) == losses.ClipParams(
      rl.clip_low, rl.clip_low)
  assert losses.params_from_config(dataclasses.replace(rl, loss="dapo")) == losses.DapoParams(
      rl.clip_low, rl.clip_high)
  gspo = losses.params_from_config(dataclasses.replace(rl, loss="gspo"))
  assert (gspo.clip_low, gspo.clip_high) == (rl.gspo_clip_low, rl.gspo_clip_high)
  with pytest.raises(UserError, match=r"rl.clip_high: must be >= 0, got -1.0 \(loss 'dapo'\)"):
    losses.params_from_config(dataclasses.replace(rl, loss="dapo", clip_high=-1.0))


@dataclasses.dataclass(frozen=True)
class _ScaledParams:
  scale: float = 2.0


def test_a_fork_registers_its_own_loss():
  name = "test_scaled_reinforce"
  if name not in losses.LOSSES:

    @losses.register_loss(name, _ScaledParams)
    def _scaled(logp_train_PGT, logp_gen_PGT, advantages_PG, mask_PGT, params):
      out = losses.reinforce(logp_train_PGT, logp_gen_PGT, advantages_PG, mask_PGT,
                             losses.NoParams())
      return out._replace(loss_PGT=params.scale * out.loss_PGT)

  lt, batch = random_batch(seed=7)
  base = losses.policy_loss("reinforce", jnp.asarray(lt), batch)[0]
  mine = losses.policy_loss(name, jnp.asarray(lt), batch, params=_ScaledParams(3.0))[0]
  assert float(mine) == pytest.approx(3.0 * float(base), rel=1e-6)
  with pytest.raises(ValueError, match="already registered"):
    losses.register_loss(name)(lambda *a: None)


@pytest.mark.parametrize("bad", [-np.inf, np.nan, np.inf])
@pytest.mark.parametrize("name", losses.LOSSES.names())
def test_a_non_finite_generator_logprob_gets_no_weight_not_the_cap(name, bad):
  # A token whose recorded log-prob is -inf has no ratio; CISPO used to read it as
  # rho = exp(+inf), i.e. the maximum IS weight eps_max; NaN made the whole loss NaN.
  lt, batch = random_batch(seed=5)
  p, g, t = 0, 1, 0
  assert batch.mask_PGT[p, g, t] == 1 and batch.weight_PG[p, g] == 1
  lg_bad = batch.logp_gen_PGT.copy()
  lg_bad[p, g, t] = bad
  mask_out = batch.mask_PGT.copy()
  mask_out[p, g, t] = 0.0
  fn = losses.make_policy_loss(name, aggregation="prompt_avg")
  vg = jax.jit(jax.value_and_grad(lambda x, b: fn(x, b), has_aux=True))
  (value, diag), grad = vg(jnp.asarray(lt), batch._replace(logp_gen_PGT=lg_bad))
  (want, want_diag), want_grad = vg(jnp.asarray(lt), batch._replace(mask_PGT=mask_out))
  assert np.isfinite(value) and np.all(np.isfinite(grad))
  assert float(grad[p, g, t]) == 0.0
  np.testing.assert_allclose(value, want, rtol=1e-6)
  np.testing.assert_allclose(grad, want_grad, rtol=1e-6, atol=1e-9)
  for k, v in diag.items():  # the ratio diagnostics leave the token out too (no inf ratio_max)
    np.testing.assert_allclose(v, want_diag[k], rtol=1e-6, err_msg=k)
