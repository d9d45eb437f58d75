"""The programs a run executes, built by the run's own code over a topology's devices.

Nothing here is a second model or mesh path: the meshes come from `parallel.mesh.make_slices`
(as process 0 of a real run builds them), the trainer is `rl.train_step.Trainer` over an
abstract model (`nnx.Param` leaves are `jax.ShapeDtypeStruct`s with shardings, no memory),
the sampler's programs are `generation.decode.admit_program` / `decode_program` with the
shapes `generation.layout` gives `generation.engine.Sampler`, and the trainer -> generator cast is
`parallel.transfer`'s. Each program is returned un-lowered; `plan.run_plan` lowers and
compiles them one at a time.

Shapes are the worst case a run reaches:
  train_step   the full RL batch [P, G, S] with S = max prompt + max new tokens
  sft_step     the SFT warm-start batch (when sft.steps > 0)
  prefill      every slot of one generator group admitted at once at the largest bucket
               (with sampler.prefill_chunk: the last piece of that admission, attending to
               the bucket's earlier positions through the pages)
  decode       one decode chunk of every slot at the full cache length
  weight_cast  float32 master -> param_dtype copy, on the trainer's devices
Eval runs on the generator's programs (same engine, parameters and cache). With colocated
roles each program also counts the other role's resident state (`Program.also_resident`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxrl_scale.config import Config
from jaxrl_scale.generation import decode, episodes
from jaxrl_scale.generation import layout as layout_lib
from jaxrl_scale.models import sharding
from jaxrl_scale.models.config import ModelConfig
from jaxrl_scale.parallel import mesh as mesh_lib
from jaxrl_scale.parallel import transfer
from jaxrl_scale.pipeline import wiring
from jaxrl_scale.rl import batch as batch_lib
from jaxrl_scale.rl import placement
from jaxrl_scale.rl import sft as sft_lib
from jaxrl_scale.rl import train_step


@dataclasses.dataclass
class Program:
  """One program to compile.

  Attributes:
    name: train_step, sft_step, prefill, decode, weight_cast.
    mesh: the devices it runs on (one generator group for the sampler's programs).
    lower: builds the `jax.stages.Lowered`.
    model_flops: useful FLOPs of one call over the whole mesh (6N per trained token, 2N per
      generated or prefilled token, attention counted).
    tokens: tokens one call processes over the mesh.
    groups: how many copies run side by side in the job (generator groups), for job-wide
      tokens/s.
    resident: per-chip bytes by kind held by the program's arguments (params, optimizer,
      kv_cache, batch/other), and `also_resident`: bytes on the same chips that the
      program does not see but that stay allocated while it runs.
    paged_layers: layers in the page pool the decode kernel reads one layer of per call
      (`hlo_cost.analyze`); 1 for programs without it.
    micro_rows, data_parallel, micro_rows_per_chip: trainer programs: the rows of one
      micro-batch, the data-parallel chips they split over, and the rows each of those
      computes (all of them where they do not split).
    notes: lines the plan prints with the program (e.g. a micro-batch size the run changes).
    min_bytes: per chip, by kind, the least HBM one call must read (decode: the weights once
      per step and every slot's live KV at the context the plan assumes, `decode_min_bytes`);
      empty where not defined.
  """

  name: str
  mesh: Mesh
  lower: Callable[[], jax.stages.Lowered]
  model_flops: float
  tokens: int
  groups: int = 1
  resident: dict[str, float] = dataclasses.field(default_factory=dict)
  also_resident: float = 0.0
  paged_layers: int = 1
  min_bytes: dict[str, float] = dataclasses.field(default_factory=dict)
  micro_rows: int | None = None
  data_parallel: int | None = None
  micro_rows_per_chip: int | None = None
  notes: list[str] = dataclasses.field(default_factory=list)


def abstract_params(mcfg: ModelConfig, mesh: Mesh, dtype: str | None = None
                    ) -> tuple[nnx.GraphDef, nnx.State]:
  """The model's (graphdef, params) with ShapeDtypeStruct leaves sharded on `mesh`."""
  graphdef, state = sharding.abstract_model(mcfg)
  shardings = sharding.state_shardings(state, mesh)

  def one(var, s):
    value = var.get_value()
    dt = jnp.dtype(dtype) if dtype is not None and jnp.issubdtype(value.dtype, jnp.floating) \
        else value.dtype
    return var.replace(jax.ShapeDtypeStruct(value.shape, dt, sharding=s))

  is_var = lambda x: isinstance(x, nnx.Variable)  # noqa: E731
  state = jax.tree.map(one, state, shardings, is_leaf=is_var)
  return graphdef, state


def _struct(x: Any, sharding_: Any = None) -> jax.ShapeDtypeStruct:
  return jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype if not hasattr(x, "dtype")
                              else x.dtype, sharding=sharding_)


