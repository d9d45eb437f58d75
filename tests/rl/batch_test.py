"""RL batch packing: the generator log-probs the loss reads are always finite."""

import numpy as np

from jaxrl_scale.rl import batch as batch_lib


def test_nonfinite_generator_logprobs_are_packed_as_masked_zeros():
  logp = [[[-0.5, -np.inf, -0.2], [np.nan, -0.1]]]
  batch = batch_lib.pack_rl([[1, 2]], [[[5, 6, 7], [8, 9]]], logp, np.ones((1, 2)),
                            seq_len=6, trainable=[[[True, True, False], [True, True]]])
  assert np.all(np.isfinite(batch.gen_logp_PGS))
  np.testing.assert_array_equal(batch.loss_mask_PGS[0, 0], [0, 0, 1, 0, 0, 0])
  np.testing.assert_array_equal(batch.loss_mask_PGS[0, 1], [0, 0, 0, 1, 0, 0])
  np.testing.assert_allclose(batch.gen_logp_PGS[0, 0], [0, 0, -0.5, 0, -0.2, 0])
  np.testing.assert_allclose(batch.gen_logp_PGS[0, 1], [0, 0, 0, -0.1, 0, 0])
  np.testing.assert_array_equal(batch.input_mask_PGS[0, 1], [1, 1, 1, 1, 0, 0])
