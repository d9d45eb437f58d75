"""Tokenizers: a built-in byte tokenizer for CPU tasks and Hugging Face `tokenizers` files.

Both implement the `Tokenizer` protocol, so the data layer, the sampler and the SFT warm
start never ask which one they hold. `load_tokenizer("byte")` gives the byte tokenizer;
`load_tokenizer(DIR)` reads DIR/tokenizer.json with DIR/tokenizer_config.json (special
tokens, chat template), DIR/chat_template.jinja and DIR/generation_config.json (extra
end-of-sequence ids, e.g. Llama 3.1's <|eom_id|> and <|eot_id|>).

Chat templates are untrusted code from the Hub. They are rendered the way `transformers`
renders them (a jinja2 ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks,
`tojson`, `raise_exception`, `strftime_now`, loop controls and the `{% generation %}` tag),
so the rendered text matches `AutoTokenizer.apply_chat_template` byte for byte.
"""

from __future__ import annotations

import datetime
import json
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from jaxrl_scale.errors import UserError

Message = Mapping[str, Any]


@runtime_checkable
class Tokenizer(Protocol):
  """What the rest of jaxrl_scale needs from a tokenizer."""

  vocab_size: int
  bos_id: int | None  # None when the model has no beginning-of-sequence token (Qwen)
  eos_id: int  # the end-of-sequence token the SFT targets end with
  eos_ids: tuple[int, ...]  # every id that stops generation (eos_id first)
  pad_id: int
  chat_template: str | None

  def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
    """Token ids of `text`; with add_special_tokens, the tokenizer's BOS/EOS framing."""
    ...

  def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
    """Text of `ids`."""
    ...

  def token_to_id(self, token: str) -> int | None:
    """Id of a single vocabulary entry, or None."""
    ...

  def apply_chat_template(
      self, messages: str | Sequence[Message], *, add_generation_prompt: bool = True,
      tokenize: bool = False, **template_kwargs: Any) -> str | list[int]:
    """Renders a conversation (a bare string is one user message) for generation."""
    ...


def render_plain(messages: str | Sequence[Message], add_generation_prompt: bool = True) -> str:
  """The template used when a tokenizer has no chat template.

  A single user message renders as its content verbatim, so built-in prompts such as
  "12+34=" reach a byte-level model unchanged. Longer conversations render as
  "Role: content" blocks separated by blank lines, ending with "Assistant:" when
  `add_generation_prompt`.
  """
  messages = _as_messages(messages)
  if len(messages) == 1 and messages[0].get("role") == "user":
    return str(messages[0].get("content", ""))
  blocks = [f"{str(m.get('role', 'user')).capitalize()}: {m.get('content', '')}" for m in messages]
  if add_generation_prompt:
    blocks.append("Assistant:")
  return "\n\n".join(blocks)


def _as_messages(messages: str | Sequence[Message]) -> list[Message]:
  if isinstance(messages, str):
    return [{"role": "user", "content": messages}]
  return list(messages)


# ----------------------------------------------------------------------------------------
# Built-in byte tokenizer.