# ---- model FLOPs ----------------------------------------------------------------------------


def matmul_params(mcfg: ModelConfig) -> int:
  """Parameters that take part in a matmul per token: all but the embedding lookup (with
  tied embeddings the table is the LM head, so it counts once); of an MoE's experts only
  the ones a token is routed to."""
  n = mcfg.num_params(active=True)
  return n if mcfg.tie_embeddings else n - mcfg.vocab_size * mcfg.hidden_size


def attention_flops(mcfg: ModelConfig, query_tokens: float, context: float) -> float:
  """Forward FLOPs of QK^T and PV for `query_tokens` queries over `context` keys each."""
  return 4.0 * mcfg.num_layers * mcfg.num_heads * mcfg.head_dim * query_tokens * context


def train_model_flops(mcfg: ModelConfig, rows: int, seq: int) -> float:
  """6N per token plus causal attention (mean context seq/2), times 3 for fwd + bwd."""
  tokens = rows * seq
  return 6.0 * matmul_params(mcfg) * tokens + 3.0 * attention_flops(mcfg, tokens, seq / 2)


def decode_min_bytes(mcfg: ModelConfig, lay: layout_lib.Layout, kv_bytes: float, context: float,
                     steps: int) -> dict[str, float]:
  """The least HBM bytes one chip must read in a decode chunk of `steps` steps, by kind.

  weights: every weight the chip holds, once per step, except an untied embedding table, of
    which a step reads only its rows' entries.
  kv_cache: each of the chip's rows at `context` positions, once per step: its share of the
    pool (`kv_bytes` per chip, pages + 1 null page of page_size positions per data shard)
    per position, times rows per data shard times `context`.
  """
  paths, leaves = layout_lib.paths_and_leaves(lay.params)
  weights = layout_lib.bytes_per_device(leaves)
  rows = lay.num_slots // lay.data  # rows one chip's data shard holds
  if not mcfg.tie_embeddings:
    table = [x for p, x in zip(paths, leaves) if p.startswith("['embed_tokens']")]
    weights -= layout_lib.bytes_per_device(table)
    weights += rows * mcfg.hidden_size * jnp.dtype(mcfg.param_dtype).itemsize
  per_position = kv_bytes / ((lay.pages + 1) * lay.page_size)
  return {"weights": steps * weights, "kv_cache": steps * rows * context * per_position}


# ---- the programs ---------------------------------------------------------------------------


