"""Environment messages as chat-template deltas: the ids to append after a model turn.

The episode is kept as token ids end to end: the prompt's ids, then each model turn's
ids as sampled, then the environment's ids. Nothing is tokenized twice. What the
environment appends after a turn is the text the chat template writes after an assistant
message when `messages` follow it, up to and including the generation prompt of the next
assistant turn:

  delta = render([user, assistant(X), *messages], generation prompt)  after X,
          less the model's end-of-turn token when the template writes it there

rendered with placeholder user and assistant contents (never the history, which the
sampler already holds as ids) and tokenized on its own. With ChatML, after a turn that
ended on <|im_end|>:

  "\n<|im_start|>tool\n{output}<|im_end|>\n<|im_start|>assistant\n"

and after a turn cut by a stop string (no end token), the same with "<|im_end|>" first.
So the episode's ids equal the template's rendering of the whole conversation whenever
the template renders earlier turns as they were (templates that rewrite the history,
such as Qwen3 dropping past thinking, differ in the history only: the ids are what the
policy saw). A tokenizer without a chat template uses the plain format
(models/tokenizer.py `render_plain`), where the model's end token stays in its turn.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from jaxrl_scale.errors import UserError
from jaxrl_scale.models import tokenizer as tokenizer_lib

# Placeholders no template writes by itself; only the text after the assistant's is used.
_USER = "ENVSUSERPLACEHOLDER7C1E"
_ASSISTANT = "ENVSASSISTANTPLACEHOLDER7C1E"
_ZWSP = "\u200b"


class ChatDelta:
  """Renders environment messages as the ids to append after a model turn.

  Args:
    tokenizer: the policy's tokenizer (its chat template, or the plain format).
    end_ids: ids that end a model turn as the template's end-of-turn marker;
      default the tokenizer's eos_ids.
    template_kwargs: extra chat-template variables (e.g. enable_thinking=False).
  """

  def __init__(self, tokenizer: tokenizer_lib.Tokenizer, *,
               end_ids: Sequence[int] | None = None,
               template_kwargs: Mapping[str, Any] | None = None):
    self.tokenizer = tokenizer
    self.end_ids = frozenset(int(i) for i in (tokenizer.eos_ids if end_ids is None
                                               else end_ids))
    self.template_kwargs = dict(template_kwargs or {})
    self._specials: dict[int, bool] = {}

  def text(self, messages: Sequence[Mapping[str, Any]]) -> str:
    """The template's text after an assistant message's content when `messages` follow
    it, through the next generation prompt (UserError when the template cannot)."""
    convo = [{"role": "user", "content": _USER}, {"role": "assistant", "content": _ASSISTANT},
             *messages]
    full = self.tokenizer.apply_chat_template(convo, add_generation_prompt=True,
                                              **self.template_kwargs)
    at = full.find(_ASSISTANT)
    if at < 0:
      raise UserError("chat template: an assistant message's content does not appear in "
                      "its rendering, so environment turns cannot be appended")
    return full[at + len(_ASSISTANT):]

  def delta(self, turn_tokens: Sequence[int], messages: Sequence[Mapping[str, Any]]
            ) -> list[int]:
    """The ids to append after a model turn (`turn_tokens`, as sampled) for `messages`."""
    after = self.text(messages)
    if len(turn_tokens) and int(turn_tokens[-1]) in self.end_ids:
      # The model wrote the template's end-of-turn marker itself: append what follows it.
      end = self.tokenizer.decode([int(turn_tokens[-1])])
      if end and after.startswith(end):
        after = after[len(end):]
    return [int(i) for i in self.tokenizer.encode(after, add_special_tokens=False)]

  def check(self, role: str) -> None:
    """Raises UserError now when the template cannot render a `role` message (a role it
    does not know), rather than on the sampler's environment threads later."""
    try:
      self.text([{"role": role, "content": "x"}])
    except UserError as e:
      raise UserError(f"environment messages with role {role!r}: {e}") from None

  def plain(self, text: str) -> str:
    """`text` with every special-token string broken by a zero-width space, so tool
    output or feedback cannot write turn markers (<|im_start|>, EOS) of its own."""
    for _ in range(4):  # breaking one marker cannot make another; a bound all the same
      found = {self.tokenizer.decode([i]) for i in self.tokenizer.encode(text)
               if self._special(i)}
      found.discard("")
      if not found:
        return text
      for marker in found:
        text = text.replace(marker, marker[:1] + _ZWSP + marker[1:])
    return text

  def _special(self, token_id: int) -> bool:
    # Skipped by decode(skip_special_tokens=True): a control token, not text.
    if token_id not in self._specials:
      self._specials[token_id] = (
          self.tokenizer.decode([token_id], skip_special_tokens=True) == ""
          and self.tokenizer.decode([token_id]) != "")
    return self._specials[token_id]