class ByteTokenizer:
  """UTF-8 bytes 0..255 plus five special tokens; no files, no training.

  Ids: bytes 0..255, <|pad|> 256, <|bos|> 257, <|eos|> 258, <think> 259, </think> 260.
  vocab_size is 264: ids 261..263 are never produced; they round the embedding table up to
  a multiple of 8 so its rows shard evenly, and decode to "". The think markers are single
  tokens so that the forced-interruption phrase ("... </think>") is cheap for a tiny model;
  like Qwen3's, they are not "special" (skip_special_tokens keeps them).
  """

  PAD, BOS, EOS, THINK, END_THINK = 256, 257, 258, 259, 260
  SPECIAL_TOKENS = {"<|pad|>": PAD, "<|bos|>": BOS, "<|eos|>": EOS,
                    "<think>": THINK, "</think>": END_THINK}
  _SKIPPABLE = frozenset({PAD, BOS, EOS})

  vocab_size = 264
  bos_id = BOS
  eos_id = EOS
  eos_ids = (EOS,)
  pad_id = PAD
  chat_template = None

  def __init__(self):
    self._id_to_token = {i: t for t, i in self.SPECIAL_TOKENS.items()}
    pattern = "|".join(re.escape(t) for t in sorted(self.SPECIAL_TOKENS, key=len, reverse=True))
    self._special_re = re.compile(f"({pattern})")

  def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
    """Bytes of `text`, special-token strings as their single ids; BOS first if asked."""
    ids = [self.BOS] if add_special_tokens else []
    for piece in self._special_re.split(text):
      if piece in self.SPECIAL_TOKENS:
        ids.append(self.SPECIAL_TOKENS[piece])
      elif piece:
        ids.extend(piece.encode("utf-8"))
    return ids

  def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
    """Text of `ids`; invalid UTF-8 (a sampled partial character) becomes U+FFFD.

    Decodes as the Hugging Face files of `write_hf_files` do: a token that is skipped (or
    an unused id) leaves no mark, so the bytes on either side decode together.
    """
    out: list[str] = []
    buf = bytearray()
    for i in ids:
      i = int(i)
      if 0 <= i < 256:
        buf.append(i)
        continue
      if i not in self._id_to_token or (skip_special_tokens and i in self._SKIPPABLE):
        continue  # as tokenizers' decode: the bytes on either side join
      if buf:
        out.append(buf.decode("utf-8", errors="replace"))
        buf.clear()
      out.append(self._id_to_token[i])
    if buf:
      out.append(buf.decode("utf-8", errors="replace"))
    return "".join(out)

  def token_to_id(self, token: str) -> int | None:
    """Id of a special-token string or of a one-byte string."""
    if token in self.SPECIAL_TOKENS:
      return self.SPECIAL_TOKENS[token]
    raw = token.encode("utf-8")
    return raw[0] if len(raw) == 1 else None

  def apply_chat_template(
      self, messages: str | Sequence[Message], *, add_generation_prompt: bool = True,
      tokenize: bool = False, **template_kwargs: Any) -> str | list[int]:
    """Plain template (`render_plain`); the byte tokenizer has no chat template."""
    del template_kwargs  # nothing to fill in a plain template
    text = render_plain(messages, add_generation_prompt)
    return self.encode(text, add_special_tokens=True) if tokenize else text

  def write_hf_files(self, directory: str) -> None:
    """Writes this tokenizer as Hugging Face files that encode and decode as it does.

    tokenizer.json is a byte-level BPE without merges whose ids 0..255 are the bytes
    themselves, the five special tokens at their ids and a post-processor that puts
    <|bos|> first (add_special_tokens); tokenizer_config.json names bos/eos/pad and
    generation_config.json the ids transformers' generate stops and pads with. Read back by
    `load_tokenizer(directory)` or `transformers.AutoTokenizer`. Ids 261..263, which this
    tokenizer decodes to "", are not in the file (a decoder skips unknown ids).
    """
    import tokenizers  # pylint: disable=g-import-not-at-top

    tok = tokenizers.Tokenizer(tokenizers.models.BPE(vocab=byte_level_vocab(), merges=[]))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False,
                                                            use_regex=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    # Ids follow the order added: 256.. as SPECIAL_TOKENS lists them.
    for token, token_id in sorted(self.SPECIAL_TOKENS.items(), key=lambda kv: kv[1]):
      special = token_id in self._SKIPPABLE
      added = tokenizers.AddedToken(token, special=special, normalized=False)
      count = (tok.add_special_tokens if special else tok.add_tokens)([added])
      if count != 1 or tok.token_to_id(token) != token_id:
        raise AssertionError(f"{token} did not get id {token_id}")  # a tokenizers change
    tok.post_processor = tokenizers.processors.TemplateProcessing(
        single="<|bos|> $A", pair="<|bos|> $A $B", special_tokens=[("<|bos|>", self.BOS)])
    os.makedirs(directory, exist_ok=True)
    tok.save(os.path.join(directory, "tokenizer.json"))
    files = {
        "tokenizer_config.json": {
            "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|bos|>",
            "eos_token": "<|eos|>", "pad_token": "<|pad|>", "add_bos_token": True,
            "clean_up_tokenization_spaces": False, "model_max_length": 1 << 30},
        "generation_config.json": {"bos_token_id": self.BOS, "eos_token_id": self.EOS,
                                   "pad_token_id": self.PAD},
    }
    for name, content in files.items():
      with open(os.path.join(directory, name), "w", encoding="utf-8") as f:
        json.dump(content, f, indent=2)