def _trainer_program(name: str, cfg: Config, mcfg: ModelConfig, mesh: Mesh, objective: Any,
                     optim: Any, micro: int, batch: Any, rows: int, seq: int) -> Program:
  graphdef, params = abstract_params(mcfg, mesh)
  trainer = train_step.Trainer(nnx.merge(graphdef, params), mesh, optim, objective,
                               micro_batches=micro)
  state = trainer.state
  per_chip = layout_lib.bytes_per_device
  # The rows of one micro-batch each data-parallel chip computes: all of them where they do
  # not split (`placement.shardable_micro_batches`), which the plan's advice names.
  micro_rows = rows // micro
  n = placement.data_shards(mesh)
  resident = {"params": per_chip(state.params), "optimizer": per_chip(state.opt_state),
              "batch": per_chip(jax.tree.map(
                  lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), batch,
                  trainer.batch_shardings(batch)))}
  return Program(name, mesh, lambda: trainer.lower(batch),
                 train_model_flops(mcfg, rows, seq), rows * seq, resident=resident,
                 micro_rows=micro_rows, data_parallel=n,
                 micro_rows_per_chip=micro_rows if micro_rows % n else micro_rows // n)


def build(cfg: Config, mcfg: ModelConfig, devices: list) -> tuple[mesh_lib.Slices,
                                                                 list[Program]]:
  """The slices process 0 of a run on `devices` builds, and every program it compiles."""
  mode = cfg.pipeline.mode
  mesh_cfg = dataclasses.replace(cfg.mesh, colocated=True) if mode == "colocated" else cfg.mesh
  slices = mesh_lib.make_slices(mesh_cfg, devices, process_index=0)
  programs = []

  p, g = cfg.rl.prompts_per_step, cfg.rl.generations_per_prompt
  seq = cfg.data.max_prompt_tokens + cfg.sampler.max_new_tokens
  # An MoE run with routing records (model.routing record / replay) sends the sampler's
  # expert choices along with every batch: [P, G, S, L_sparse, K] more bytes per step.
  sparse = sum(mcfg.moe_layers())
  routing = ((sparse, mcfg.experts_per_token, decode.routing_dtype(mcfg.num_experts))
             if cfg.model.routing != "own" and sparse else None)
  batch = batch_lib.rl_batch_spec(p, g, seq, routing)
  objective = wiring.rl_objective(cfg)
  asked = train_step.micro_batches_for(cfg.optim, p)
  micro = train_step.micro_batches_for(cfg.optim, p, g, slices.trainer)
  programs.append(_trainer_program(
      "train_step", cfg, mcfg, slices.trainer, objective, cfg.optim, micro, batch, p * g, seq))
  note = placement.micro_batch_note("optim.micro_batch_prompts", p, g, asked, micro,
                                     slices.trainer)
  programs[-1].notes.extend([note] if note else [])
  if cfg.sft.steps > 0:
    sft_batch = batch_lib.sft_batch_spec(cfg.sft.batch_size, seq)
    programs.append(_trainer_program(
        "sft_step", cfg, mcfg, slices.trainer, sft_lib.SFTObjective(),
        sft_lib.optim_config(cfg.optim, cfg.sft), sft_lib.micro_batches(cfg.sft, slices.trainer),
        sft_batch, cfg.sft.batch_size, seq))

  programs.append(_cast_program(mcfg, slices, programs[0].resident["optimizer"]))
  sampler = _sampler_programs(cfg, mcfg, slices)
  programs.extend(sampler)
  if slices.colocated:
    # One set of chips holds both roles: the trainer's master weights and optimizer state
    # stay allocated while the sampler runs. With sampler.sleep_while_training the sampler
    # frees everything it holds once it has generated (`engine.Sampler.sleep`), so the
    # train step, the SFT step and the cast run beside none of it; otherwise its weights and
    # KV cache stay allocated while the trainer steps.
    trainer_state = programs[0].resident["params"] + programs[0].resident["optimizer"]
    sampler_state = sum(sampler[0].resident.values())
    # With one weight buffer the sampler deletes its weights (and their layer copies)
    # before the update is cast and placed (`generation.weights`): the cast runs beside
    # the sampler's KV cache and slot state only.
    swapped = (0.0 if cfg.sampler.weight_buffers == 2 else
               sampler[0].resident["params"] + sampler[0].resident.get("layer_copies", 0.0))
    # The warm start's SFT steps run before any rollout in every mode; the RL steps overlap
    # generation in pipeline mode, where the sampler never sleeps.
    sleeps = cfg.sampler.sleep_while_training
    for prog in programs:
      asleep = sleeps and (prog.name == "sft_step" or mode != "pipeline")
      if prog.name in ("train_step", "sft_step"):
        prog.also_resident += 0.0 if asleep else sampler_state
        if asleep:
          prog.notes.append("the sampler sleeps while the trainer steps "
                            "(sampler.sleep_while_training): its "
                            f"{sampler_state / 2**30:.2f} GiB are free for this program")
      elif prog.name == "weight_cast":
        prog.also_resident += 0.0 if asleep else sampler_state - swapped
      else:
        prog.also_resident += trainer_state
  return slices, programs


def _cast_program(mcfg: ModelConfig, slices: mesh_lib.Slices, optimizer_bytes: float
                  ) -> Program:
  """The trainer-side float32 -> param_dtype cast of the weights sent to the generator.

  Beside it stay the optimizer state and, across hosts with split roles, the process-local
  copy `transfer.to_local` gathers onto each process's trainer devices before the move.
  """
  mesh = slices.trainer
  _, master = abstract_params(mcfg, mesh, dtype="float32")
  leaves = jax.tree.leaves(master)
  dtypes = tuple(jnp.dtype(mcfg.param_dtype) if jnp.issubdtype(x.dtype, jnp.floating)
                 else x.dtype for x in leaves)
  fn = transfer.cast_program(dtypes)
  cast = sum(layout_lib.bytes_per_device([x]) * jnp.dtype(d).itemsize / x.dtype.itemsize
             for x, d in zip(leaves, dtypes) if d != x.dtype)
  # The optimizer state is not the program's argument: it stays beside it (also_resident),
  # and counting it here too showed it twice in the table's optim column.
  resident = {"params": layout_lib.bytes_per_device(leaves), "cast_copy": cast}
  gathered = 0.0
  if slices.num_processes > 1 and not slices.colocated:
    gathered = transfer.local_copy_bytes_per_device(leaves, dtypes)
    resident["gathered_copy"] = gathered
  return Program("weight_cast", mesh, lambda: fn.lower(tuple(leaves)), 0.0, 0,
                 resident=resident, also_resident=optimizer_bytes + gathered)


def _sampler_programs(cfg: Config, mcfg: ModelConfig, slices: mesh_lib.Slices) -> list[Program]:
  mesh = slices.generator
  scfg = cfg.sampler
  graphdef, abstract = sharding.abstract_model(mcfg)
  # The sampler's shapes and shardings as engine.Sampler derives them (generation.layout).
  lay = layout_lib.layout(mcfg, abstract, scfg, mesh, generator_groups=slices.generator_groups,
                      max_prompt_len=cfg.data.max_prompt_tokens)
  slots, data, buckets, max_len = lay.num_slots, lay.data, lay.buckets, lay.max_len
  page, pages, width = lay.page_size, lay.pages, lay.width
  param_leaves, treedef = jax.tree.flatten(lay.params)
  param_leaves = tuple(param_leaves)
  shardings, state, table = lay.state_shardings, lay.state, lay.table
  layers = (jax.eval_shape(decode.layers_program(graphdef, treedef), param_leaves)
            if lay.layer_copies else None)
  rep = NamedSharding(mesh, PartitionSpec())
  consts = jax.tree.map(lambda x: _struct(x, rep), decode.constants([0], [0], -1))
  n, bucket = slots, buckets[-1]
  # Chunked prefill: the admission's last piece (the longest prefix before it) is the worst.
  piece = min(scfg.prefill_chunk or bucket, bucket)
  start = (bucket - 2) // piece * piece if piece < bucket else 0
  i32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.int32, sharding=rep)  # noqa: E731
  f32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32, sharding=rep)  # noqa: E731
  # Every admitted prompt distinct: the prefill's worst case (u = n).
  adm = decode.Admission(tokens_uT=i32(n, piece), length_u=i32(n), source_n=i32(n),
                         slot_n=i32(n), src_slot_u=i32(n),
                         activate_n=jax.ShapeDtypeStruct((n,), jnp.bool_, sharding=rep),
                         last_n=i32(n),
                         seed_n=i32(n), temperature_n=f32(n), top_k_n=i32(n), top_p_n=f32(n),
                         limit_n=i32(n), force_at_n=i32(n), answer_budget_n=i32(n))
  held = lay.held_bytes_per_device()
  # Everything the Sampler holds, by kind: the live weights, the posted update waiting for
  # the swap (the double buffer; 0 with sampler.weight_buffers 1), per-layer copies
  # (CPU/GPU), the page pool, slot state.
  resident = {"params": held["params"], "pending_params": held["pending_params"],
              "kv_cache": held["kv_cache"], "batch": held["slot_state"]}
  if held["layer_copies"]:
    resident["layer_copies"] = held["layer_copies"]
  # Held beside each program, not among its arguments (the compiler does not see them).
  beside_prefill = held["pending_params"] + held["layer_copies"]
  beside_decode = held["pending_params"] + (0.0 if layers is not None else held["layer_copies"])
  # The Sampler records routing exactly when the run sends it to the trainer (wiring).
  record = cfg.model.routing != "own" and any(mcfg.moe_layers())
  admit = decode.admit_program(graphdef, treedef, shardings, start, record_routing=record)
  truncate = scfg.top_p < 1.0 or scfg.top_k > 0
  steps = scfg.decode_chunk
  chunk = decode.decode_program(graphdef, treedef, shardings, steps, truncate,
                                scfg.temperature == 0, width, record_routing=record)
  n_mat = matmul_params(mcfg)
  prefill_tokens = n * piece
  decode_tokens = slots * steps
  groups = slices.generator_groups
  # Mean context of a decoding slot: the positions the pool holds per slot (it is sized for
  # the run's average length), at most the longest sequence.
  context = min(max_len, pages * page * data / slots)
  programs = [
      Program("prefill", mesh, lambda: admit.lower(param_leaves, state, adm, table),
              # The prefill computes no logits (XLA drops the unused LM head).
              2.0 * (n_mat - mcfg.vocab_size * mcfg.hidden_size) * prefill_tokens
              + attention_flops(mcfg, prefill_tokens, start + piece / 2),
              prefill_tokens, groups, dict(resident), also_resident=beside_prefill),
      Program("decode", mesh, lambda: chunk.lower(param_leaves, layers, state, consts, table),
              2.0 * n_mat * decode_tokens + attention_flops(mcfg, decode_tokens, context),
              decode_tokens, groups, dict(resident), also_resident=beside_decode,
              paged_layers=mcfg.num_layers,
              min_bytes=decode_min_bytes(mcfg, lay, held["kv_cache"], context, steps)),
  ]
  if cfg.env.name:
    programs.append(_resume_program(cfg, mcfg, mesh, lay, graphdef, treedef, param_leaves,
                                    resident, beside_prefill, record, groups))
  return programs


