"""Host-side records: stop-string scanning across chunks, completion assembly, seeds."""

import numpy as np

from jaxrl_scale.generation import records
from jaxrl_scale.models import tokenizer as tokenizer_lib

_TOK = tokenizer_lib.ByteTokenizer()


def _ids(text):
  return _TOK.encode(text)


def _scan_in_chunks(stops, ids, chunk):
  """first_stop fed chunk by chunk, as the sampler does."""
  scanner = records.StopStrings(stops, _TOK.decode)
  for start in range(0, len(ids), chunk):
    hit = scanner.first_stop(ids[:start + chunk], start)
    if hit is not None:
      return hit
  return None


def test_stop_string_found_at_the_completing_token_across_chunks():
  ids = _ids("The answer is 42.\n\nUser: next")
  want = len("The answer is 42.\n\nUser") - 1  # the 'r' completing "User"
  for chunk in (1, 3, 4, 8, 100):
    assert _scan_in_chunks(["User"], ids, chunk) == want
  # The earliest completion wins among several stop strings.
  assert _scan_in_chunks(["next", "\n\n"], ids, 4) == len("The answer is 42.\n\n") - 1
  assert _scan_in_chunks(["absent"], ids, 4) is None
  assert not records.StopStrings([], _TOK.decode)


def test_stop_string_spanning_a_multibyte_character():
  ids = _ids("costs 5€ now")
  want = len("costs 5€".encode("utf-8")) - 1  # the euro sign is 3 byte tokens
  assert _scan_in_chunks(["5€"], ids, 2) == want
  # A match that lies entirely in earlier text is not reported again.
  scanner = records.StopStrings(["costs"], _TOK.decode)
  assert scanner.first_stop(ids, 8) is None


def test_token_buffer_finish_builds_numpy_completion():
  req = records.Request([1, 2, 3], prompt_id="p7", sample_index=2)
  buf = records.TokenBuffer(req, seed=11, force_at=1, limit=4)
  buf.extend([65, 66], [-0.5, -1.0], [False, True], version=3)
  buf.extend([67, 68], [-0.25, -2.0], [True, False], version=4)
  buf.truncate(3)
  out = buf.finish(records.LENGTH, _TOK.decode)
  assert out.prompt_id == "p7" and out.sample_index == 2
  assert out.tokens.dtype == np.int32 and out.tokens.tolist() == [65, 66, 67]
  assert out.logprobs.dtype == np.float32 and out.logprobs.tolist() == [-0.5, -1.0, -0.25]
  assert out.versions.tolist() == [3, 3, 4]
  assert out.forced.tolist() == [False, True, True]
  assert out.finish_reason == records.INTERRUPTED and out.truncated
  assert out.text == "ABC" and out.num_tokens == 3 and buf.done
  plain = records.TokenBuffer(req, seed=1, force_at=0, limit=4)
  plain.extend([258], [-0.1], [False], version=0)
  done = plain.finish(records.EOS, None)
  assert done.finish_reason == records.EOS and not done.truncated and done.text is None


def test_sequence_seed_is_stable_and_distinct():
  a = records.sequence_seed(0, "prompt-1", 0)
  assert a == records.sequence_seed(0, "prompt-1", 0)
  others = {records.sequence_seed(0, "prompt-1", 1), records.sequence_seed(1, "prompt-1", 0),
            records.sequence_seed(0, "prompt-2", 0), records.sequence_seed(0, 1, 0)}
  assert a not in others and len(others) == 4
  assert 0 <= a < 2**31