def byte_level_vocab() -> dict[str, int]:
  """Byte-level BPE's character for each byte -> the byte's value.

  The `tokenizers` ByteLevel alphabet (GPT-2's) writes each printable byte as itself and
  the others (controls, space, 127..160, 173) as characters from U+0100 up, in byte order.
  """
  from tokenizers import pre_tokenizers  # pylint: disable=g-import-not-at-top

  alphabet = sorted(pre_tokenizers.ByteLevel.alphabet(), key=ord)
  printable = [c for c in alphabet if ord(c) < 256]
  shifted = iter(c for c in alphabet if ord(c) >= 256)
  own = {ord(c) for c in printable}
  return {(chr(b) if b in own else next(shifted)): b for b in range(256)}


# ----------------------------------------------------------------------------------------
# Hugging Face tokenizer.json (+ tokenizer_config.json).


def _read_json(path: str) -> dict:
  try:
    with open(path, encoding="utf-8") as f:
      data = json.load(f)
  except (OSError, UnicodeDecodeError) as e:
    raise UserError(f"{path}: cannot read ({e.__class__.__name__}: {e})") from None
  except json.JSONDecodeError as e:
    raise UserError(f"{path}: invalid JSON at line {e.lineno} column {e.colno}: {e.msg}") from None
  if not isinstance(data, dict):
    raise UserError(f"{path}: expected a JSON object, got {type(data).__name__}")
  return data


def _token_content(value: Any) -> str | None:
  # tokenizer_config.json stores special tokens as strings or as serialised AddedTokens.
  if value is None or isinstance(value, str):
    return value
  if isinstance(value, dict) and isinstance(value.get("content"), str):
    return value["content"]
  return None