def _resume_program(cfg: Config, mcfg: ModelConfig, mesh: Mesh, lay: Any, graphdef: Any,
                    treedef: Any, param_leaves: tuple, resident: dict[str, float],
                    beside: float, record: bool, groups: int) -> Program:
  """A multi-turn run's continuation (`decode.resume_program`): one episode's environment
  tokens computed into its slot, attending to its history through the pages. An episode
  holds its pages across turns, the environment's calls included: the pool (`kv_cache`)
  counts them, as every slot's whole budget is prompt + sampler.max_new_tokens, model and
  environment tokens alike. The piece planned is the longest an environment answer takes:
  env.tool_output_chars tokens (a byte each at worst) and the template's, within the budget."""
  rep = NamedSharding(mesh, PartitionSpec())
  longest = min(cfg.sampler.max_new_tokens, cfg.env.tool_output_chars + 64)
  piece = episodes.piece_length(longest)
  i32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.int32, sharding=rep)  # noqa: E731
  f32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32, sharding=rep)  # noqa: E731
  adm = decode.Admission(tokens_uT=i32(1, piece), length_u=i32(1), source_n=i32(1),
                         slot_n=i32(1), src_slot_u=i32(1),
                         activate_n=jax.ShapeDtypeStruct((1,), jnp.bool_, sharding=rep),
                         last_n=i32(1), seed_n=i32(1), temperature_n=f32(1), top_k_n=i32(1),
                         top_p_n=f32(1), limit_n=i32(1), force_at_n=i32(1),
                         answer_budget_n=i32(1), gen_n=i32(1))
  run = decode.resume_program(graphdef, treedef, lay.state_shardings, record_routing=record)
  n_mat = matmul_params(mcfg)
  context = cfg.data.max_prompt_tokens + cfg.sampler.max_new_tokens - piece
  return Program(
      "resume", mesh, lambda: run.lower(param_leaves, lay.state, adm, lay.table, i32()),
      2.0 * (n_mat - mcfg.vocab_size * mcfg.hidden_size) * piece
      + attention_flops(mcfg, piece, max(context, 0) + piece / 2),
      piece, groups, dict(resident), also_resident=beside,
      notes=[f"episodes (env.name={cfg.env.name}) hold their pages across turns: the page "
             f"pool counts them; a continuation of up to {piece} positions"])
