"""Prompt text -> model input: the checkpoint's chat template when it has one, else plain.

The chat template comes from the tokenizer directory (tokenizer_config.json or
chat_template.jinja; see jaxrl_scale.models.tokenizer). Its rendered text already holds
BOS and the turn markers, so it is encoded without adding special tokens, exactly as
transformers' apply_chat_template(tokenize=True) does. The plain template is a format
string around the prompt, encoded with the tokenizer's own framing (e.g. Llama's BOS,
the byte tokenizer's <|bos|>).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from jaxrl_scale.errors import UserError
from jaxrl_scale.models import tokenizer as tokenizer_lib


@dataclasses.dataclass(frozen=True)
class PromptTemplate:
  """How a record's prompt becomes the text the policy continues.

  Attributes:
    use_chat_template: render with the tokenizer's chat template when it has one.
    plain_format: used otherwise; "{prompt}" marks where the prompt goes.
    system_prompt: a system message (chat) or a first paragraph (plain).
    template_kwargs: extra variables for the chat template, e.g. {"enable_thinking": False}.
  """

  use_chat_template: bool = True
  plain_format: str = "{prompt}"
  system_prompt: str | None = None
  template_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    if "{prompt}" not in self.plain_format:
      raise UserError(f"plain_format {self.plain_format!r} has no '{{prompt}}' placeholder")


def uses_chat_template(tokenizer: tokenizer_lib.Tokenizer, template: PromptTemplate) -> bool:
  """Whether `template` renders through the tokenizer's chat template."""
  return template.use_chat_template and tokenizer.chat_template is not None


def render(tokenizer: tokenizer_lib.Tokenizer, prompt: str, template: PromptTemplate) -> str:
  """The text the policy sees for `prompt` (before tokenization)."""
  if uses_chat_template(tokenizer, template):
    messages = [{"role": "user", "content": prompt}]
    if template.system_prompt is not None:
      messages.insert(0, {"role": "system", "content": template.system_prompt})
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                         **dict(template.template_kwargs))
  # str.replace, not str.format: a format with literal braces (LaTeX) must not break.
  text = template.plain_format.replace("{prompt}", prompt)
  if template.system_prompt is not None:
    text = f"{template.system_prompt}\n\n{text}"
  return text


def encode_rendered(tokenizer: tokenizer_lib.Tokenizer, texts: list[str],
                    template: PromptTemplate) -> list[list[int]]:
  """Token ids of rendered prompts; special tokens are added only for plain templates."""
  add_special = not uses_chat_template(tokenizer, template)
  batch = getattr(tokenizer, "encode_batch", None)
  if batch is not None:
    return batch(texts, add_special_tokens=add_special)
  return [tokenizer.encode(t, add_special_tokens=add_special) for t in texts]