class HFTokenizer:
  """A Hugging Face fast tokenizer read with the `tokenizers` library (no transformers).

  decode() returns the `tokenizers` decode without transformers' optional
  clean_up_tokenization_spaces pass (which transformers itself skips for BPE models).
  When the config names no pad token, pad_id is eos_id: padding is always masked.
  """

  def __init__(self, directory: str, tokenizer_file: str | None = None):
    import tokenizers  # pylint: disable=g-import-not-at-top

    self.directory = directory
    self.tokenizer_file = tokenizer_file or os.path.join(directory, "tokenizer.json")
    try:
      self._tok = tokenizers.Tokenizer.from_file(self.tokenizer_file)
    except Exception as e:  # tokenizers raises a bare Exception on malformed files
      raise UserError(f"{self.tokenizer_file}: not a readable tokenizer.json "
                      f"({str(e).splitlines()[0] if str(e) else e.__class__.__name__})") from None
    config_path = os.path.join(directory, "tokenizer_config.json")
    self.config = _read_json(config_path) if os.path.exists(config_path) else {}
    self._config_path = config_path
    self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
    self.special_tokens: dict[str, str] = {}  # bos_token -> "<s>", ... as templates see them
    for key in ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
                "mask_token"):
      content = _token_content(self.config.get(key))
      if content is not None:
        self.special_tokens[key] = content
    self.bos_id = self._special_id("bos_token")
    eos_id = self._special_id("eos_token")
    extra_eos = self._generation_config_eos()
    if eos_id is None and not extra_eos:
      raise UserError(f"{config_path}: no eos_token (and no eos_token_id in generation_config.json)"
                      "; generation would never stop")
    self.eos_id = eos_id if eos_id is not None else extra_eos[0]
    self.eos_ids = tuple(dict.fromkeys([self.eos_id, *extra_eos]))
    pad_id = self._special_id("pad_token")
    self.pad_id = pad_id if pad_id is not None else self.eos_id
    self.chat_template = self._read_chat_template()
    self._compiled = None

  def _special_id(self, key: str) -> int | None:
    content = self.special_tokens.get(key)
    if content is None:
      return None
    token_id = self._tok.token_to_id(content)
    if token_id is None:
      raise UserError(f"{self._config_path}: {key} {content!r} is not in the vocabulary of "
                      f"{self.tokenizer_file}")
    return token_id

  def _generation_config_eos(self) -> list[int]:
    path = os.path.join(self.directory, "generation_config.json")
    if not os.path.exists(path):
      return []
    value = _read_json(path).get("eos_token_id")
    values = value if isinstance(value, list) else [value]
    if not all(isinstance(v, int) or v is None for v in values):
      raise UserError(f"{path}: eos_token_id must be an int or a list of ints, got {value!r}")
    return [v for v in values if v is not None]

  def _read_chat_template(self) -> str | None:
    # transformers >= 4.43 saves the template as chat_template.jinja; older files keep it
    # in tokenizer_config.json, as a string or a list of named templates.
    jinja_path = os.path.join(self.directory, "chat_template.jinja")
    if os.path.exists(jinja_path):
      try:
        with open(jinja_path, encoding="utf-8") as f:
          return f.read()
      except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{jinja_path}: cannot read ({e})") from None
    template = self.config.get("chat_template")
    if template is None or isinstance(template, str):
      return template
    if isinstance(template, list):
      named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
      if isinstance(named.get("default"), str):
        return named["default"]
    raise UserError(f"{self._config_path}: chat_template must be a string or a list of "
                    "{name, template} with a 'default' entry")

  def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
    """Token ids; add_special_tokens runs tokenizer.json's post-processor (e.g. Llama's BOS)."""
    return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

  def encode_batch(self, texts: Sequence[str], *, add_special_tokens: bool = False
                   ) -> list[list[int]]:
    """encode() over many texts, in the library's worker threads."""
    return [e.ids for e in self._tok.encode_batch(list(texts),
                                                   add_special_tokens=add_special_tokens)]

  def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
    """Text of `ids`."""
    return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

  def token_to_id(self, token: str) -> int | None:
    """Id of a vocabulary entry (including added tokens), or None."""
    return self._tok.token_to_id(token)

  def apply_chat_template(
      self, messages: str | Sequence[Message], *, add_generation_prompt: bool = True,
      tokenize: bool = False, **template_kwargs: Any) -> str | list[int]:
    """Renders with the checkpoint's chat template, or `render_plain` when it has none.

    Unlike transformers, add_generation_prompt defaults to True: every caller here renders
    a prompt for the policy to answer. Extra keyword arguments reach the template
    (e.g. enable_thinking=False for Qwen3).
    """
    if self.chat_template is None:
      text = render_plain(messages, add_generation_prompt)
      return self.encode(text, add_special_tokens=True) if tokenize else text
    if self._compiled is None:
      self._compiled = _compile_template(self.chat_template, self._config_path)
    import jinja2  # pylint: disable=g-import-not-at-top
    context = {**self.special_tokens, **_plain_data(template_kwargs)}
    # As transformers does: a None value (OpenAI-style content=None) reads as absent.
    messages = [{k: v for k, v in m.items() if v is not None} for m in _as_messages(messages)]
    try:
      text = self._compiled.render(messages=_plain_data(messages),
                                   add_generation_prompt=add_generation_prompt, **context)
    except jinja2.TemplateError as e:
      raise UserError(f"chat template of {self.directory}: {e}") from None
    # The template already wrote BOS and the turn markers, as transformers assumes.
    return self.encode(text, add_special_tokens=False) if tokenize else text


