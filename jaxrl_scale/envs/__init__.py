"""Multi-turn environments by name: tools, feedback, the next user turn.

  from jaxrl_scale.envs import base, registry
  make = registry.episode_maker("python_tool", record, prompt_ids, tokenizer,
                                base.Limits(max_turns=4))
  request = records.Request(prompt_ids, episode=make)

An episode answers each model turn with the ids to append (a chat-template delta,
chat.py) or the end with its reward; the sampler (generation/episodes.py) runs it off
its decode loop and masks what it appended from the loss. Single-turn tasks are the
one-turn case of the same path (a request without an episode). Modules are imported
directly; this package imports nothing itself. Guide: docs/environments.md.
"""