def _plain_data(value: Any) -> Any:
  # Only JSON-like values reach the sandbox: a rich object could expose a method the
  # sandbox does not know to block.
  if value is None or type(value) in (str, int, float, bool):
    return value
  if isinstance(value, Mapping):
    return {str(k): _plain_data(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_plain_data(v) for v in value]
  # Subclasses (str enums, numpy floats) are cut back to the base type and its methods.
  for base in (bool, str, int, float):
    if isinstance(value, base):
      return base(value) if base is not str else str.__str__(value)
  raise UserError(f"chat template input of type {type(value).__name__} is not plain data")


def _compile_template(source: str, origin: str):
  try:
    import jinja2  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise UserError(f"{origin}: rendering its chat template needs jinja2>=3.1.6 "
                    "(pip install jinja2)") from None
  from jinja2 import ext, nodes, sandbox  # pylint: disable=g-import-not-at-top

  # Older jinja2 releases have known sandbox escapes; Hub templates are untrusted code.
  if tuple(int(x) for x in re.findall(r"\d+", jinja2.__version__)[:3]) < (3, 1, 6):
    raise UserError(f"{origin}: chat templates need jinja2>=3.1.6 (installed: "
                    f"{jinja2.__version__}); pip install -U jinja2")

  class _GenerationTag(ext.Extension):
    """`{% generation %}...{% endgeneration %}` marks assistant text; rendered as-is."""

    tags = {"generation"}

    def parse(self, parser):
      lineno = next(parser.stream).lineno
      body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
      return nodes.CallBlock(self.call_method("_passthrough"), [], [], body).set_lineno(lineno)

    def _passthrough(self, caller):
      return caller()

  def raise_exception(message):
    raise jinja2.TemplateError(message)

  def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # jinja's own tojson HTML-escapes '<' and '>', which would corrupt tool schemas.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)

  env = sandbox.ImmutableSandboxedEnvironment(
      trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, ext.loopcontrols])
  env.filters["tojson"] = tojson
  env.globals["raise_exception"] = raise_exception
  env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
  try:
    return env.from_string(source)
  except jinja2.TemplateSyntaxError as e:
    raise UserError(f"{origin}: chat_template line {e.lineno}: {e.message}") from None


def load_tokenizer(spec: str) -> Tokenizer:
  """Returns the tokenizer named by `spec`.

  Args:
    spec: "byte" for the built-in byte tokenizer; a directory holding tokenizer.json
      (a Hugging Face checkpoint directory); or the path of a tokenizer.json file, whose
      directory supplies tokenizer_config.json.

  Raises:
    UserError: the path does not exist, lacks tokenizer.json, or a file is unreadable.
  """
  if spec == "byte":
    return ByteTokenizer()
  path = os.path.expanduser(spec)
  if os.path.isfile(path):
    return HFTokenizer(os.path.dirname(os.path.abspath(path)), tokenizer_file=path)
  if not os.path.isdir(path):
    raise UserError(f"tokenizer {spec!r}: no such file or directory (expected 'byte' or a "
                    "directory holding tokenizer.json)")
  if not os.path.exists(os.path.join(path, "tokenizer.json")):
    hint = (" (only tokenizer.model found: convert it to tokenizer.json with transformers' "
            "AutoTokenizer.save_pretrained)") if os.path.exists(
                os.path.join(path, "tokenizer.model")) else ""
    raise UserError(f"{os.path.join(path, 'tokenizer.json')}: not found{hint}")
  return HFTokenizer(path)
