#!/usr/bin/env python3
"""Generate tiny DeepSeek V2/V3/V3.2/V4 reference checkpoints and greedy-decoding goldens with HF transformers.

The moesh C++ engine is tested against these files: each tiny checkpoint is produced by
transformers' own `save_pretrained`, and the goldens are transformers' own fp32 logits for
greedy decoding with a KV cache.  Nothing here is needed at build time; the outputs are
committed under tests/golden/<name>/ and this script documents (and can regenerate) them.

Usage (needs torch, transformers >= 5, safetensors; runs on CPU in about a minute):

    python3 tests/golden/make_hf_goldens.py --out tests/golden [--facts FILE] [--only NAME ... | --only new]

(the V3.2 / V4 goldens were made with `--only new --facts tests/golden/hf_facts_v32_v4.txt`, leaving
the v2/v3 ones and hf_facts.txt as they were)

For every config below it writes into <out>/<name>/:
  config.json                 as written by save_pretrained (v2_lite: rewritten to DeepSeek's
                              legacy `rope_theta` + `rope_scaling{"type": "yarn", ...}` form)
  model.safetensors           bf16 weights (V3's e_score_correction_bias kept in fp32, as in
                              the real DeepSeek-V3 checkpoints)
  golden.json                 prompts, greedy output ids, versions, sanity numbers, notes
  golden_logits.safetensors   float32 `logits_<k>` [16, vocab]: logits_<k>[s] is the
                              distribution that produced output_ids[k][s] (decode with cache);
                              float32 `prefill_logits_<k>` [len(prompt_k), vocab]: the logits
                              at every prompt position (no-cache forward; causal, so equal to a
                              forward over the prompt alone)

V3.2 and V4 configs (--only new) also write golden_debug.safetensors (intermediate tensors of
a no-cache forward over prompt + output: per-layer outputs, attention and MLP outputs, indexer
selections, V4 compressor entries; see debug_tensors()) and record diagnostics in golden.json
(how much the sparse selection changes the logits, the V3.2 indexer's top-k boundary margins).
Their weights keep in fp32 what transformers keeps in fp32 for the class (V3.2:
indexer.weights_proj; V4: mHC, sinks, position_bias, norms, ...).

and one text file of facts about the installed transformers (rope code, config classes,
tensor names of the saved checkpoints) to --facts (default <out>/hf_facts.txt).

Numerics: weights are stored in bf16, then reloaded with dtype=float32 so the reference math
runs in fp32 on exactly the bf16 values, with eager attention and eager experts, on CPU
(no TF32 anywhere).  Decoding is plain argmax over all tokens: EOS is NOT suppressed and
does not stop decoding; golden.json says whether any step picked EOS.
"""

import argparse
import inspect
import json
import os
import re
import shutil
import sys
import tempfile
import traceback

import torch

import safetensors
import safetensors.torch
import transformers

NUM_NEW_TOKENS = 16
PROMPT_LENGTHS = (5, 19, 45)  # the last one is longer than the v3 YaRN original context (32)

# ---------------------------------------------------------------------------------------------
# Model configurations
# ---------------------------------------------------------------------------------------------

# Dimensions shared by every tiny model.
COMMON = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=96,
    moe_intermediate_size=32,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=4,
    kv_lora_rank=32,
    qk_nope_head_dim=16,
    qk_rope_head_dim=8,
    v_head_dim=16,
    n_routed_experts=8,
    first_k_dense_replace=1,
    rms_norm_eps=1e-6,
    bos_token_id=0,
    eos_token_id=1,
    attention_bias=False,
    hidden_act="silu",
    max_position_embeddings=256,
)

# Each entry: model class name, seed, constructor kwargs (fields the HF config class declares),
# extra DeepSeek-style keys (stored in config.json like the real checkpoints carry them; HF
# ignores them for the math) and whether to rewrite config.json into the legacy rope form.
CONFIGS = {
    "v2_lite": dict(
        cls="DeepseekV2ForCausalLM",
        seed=1001,
        legacy_rope=True,
        kwargs=dict(
            COMMON,
            num_experts_per_tok=2,
            n_shared_experts=2,
            q_lora_rank=None,
            topk_method="greedy",
            n_group=1,
            topk_group=1,
            norm_topk_prob=False,
            routed_scaling_factor=1.0,
            max_position_embeddings=4 * 64,  # factor * original_max_position_embeddings
            rope_parameters=dict(
                rope_type="yarn",
                rope_theta=10000.0,
                factor=4.0,
                original_max_position_embeddings=64,
                beta_fast=32.0,
                beta_slow=1.0,
                mscale=0.707,
                mscale_all_dim=0.707,
            ),
        ),
        extras=dict(scoring_func="softmax", moe_layer_freq=1),
    ),
    "v2": dict(
        cls="DeepseekV2ForCausalLM",
        seed=1002,
        legacy_rope=False,
        kwargs=dict(
            COMMON,
            num_experts_per_tok=2,
            n_shared_experts=2,
            q_lora_rank=48,
            topk_method="group_limited_greedy",
            n_group=4,
            topk_group=2,
            norm_topk_prob=False,
            routed_scaling_factor=2.0,
            rope_parameters=dict(rope_type="default", rope_theta=10000.0),
        ),
        extras=dict(scoring_func="softmax", moe_layer_freq=1),
    ),
    "v3": dict(
        cls="DeepseekV3ForCausalLM",
        seed=1003,
        legacy_rope=False,
        kwargs=dict(
            COMMON,
            num_experts_per_tok=3,
            n_shared_experts=1,
            q_lora_rank=48,
            n_group=4,
            topk_group=2,
            norm_topk_prob=True,
            routed_scaling_factor=2.5,
            rope_interleave=True,
            num_mtp_layers=0,  # no multi-token-prediction layers in these checkpoints
            max_position_embeddings=8 * 32,  # factor * original_max_position_embeddings
            rope_parameters=dict(
                rope_type="yarn",
                rope_theta=10000.0,
                factor=8.0,
                original_max_position_embeddings=32,
                beta_fast=32.0,
                beta_slow=1.0,
                mscale=1.0,
                mscale_all_dim=0.8,
            ),
        ),
        # HF's V3 router is always noaux_tc + sigmoid; the keys document it for our loader.
        extras=dict(topk_method="noaux_tc", scoring_func="sigmoid", moe_layer_freq=1),
    ),
    "v3_neox": dict(
        cls="DeepseekV3ForCausalLM",
        seed=1004,
        legacy_rope=False,
        kwargs=dict(
            COMMON,
            num_experts_per_tok=3,
            n_shared_experts=1,
            q_lora_rank=None,
            n_group=1,
            topk_group=1,
            norm_topk_prob=False,
            routed_scaling_factor=1.5,
            rope_interleave=False,
            num_mtp_layers=0,
            tie_word_embeddings=True,
            rope_parameters=dict(rope_type="default", rope_theta=50000.0),
        ),
        extras=dict(topk_method="noaux_tc", scoring_func="sigmoid", moe_layer_freq=1),
    ),
    # ---- DeepSeek-V3.2: V3 + the DSA lightning indexer. index_topk is below the longer prompt
    # lengths (and below prompt + generated tokens for the short one), so the sparse selection
    # changes the attention; several index heads keep exact score ties (all heads ReLU'd to 0)
    # unlikely.
    "v32": dict(
        cls="DeepseekV32ForCausalLM",
        seed=1005,
        legacy_rope=False,
        new_family=True,
        kwargs=dict(
            COMMON,
            num_experts_per_tok=3,
            n_shared_experts=1,
            q_lora_rank=48,
            n_group=4,
            topk_group=2,
            norm_topk_prob=True,
            routed_scaling_factor=2.5,
            index_topk=8,
            index_head_dim=32,
            index_n_heads=6,
            max_position_embeddings=8 * 32,
            rope_parameters=dict(
                rope_type="yarn",
                rope_theta=10000.0,
                factor=8.0,
                original_max_position_embeddings=32,
                beta_fast=32.0,
                beta_slow=1.0,
                mscale=1.0,
                mscale_all_dim=0.8,
            ),
        ),
        extras=dict(topk_method="noaux_tc", scoring_func="sigmoid", moe_layer_freq=1),
    ),
    "v32_dense_rope": dict(
        cls="DeepseekV32ForCausalLM",
        seed=1006,
        legacy_rope=False,
        new_family=True,
        kwargs=dict(
            COMMON,
            num_hidden_layers=4,
            first_k_dense_replace=2,
            num_experts_per_tok=2,
            n_shared_experts=2,
            q_lora_rank=40,
            n_group=1,
            topk_group=1,
            norm_topk_prob=False,
            routed_scaling_factor=1.5,
            index_topk=4,
            index_head_dim=16,
            index_n_heads=8,
            rope_parameters=dict(rope_type="default", rope_theta=50000.0),
        ),
        extras=dict(topk_method="noaux_tc", scoring_func="sigmoid", moe_layer_freq=1),
    ),
    # ---- DeepSeek-V4: mHC, sliding window + CSA/HCA compressed attention with sinks, the
    # indexer, grouped output projection, sqrt-softplus and hash routing, clamped SwiGLU.
    # Prompts are longer than the sliding window and than several compress windows; index_topk
    # is below the number of compressed CSA entries; swiglu_limit is low enough to clamp often.
    "v4": dict(
        cls="DeepseekV4ForCausalLM",
        seed=1007,
        legacy_rope=False,
        new_family=True,
        kwargs=dict(
            vocab_size=512,
            hidden_size=64,
            moe_intermediate_size=32,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=32,
            partial_rotary_factor=0.25,  # qk_rope_head_dim 8
            q_lora_rank=48,
            o_groups=2,
            o_lora_rank=16,
            num_experts_per_tok=2,
            n_routed_experts=8,
            n_shared_experts=1,
            scoring_func="sqrtsoftplus",
            norm_topk_prob=True,
            routed_scaling_factor=1.5,
            swiglu_limit=0.5,
            layer_types=["sliding_attention", "compressed_sparse_attention",
                         "heavily_compressed_attention", "compressed_sparse_attention"],
            mlp_layer_types=["hash_moe", "hash_moe", "moe", "moe"],
            compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
            sliding_window=8,
            index_n_heads=8,
            index_head_dim=16,
            index_topk=3,
            hc_mult=4,
            hc_sinkhorn_iters=20,
            hc_eps=1e-6,
            rope_theta=10000.0,
            compress_rope_theta=160000.0,
            rope_parameters=dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=32,
                                 beta_fast=32.0, beta_slow=1.0),
            num_nextn_predict_layers=0,
            rms_norm_eps=1e-6,
            bos_token_id=0,
            eos_token_id=1,
            hidden_act="silu",
            max_position_embeddings=4 * 32,  # factor * original_max_position_embeddings
        ),
        extras=dict(),
    ),
    # DeepSeek's own config.json spelling (compress_ratios with the real 4 / 128 rates,
    # num_hash_layers, qk_rope_head_dim, rope_theta + compress_rope_theta + rope_scaling); the
    # long prompt closes one 128-token HCA window.
    "v4_legacy": dict(
        cls="DeepseekV4ForCausalLM",
        seed=1008,
        legacy_rope=False,
        legacy_v4=True,
        new_family=True,
        prompt_lengths=(5, 37, 140),
        kwargs=dict(
            vocab_size=512,
            hidden_size=64,
            moe_intermediate_size=32,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=32,
            partial_rotary_factor=0.25,
            q_lora_rank=48,
            o_groups=4,
            o_lora_rank=8,
            num_experts_per_tok=3,
            n_routed_experts=8,
            n_shared_experts=1,
            scoring_func="sqrtsoftplus",
            norm_topk_prob=True,
            routed_scaling_factor=2.0,
            swiglu_limit=0.6,
            layer_types=["heavily_compressed_attention", "compressed_sparse_attention",
                         "sliding_attention"],
            mlp_layer_types=["hash_moe", "moe", "moe"],
            compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 128},
            sliding_window=16,
            index_n_heads=8,
            index_head_dim=16,
            index_topk=5,
            hc_mult=4,
            hc_sinkhorn_iters=20,
            hc_eps=1e-6,
            rope_theta=10000.0,
            compress_rope_theta=160000.0,
            rope_parameters=dict(rope_type="yarn", factor=16.0, original_max_position_embeddings=16,
                                 beta_fast=32.0, beta_slow=1.0),
            num_nextn_predict_layers=0,
            rms_norm_eps=1e-6,
            bos_token_id=0,
            eos_token_id=1,
            hidden_act="silu",
            max_position_embeddings=256,
        ),
        extras=dict(),
    ),
}

# Families whose configs are not regenerated by default (the v2/v3 goldens predate them and
# stay byte-identical unless asked for with --only).
NEW_FAMILY_CONFIGS = [name for name, spec in CONFIGS.items() if spec.get("new_family")]


def log(*args):
    print(*args, flush=True)


def make_config(spec):
    """Builds the HF config; DeepSeek-only extra keys become plain attributes (-> config.json)."""
    model_cls = getattr(transformers, spec["cls"])
    config_cls = model_cls.config_class
    try:
        config = config_cls(**spec["kwargs"], **spec["extras"])
    except Exception as exc:  # a strict config refusing unknown keys
        log(f"  config refused extras ({exc!r}); setting them as attributes instead")
        config = config_cls(**spec["kwargs"])
        for key, value in spec["extras"].items():
            setattr(config, key, value)
    return model_cls, config


# ---------------------------------------------------------------------------------------------
# Weights
# ---------------------------------------------------------------------------------------------


@torch.no_grad()
def randomize_weights(model, seed):
    """Large-ish random weights so that logits are far from uniform and routing is decisive.

    Every parameter ~ N(0, 0.05); RMSNorm weights 1 + 0.1*N(0,1); the V3 router's
    e_score_correction_bias 0.1*N(0,1).  Iteration order is the module registration order,
    so the result is a pure function of the seed.
    """
    torch.manual_seed(seed)
    norm_params = set()
    for module in model.modules():
        if type(module).__name__.endswith("RMSNorm") and getattr(module, "weight", None) is not None:
            norm_params.add(id(module.weight))
    for _name, param in model.named_parameters():  # tied lm_head/embedding appears once
        if id(param) in norm_params:
            param.copy_(1.0 + 0.1 * torch.randn_like(param))
        else:
            param.normal_(mean=0.0, std=0.05)
    for name, buf in model.named_buffers():
        if name.endswith("e_score_correction_bias"):
            buf.copy_(0.1 * torch.randn_like(buf))


@torch.no_grad()
def randomize_new_family_extras(model, seed):
    """V3.2 / V4 parameters whose N(0, 0.05) default would make their path trivial, drawn after
    randomize_weights() from their own generator: LayerNorm (the V3.2 indexer's k_norm) weight
    1 + 0.1*N and bias 0.1*N; V4 attention sinks N(0, 1); compressor / indexer position_bias
    N(0, 0.5); mHC scales 1 + 0.1*N and bases 0.5*N; hash-routing tables `tid2eid` a random
    valid table (distinct experts per token, each row a random permutation prefix)."""
    gen = torch.Generator().manual_seed(seed + 7)

    def randn(t):
        return torch.randn(t.shape, generator=gen, dtype=torch.float32).to(t.dtype)

    for mod_name, module in model.named_modules():
        if type(module).__name__ == "LayerNorm":
            module.weight.copy_(1.0 + 0.1 * randn(module.weight))
            if module.bias is not None:
                module.bias.copy_(0.1 * randn(module.bias))
    for name, param in model.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        if leaf == "sinks":
            param.copy_(randn(param))
        elif leaf == "position_bias":
            param.copy_(0.5 * randn(param))
        elif leaf in ("scale", "hc_scale"):
            param.copy_(1.0 + 0.1 * randn(param))
        elif leaf in ("base", "hc_base"):
            param.copy_(0.5 * randn(param))
    for name, buf in model.named_buffers():
        if name.endswith("tid2eid"):
            num_experts = model.config.n_routed_experts
            rows = [torch.randperm(num_experts, generator=gen)[: buf.shape[1]] for _ in range(buf.shape[0])]
            buf.copy_(torch.stack(rows).to(buf.dtype))


def keep_fp32_regex(model):
    """The parameter-name pattern transformers keeps in fp32 for this model class
    (_keep_in_fp32_modules_strict + _keep_in_fp32_modules), or None."""
    keys = list(getattr(model, "_keep_in_fp32_modules_strict", None) or [])
    keys += list(getattr(model, "_keep_in_fp32_modules", None) or [])
    if not keys:
        return None
    return re.compile(r"((^|\.)(" + "|".join(re.escape(k) for k in keys) + r")($|\.))")


def to_bf16_keep_fp32_modules(model):
    """Casts to bf16 like a checkpoint saved from a bf16 model, except what transformers keeps
    in fp32 for this class (V3.2: indexer.weights_proj, e_score_correction_bias; V4: mHC,
    sinks, position_bias, norms, ...): those stay fp32 as from_pretrained(dtype=bf16) holds them."""
    pattern = keep_fp32_regex(model)
    keep = {}
    if pattern is not None:
        for name, t in list(model.named_parameters()) + list(model.named_buffers()):
            if t.is_floating_point() and pattern.search(name):
                keep[name] = t.detach().clone().float()
    model.to(torch.bfloat16)
    for name, value in keep.items():
        owner_name, leaf = name.rsplit(".", 1) if "." in name else ("", name)
        owner = model.get_submodule(owner_name)
        if leaf in owner._parameters:
            owner._parameters[leaf] = torch.nn.Parameter(value, requires_grad=False)
        else:
            owner._buffers[leaf] = value
    return model, sorted(keep)


def to_bf16_keep_bias_fp32(model):
    """Casts to bf16 like a real checkpoint; V3's e_score_correction_bias stays fp32 (as HF's
    _keep_in_fp32_modules_strict and the official DeepSeek-V3 weights have it)."""
    biases = {n: b.detach().clone().float() for n, b in model.named_buffers()
              if n.endswith("e_score_correction_bias")}
    model.to(torch.bfloat16)
    for name, value in biases.items():
        owner = model.get_submodule(name.rsplit(".", 1)[0])
        owner._buffers["e_score_correction_bias"] = value
    return model


def load_fp32(model_cls, path):
    """Reloads a saved checkpoint for reference math: fp32, eager attention and experts."""
    kwargs = dict(dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    try:
        model, info = model_cls.from_pretrained(path, experts_implementation="eager", **kwargs)
    except Exception as exc:
        log(f"  experts_implementation='eager' not accepted ({exc!r}); using the default")
        model, info = model_cls.from_pretrained(path, **kwargs)
    model.eval()
    # Missing/unexpected keys would mean our saved names do not round-trip; recorded, and the
    # exact weight comparison in make_one() catches any tensor that was not loaded.
    problems = {k: [str(x) for x in (v if isinstance(v, (list, set, tuple)) else [v])]
                for k, v in info.items() if v}
    if problems:
        log(f"  WARNING: loading {path} was not clean: {problems}")
    model.loading_problems = problems
    return model


# ---------------------------------------------------------------------------------------------
# Reference decoding
# ---------------------------------------------------------------------------------------------


@torch.no_grad()
def greedy_with_cache(model, prompt):
    """Prefill the prompt, then decode NUM_NEW_TOKENS tokens one at a time through the KV cache.

    Returns (output ids, logits [NUM_NEW_TOKENS, vocab]); logits[s] produced output ids[s].
    """
    out = model(input_ids=prompt[None, :], use_cache=True)
    cache = out.past_key_values
    next_logits = out.logits[0, -1]
    ids, rows = [], []
    for step in range(NUM_NEW_TOKENS):
        rows.append(next_logits.float().clone())
        token = int(torch.argmax(next_logits))  # plain argmax: EOS is allowed and ignored
        ids.append(token)
        if step + 1 < NUM_NEW_TOKENS:
            out = model(input_ids=torch.tensor([[token]]), past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            next_logits = out.logits[0, -1]
    return ids, torch.stack(rows)


@torch.no_grad()
def greedy_recompute(model, prompt):
    """greedy_with_cache() without a cache: one full forward per step."""
    ids, rows = [], []
    seq = prompt.tolist()
    for _ in range(NUM_NEW_TOKENS):
        next_logits = full_forward_logits(model, seq)[-1]
        rows.append(next_logits.clone())
        token = int(torch.argmax(next_logits))
        ids.append(token)
        seq.append(token)
    return ids, torch.stack(rows)


@torch.no_grad()
def full_forward_logits(model, ids):
    """Logits at every position of `ids` from one forward pass without a cache."""
    return model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float()


@torch.no_grad()
def generate_crosscheck(model, prompt, ids, logits):
    """Compares our loop with HF generate() (min_new_tokens keeps EOS from ending it).

    generate() suppresses EOS until min_new_tokens, so tokens are compared only up to the first
    step where our plain argmax chose EOS; raw logits are compared over the same steps.
    """
    out = model.generate(
        input_ids=prompt[None, :], do_sample=False, max_new_tokens=NUM_NEW_TOKENS,
        min_new_tokens=NUM_NEW_TOKENS, output_logits=True, return_dict_in_generate=True,
        pad_token_id=model.config.eos_token_id)
    gen_ids = out.sequences[0, prompt.numel():].tolist()
    upto = ids.index(model.config.eos_token_id) if model.config.eos_token_id in ids else len(ids)
    gen_logits = torch.stack([step[0].float() for step in out.logits])
    return dict(
        compared_steps=upto,
        tokens_equal=gen_ids[:upto] == ids[:upto],
        max_abs_logit_diff=float((gen_logits[:upto + (upto < len(ids))] -
                                  logits[:upto + (upto < len(ids))]).abs().max()),
    )


def rope_summary(model):
    """What the loaded HF model actually uses for RoPE and the softmax scale."""
    rotary = model.model.rotary_emb
    attn = model.model.layers[0].self_attn
    if not hasattr(rotary, "inv_freq"):  # V4: one set of buffers per rope type (main, compress)
        summary = dict(
            rope_parameters=json.loads(json.dumps(dict(model.config.rope_parameters), default=str)),
            head_dim=getattr(model.config, "head_dim", None),
            qk_rope_head_dim=getattr(model.config, "qk_rope_head_dim", None),
            softmax_scale=float(attn.scaling),
        )
        for rope_type in getattr(rotary, "layer_types", []):
            summary[f"{rope_type}_inv_freq"] = [float(x) for x in getattr(rotary, f"{rope_type}_inv_freq")]
            summary[f"{rope_type}_attention_scaling"] = float(getattr(rotary, f"{rope_type}_attention_scaling"))
        return summary
    return dict(
        rope_parameters={k: v for k, v in dict(model.config.rope_parameters).items()},
        head_dim=getattr(model.config, "head_dim", None),
        inv_freq=[float(x) for x in rotary.inv_freq],
        attention_scaling=float(rotary.attention_scaling),
        softmax_scale=float(attn.scaling),
        rope_interleave=getattr(model.config, "rope_interleave", None),
    )


# ---------------------------------------------------------------------------------------------
# V3.2 / V4 diagnostics: intermediate tensors, indexer selections, tie margins
# ---------------------------------------------------------------------------------------------


def _first_tensor(x):
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, (tuple, list)) and x and isinstance(x[0], torch.Tensor):
        return x[0]
    return None


@torch.no_grad()
def debug_tensors(model, ids, k):
    """One no-cache forward over `ids` with hooks; returns {name: tensor} of intermediate values
    (batch dim dropped) for debugging a mismatch without rerunning transformers:
      layer_out_{k}_L{l}   decoder layer output ([T, hidden], V4: [T, hc_mult, hidden])
      attn_out_{k}_L{l}    self_attn output [T, hidden] (after o_proj / o_b_proj)
      mlp_out_{k}_L{l}     mlp output [T, hidden]
      topk_{k}_L{l}        indexer selections (int32; V3.2 [T, index_topk] positions, V4 CSA
                           [T, min(index_topk, entries)] compressed-entry ids, -1 invalid)
      compressed_{k}_L{l}  V4 compressor entries [n, head_dim] (after kv_norm and RoPE)
      hc_head_out_{k}      V4 collapsed streams before the final norm [T, hidden]
    """
    out, handles = {}, []

    def save(name, as_int=False):
        def hook(_module, _args, output):
            t = _first_tensor(output)
            if t is None:
                return
            t = t.detach()[0]
            out[name] = t.to(torch.int32).contiguous() if as_int else t.float().contiguous()
        return hook

    for l, layer in enumerate(model.model.layers):
        handles.append(layer.register_forward_hook(save(f"layer_out_{k}_L{l}")))
        handles.append(layer.self_attn.register_forward_hook(save(f"attn_out_{k}_L{l}")))
        handles.append(layer.mlp.register_forward_hook(save(f"mlp_out_{k}_L{l}")))
        indexer = getattr(layer.self_attn, "indexer", None)
        compressor = getattr(layer.self_attn, "compressor", None)
        if compressor is not None:
            handles.append(compressor.register_forward_hook(
                lambda _m, _a, o, l=l: out.__setitem__(f"compressed_{k}_L{l}", o[0].detach()[0, 0].float().contiguous())))
            indexer = getattr(compressor, "indexer", None)
        if indexer is not None:
            handles.append(indexer.register_forward_hook(save(f"topk_{k}_L{l}", as_int=True)))
    if hasattr(model.model, "hc_head"):
        handles.append(model.model.hc_head.register_forward_hook(save(f"hc_head_out_{k}")))
    try:
        model(input_ids=torch.tensor([ids]), use_cache=False)
    finally:
        for h in handles:
            h.remove()
    return out


@torch.no_grad()
def v32_index_margins(model, ids):
    """Recomputes the V3.2 indexer scores of a no-cache forward over `ids` (the same math as
    DeepseekV32Indexer.forward, minus the top-k) and reports, over every layer and every query
    with more causal keys than index_topk, the smallest gap between the k-th and (k+1)-th best
    score (a selection boundary a float rounding could flip), the number of exact ties there,
    and whether this recomputation selects the same key sets as transformers did."""
    stats = dict(min_boundary_gap=None, exact_boundary_ties=0, sparse_queries=0, selection_matches_hf=True)
    handles = []

    def hook(module, args, kwargs, output):
        hs = args[0] if len(args) > 0 else kwargs["hidden_states"]
        q_resid = args[1] if len(args) > 1 else kwargs["q_resid"]
        cos, sin = args[2] if len(args) > 2 else kwargs["position_embeddings"]
        bsz, seq, _ = hs.shape
        rope = module.qk_rope_head_dim
        helpers = sys.modules[type(module).__module__]
        q = module.wq_b(q_resid).view(bsz, seq, module.n_heads, module.head_dim)
        q_rot, q_pass = torch.split(q, [rope, module.head_dim - rope], dim=-1)
        key = module.k_norm(module.wk(hs)).unsqueeze(2)
        k_rot, k_pass = torch.split(key, [rope, module.head_dim - rope], dim=-1)
        q_rot, k_rot = helpers.apply_rotary_pos_emb(q_rot, k_rot, cos, sin, unsqueeze_dim=2)
        q = torch.cat([q_rot, q_pass], dim=-1)
        key = torch.cat([k_rot, k_pass], dim=-1).squeeze(2)
        scores = torch.relu(torch.matmul(q.float(), key.transpose(-1, -2).float().unsqueeze(1)) * module.softmax_scale)
        weights = module.weights_proj(hs.to(module.weights_proj.weight.dtype)).float() * (module.n_heads ** -0.5)
        index = torch.matmul(weights.unsqueeze(-2), scores).squeeze(-2)[0]  # [S, T]
        topk = module.index_topk
        for s in range(seq):
            n = s + 1  # no cache: query s sees keys [0, s]
            if n <= topk:
                continue
            stats["sparse_queries"] += 1
            vals, order = index[s, :n].sort(descending=True)
            gap = float(vals[topk - 1] - vals[topk])
            if stats["min_boundary_gap"] is None or gap < stats["min_boundary_gap"]:
                stats["min_boundary_gap"] = gap
            if gap == 0.0:
                stats["exact_boundary_ties"] += 1
            hf = set(int(x) for x in output[0, s].tolist())
            if hf != set(int(x) for x in order[:topk].tolist()):
                stats["selection_matches_hf"] = False

    for layer in model.model.layers:
        handles.append(layer.self_attn.indexer.register_forward_hook(hook, with_kwargs=True))
    try:
        model(input_ids=torch.tensor([ids]), use_cache=False)
    finally:
        for h in handles:
            h.remove()
    return stats


@torch.no_grad()
def v4_index_margins(model, ids):
    """The V4 CSA indexer's counterpart of v32_index_margins(): the scorer's index scores of a
    no-cache forward over `ids`, per query over its causally visible compressed entries
    (w < (position + 1) // compress_rate), whenever there are more than index_topk of them."""
    stats = dict(min_boundary_gap=None, exact_boundary_ties=0, sparse_queries=0)
    handles = []

    def make_hook(indexer):
        def hook(_module, _args, output):
            index = output[0].float()  # [S, T]
            topk, rate = indexer.index_topk, indexer.compress_rate
            for s in range(index.shape[0]):
                visible = min((s + 1) // rate, index.shape[1])
                if visible <= topk:
                    continue
                stats["sparse_queries"] += 1
                vals = index[s, :visible].sort(descending=True).values
                gap = float(vals[topk - 1] - vals[topk])
                if stats["min_boundary_gap"] is None or gap < stats["min_boundary_gap"]:
                    stats["min_boundary_gap"] = gap
                if gap == 0.0:
                    stats["exact_boundary_ties"] += 1
        return hook

    for layer in model.model.layers:
        compressor = getattr(layer.self_attn, "compressor", None)
        indexer = getattr(compressor, "indexer", None)
        if indexer is not None:
            handles.append(indexer.scorer.register_forward_hook(make_hook(indexer)))
    try:
        model(input_ids=torch.tensor([ids]), use_cache=False)
    finally:
        for h in handles:
            h.remove()
    return stats


def index_margins(model, ids):
    if model.config.model_type == "deepseek_v32":
        return v32_index_margins(model, ids)
    return v4_index_margins(model, ids)


MIN_INDEX_GAP = 1e-5  # an indexer top-k boundary closer than this is too close to call


@torch.no_grad()
def prompt_is_well_posed(model, prompt):
    """True iff greedy decoding of `prompt` has no top-k boundary that float rounding or a
    tie-break could flip: HF's cached decoding equals its recomputation, and the indexer's
    k-th and (k+1)-th scores differ by MIN_INDEX_GAP or more at every sparse query. (With
    ReLU'd scores, exact ties at 0 occur; which side torch.topk keeps is unspecified, and
    transformers' own cached and uncached paths then disagree.)"""
    try:
        ids, logits = greedy_with_cache(model, prompt)
    except Exception:
        ids, logits = greedy_recompute(model, prompt)
    full = full_forward_logits(model, prompt.tolist() + ids)
    plen = prompt.numel()
    if float((full[plen - 1:plen - 1 + NUM_NEW_TOKENS] - logits).abs().max()) > 1e-4:
        return False
    stats = index_margins(model, prompt.tolist() + ids)
    return stats["exact_boundary_ties"] == 0 and (stats["min_boundary_gap"] is None or
                                                  stats["min_boundary_gap"] >= MIN_INDEX_GAP)


def pick_prompts(model, spec, vocab, tries=16):
    """Per prompt length, the first random prompt (seeded) that prompt_is_well_posed()."""
    prompts, attempts = [], []
    for k, n in enumerate(spec.get("prompt_lengths", PROMPT_LENGTHS)):
        for attempt in range(tries):
            gen = torch.Generator().manual_seed(spec["seed"] + 1 + 1000 * attempt + k)
            prompt = torch.randint(2, vocab, (n,), generator=gen)
            if prompt_is_well_posed(model, prompt):
                break
        prompts.append(prompt)
        attempts.append(attempt + 1)
    return prompts, attempts


@torch.no_grad()
def dense_selection_diff(model, ids):
    """Max |logit| change when every indexer keeps all candidates (index_topk huge): shows that
    the sparse selection actually matters for these prompts."""
    indexers = [m for m in model.modules() if hasattr(m, "index_topk")]
    saved = [m.index_topk for m in indexers]
    sparse = full_forward_logits(model, ids)
    try:
        for m in indexers:
            m.index_topk = 1 << 30
        dense = full_forward_logits(model, ids)
    finally:
        for m, v in zip(indexers, saved):
            m.index_topk = v
    return float((sparse - dense).abs().max())


def run_goldens(model, prompts):
    """Decodes every prompt; returns (per-prompt records, tensors to save)."""
    records, tensors = [], {}
    for k, prompt in enumerate(prompts):
        cache_error = None
        try:
            ids, logits = greedy_with_cache(model, prompt)
        except Exception:  # a broken cache path must not cost the goldens: recompute instead
            cache_error = traceback.format_exc()
            log(f"  decoding with the cache failed, recomputing every step: {cache_error}")
            ids, logits = greedy_recompute(model, prompt)
        full = full_forward_logits(model, prompt.tolist() + ids)
        plen = prompt.numel()
        recompute_diff = float((full[plen - 1:plen - 1 + NUM_NEW_TOKENS] - logits).abs().max())
        top2 = logits.topk(2, dim=-1).values
        record = dict(
            prompt_len=plen,
            output_ids=ids,
            hit_eos=model.config.eos_token_id in ids,
            cache_vs_recompute_max_abs_diff=recompute_diff,
            max_abs_logit=float(logits.abs().max()),
            # How decisive greedy is: a tolerance-based comparison must stay below this.
            min_top1_top2_margin=float((top2[:, 0] - top2[:, 1]).min()),
        )
        if cache_error:
            record["cache_error"] = cache_error
        try:
            record["generate_crosscheck"] = generate_crosscheck(model, prompt, ids, logits)
        except Exception as exc:  # informative only; the loop above is the reference
            record["generate_crosscheck"] = dict(error=repr(exc))
        tensors[f"logits_{k}"] = logits.contiguous()
        tensors[f"prefill_logits_{k}"] = full[:plen].clone()
        if model.config.model_type in ("deepseek_v32", "deepseek_v4"):
            # The no-cache forward over prompt + output as well: the reference for decoding
            # should transformers' cached path ever disagree with its recomputation.
            tensors[f"full_logits_{k}"] = full.clone()
        records.append(record)
    return records, tensors


# ---------------------------------------------------------------------------------------------
# Legacy DeepSeek rope form (v2_lite)
# ---------------------------------------------------------------------------------------------


def rewrite_config_legacy_rope(path):
    """Turns `rope_parameters` into DeepSeek's own config.json form:
    top-level rope_theta + rope_scaling{"type": "yarn", factor, original_max_position_embeddings,
    beta_fast, beta_slow, mscale, mscale_all_dim}."""
    cfg_path = os.path.join(path, "config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    rope = cfg.pop("rope_parameters")
    cfg["rope_theta"] = rope["rope_theta"]
    cfg["rope_scaling"] = {"type": rope["rope_type"]}
    for key in ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow",
                "mscale", "mscale_all_dim"):
        cfg["rope_scaling"][key] = rope[key]
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")


def rewrite_config_legacy_v4(path):
    """Turns the V4 config.json save_pretrained wrote into DeepSeek's own spelling:
    compress_ratios (per layer: 0 sliding, the CSA / HCA rate otherwise) for layer_types and
    compress_rates, num_hash_layers for mlp_layer_types, qk_rope_head_dim for
    partial_rotary_factor, and top-level rope_theta + compress_rope_theta + rope_scaling
    {"type": "yarn", ...} for the nested rope_parameters."""
    cfg_path = os.path.join(path, "config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    rates = cfg.pop("compress_rates", None) or {"compressed_sparse_attention": 4,
                                                "heavily_compressed_attention": 128}
    ratio_of = {"sliding_attention": 0,
                "compressed_sparse_attention": rates["compressed_sparse_attention"],
                "heavily_compressed_attention": rates["heavily_compressed_attention"]}
    cfg["compress_ratios"] = [ratio_of[t] for t in cfg.pop("layer_types")]
    mlp_types = cfg.pop("mlp_layer_types")
    n_hash = 0
    while n_hash < len(mlp_types) and mlp_types[n_hash] == "hash_moe":
        n_hash += 1
    assert all(t == "moe" for t in mlp_types[n_hash:]), mlp_types
    cfg["num_hash_layers"] = n_hash
    factor = cfg.pop("partial_rotary_factor")
    cfg["qk_rope_head_dim"] = int(cfg["head_dim"] * factor)
    rope = cfg.pop("rope_parameters", None) or {}
    compress = rope.get("compress", rope)
    main = rope.get("main", {})
    cfg["rope_theta"] = main.get("rope_theta", cfg.get("rope_theta", 10000.0))
    cfg["compress_rope_theta"] = compress.get("rope_theta", cfg.get("compress_rope_theta"))
    if compress.get("rope_type", compress.get("type")) == "yarn":
        cfg["rope_scaling"] = {"type": "yarn"}
        for key in ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow"):
            cfg["rope_scaling"][key] = compress[key]
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")


# ---------------------------------------------------------------------------------------------
# Facts about the installed transformers
# ---------------------------------------------------------------------------------------------


def source_or_error(obj):
    try:
        return inspect.getsource(obj)
    except Exception as exc:
        return f"<no source: {exc!r}>\n"


def transformers_facts():
    """Source of the rope init functions, the legacy rope conversion and DeepseekV2Config."""
    import transformers.modeling_rope_utils as ru

    parts = [f"transformers {transformers.__version__}, torch {torch.__version__}, "
             f"safetensors {safetensors.__version__}\n"]
    funcs = getattr(ru, "ROPE_INIT_FUNCTIONS", {})
    parts.append(f"ROPE_INIT_FUNCTIONS: { {k: getattr(v, '__name__', v) for k, v in funcs.items()} }\n")
    shown = set()

    def show(title, obj):
        if id(obj) in shown:
            return
        shown.add(id(obj))
        parts.append(f"\n===== {title} =====\n{source_or_error(obj)}")

    for key in ("default", "yarn"):
        if key in funcs:
            show(f"ROPE_INIT_FUNCTIONS[{key!r}]", funcs[key])
    for name in ("_compute_default_rope_parameters", "_compute_yarn_parameters", "get_mscale"):
        if hasattr(ru, name):
            show(f"modeling_rope_utils.{name}", getattr(ru, name))
    # Everything in modeling_rope_utils that handles the legacy `rope_scaling` / `type` keys.
    for name, obj in sorted(vars(ru).items()):
        if (inspect.isfunction(obj) or inspect.isclass(obj)) and getattr(obj, "__module__", "") == ru.__name__:
            src = source_or_error(obj)
            if "rope_scaling" in src and name not in ("ROPE_INIT_FUNCTIONS",):
                show(f"modeling_rope_utils.{name} (mentions rope_scaling)", obj)
    from transformers.models.deepseek_v2 import configuration_deepseek_v2, modeling_deepseek_v2
    show("DeepseekV2Config", configuration_deepseek_v2.DeepseekV2Config)
    show("DeepseekV2RotaryEmbedding.compute_default_rope_parameters",
         modeling_deepseek_v2.DeepseekV2RotaryEmbedding.compute_default_rope_parameters)
    # How checkpoint tensor names are mapped on load (and reversed on save): per-expert
    # `mlp.experts.E.{gate,up,down}_proj.weight` <-> fused `mlp.experts.gate_up_proj`/`down_proj`.
    # V3.2 / V4 pieces whose source the C++ engine follows: the activation behind
    # scoring_func="sqrtsoftplus", the sliding-window mask, and the V3.2 / V4 cache layers.
    try:
        from transformers.activations import ACT2FN
        act = ACT2FN["sqrtsoftplus"]
        show("ACT2FN['sqrtsoftplus']", act if inspect.isclass(act) or inspect.isfunction(act) else type(act))
    except Exception as exc:
        parts.append(f"\n===== ACT2FN['sqrtsoftplus']: unavailable ({exc!r}) =====\n")
    try:
        import transformers.masking_utils as mu
        for name in ("sliding_window_overlay", "sliding_window_causal_mask_function",
                     "create_sliding_window_causal_mask"):
            if hasattr(mu, name):
                show(f"masking_utils.{name}", getattr(mu, name))
        import transformers.cache_utils as cu
        for name, obj in sorted(vars(cu).items()):
            if inspect.isclass(obj) and ("Index" in name or name == "DynamicSlidingWindowLayer"):
                show(f"cache_utils.{name}", obj)
    except Exception as exc:
        parts.append(f"\n===== masking/cache sources: unavailable ({exc!r}) =====\n")
    try:
        import transformers.conversion_mapping as cm
        for model_type in ("deepseek_v2", "deepseek_v3", "deepseek_v32", "deepseek_v4"):
            alias = getattr(cm, "_MODEL_TO_CONVERSION_PATTERN", {}).get(model_type)
            conversions = cm.get_checkpoint_conversion_mapping(model_type)
            parts.append(f"\n===== checkpoint conversion for {model_type} (pattern {alias!r}) =====\n"
                         + "\n".join(repr(c) for c in (conversions or [])) + "\n")
    except Exception as exc:
        parts.append(f"\n===== conversion_mapping: unavailable ({exc!r}) =====\n")
    return "".join(parts)


def checkpoint_facts(name, path, model):
    lines = [f"\n===== {name}: config.head_dim = {getattr(model.config, 'head_dim', None)}, "
             f"qk_head_dim = {getattr(model.config, 'qk_head_dim', None)}, "
             f"experts_implementation = {getattr(model.config, '_experts_implementation', None)}, "
             f"rope_parameters (as loaded) = {dict(model.config.rope_parameters)} =====\n",
             f"--- {name}/model.safetensors tensors ---\n"]
    with safetensors.safe_open(os.path.join(path, "model.safetensors"), framework="pt") as f:
        lines.append(f"metadata: {f.metadata()}\n")
        for key in sorted(f.keys()):
            sl = f.get_slice(key)
            lines.append(f"{key} {list(sl.get_shape())} {sl.get_dtype()}\n")
    with open(os.path.join(path, "config.json")) as f:
        lines.append(f"--- {name}/config.json ---\n{f.read()}\n")
    return "".join(lines)


# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------


def make_one(name, spec, out_root):
    log(f"=== {name}")
    path = os.path.join(out_root, name)
    shutil.rmtree(path, ignore_errors=True)
    new_family = spec.get("new_family", False)
    model_cls, config = make_config(spec)
    model = model_cls(config)
    randomize_weights(model, spec["seed"])
    kept_fp32 = None
    if new_family:
        randomize_new_family_extras(model, spec["seed"])
        _, kept_fp32 = to_bf16_keep_fp32_modules(model)
    else:
        to_bf16_keep_bias_fp32(model)
    model.save_pretrained(path, safe_serialization=True)
    for extra in os.listdir(path):  # keep only what the tests need
        if extra not in ("config.json", "model.safetensors"):
            os.remove(os.path.join(path, extra))

    gen = torch.Generator().manual_seed(spec["seed"] + 1)
    vocab = config.vocab_size
    prompts = [torch.randint(2, vocab, (n,), generator=gen) for n in spec.get("prompt_lengths", PROMPT_LENGTHS)]
    prompt_attempts = None
    if new_family:
        prompts, prompt_attempts = pick_prompts(load_fp32(model_cls, path), spec, vocab)
        log(f"  prompts picked after {prompt_attempts} attempts")

    legacy = None
    legacy_form = spec["legacy_rope"] or spec.get("legacy_v4", False)
    if legacy_form:
        # Reference run on the form save_pretrained wrote, then the same on the legacy form.
        with tempfile.TemporaryDirectory() as modern_dir:
            for f in ("config.json", "model.safetensors"):
                shutil.copy(os.path.join(path, f), modern_dir)
            with open(os.path.join(path, "config.json")) as f:
                modern_config_text = f.read()
            modern = load_fp32(model_cls, modern_dir)
            modern_rope = rope_summary(modern)
            modern_records, modern_tensors = run_goldens(modern, prompts)
            del modern
        if spec["legacy_rope"]:
            rewrite_config_legacy_rope(path)
        else:
            try:
                rewrite_config_legacy_v4(path)
                load_fp32(model_cls, path)
            except Exception:
                log(f"  legacy V4 rewrite failed, keeping the saved form: {traceback.format_exc()}")
                if os.path.exists(os.path.join(path, "config.json")):
                    shutil.move(os.path.join(path, "config.json"), os.path.join(path, "config.legacy.json"))
                with open(os.path.join(path, "config.json"), "w") as f:
                    f.write(modern_config_text)

    ref = load_fp32(model_cls, path)
    # The reloaded fp32 weights must be exactly the bf16 values that were saved.
    saved = model.state_dict()
    weight_diff = max(float((ref.state_dict()[k].float() - v.float()).abs().max()) for k, v in saved.items())
    records, tensors = run_goldens(ref, prompts)
    rope = rope_summary(ref)

    if legacy_form:
        legacy = dict(
            rope_summary_equal=modern_rope == rope,
            rope_parameters_modern=modern_rope["rope_parameters"],
            rope_parameters_legacy=rope["rope_parameters"],
            output_ids_equal=[a["output_ids"] == b["output_ids"] for a, b in zip(modern_records, records)],
            max_abs_logit_diff=max(float((modern_tensors[k] - tensors[k]).abs().max()) for k in tensors),
        )
        log(f"  legacy form check: {legacy}")
        if spec.get("legacy_v4") and not (all(legacy["output_ids_equal"]) and legacy["max_abs_logit_diff"] < 1e-5):
            # transformers reads the legacy spelling differently: keep the form it wrote, whose
            # goldens are the reference, and leave the legacy text beside it for the record.
            log("  legacy V4 form does not reproduce the saved form; keeping the saved config.json")
            shutil.move(os.path.join(path, "config.json"), os.path.join(path, "config.legacy.json"))
            with open(os.path.join(path, "config.json"), "w") as f:
                f.write(modern_config_text)
            legacy["kept"] = "saved form (config.legacy.json is the rejected legacy rewrite)"
            ref = load_fp32(model_cls, path)
            records, tensors = run_goldens(ref, prompts)
            rope = rope_summary(ref)

    diagnostics = None
    if new_family:
        diagnostics = dict(prompt_attempts=prompt_attempts, dense_selection_max_abs_logit_diff=[],
                           index_margins=[], errors=[])
        debug = {}
        for k, (prompt, record) in enumerate(zip(prompts, records)):
            ids = prompt.tolist() + record["output_ids"]
            for key, fn in (("debug", lambda: debug.update(debug_tensors(ref, ids, k))),
                            ("dense_selection_max_abs_logit_diff",
                             lambda: diagnostics["dense_selection_max_abs_logit_diff"].append(
                                 dense_selection_diff(ref, ids))),
                            ("index_margins",
                             lambda: diagnostics["index_margins"].append(index_margins(ref, ids)))):
                try:
                    fn()
                except Exception:
                    diagnostics["errors"].append(f"{key} prompt {k}: {traceback.format_exc()}")
                    log(f"  diagnostic {key} failed: {traceback.format_exc()}")
        debug = {key: t for key, t in debug.items() if t.numel() > 0}
        if debug:
            safetensors.torch.save_file(debug, os.path.join(path, "golden_debug.safetensors"))
        log(f"  diagnostics: { {k: v for k, v in diagnostics.items() if k != 'errors'} }")

    golden = dict(
        name=name,
        model_class=spec["cls"],
        model_type=config.model_type,
        transformers_version=transformers.__version__,
        torch_version=torch.__version__,
        seed=spec["seed"],
        prompts=[p.tolist() for p in prompts],
        output_ids=[r["output_ids"] for r in records],
        per_prompt=records,
        reload_weight_max_abs_diff=weight_diff,
        hf_rope=rope,
        experts_implementation=getattr(ref.config, "_experts_implementation", None),
        loading_problems=ref.loading_problems,
        legacy_rope_check=legacy,
        kept_fp32=kept_fp32,
        diagnostics=diagnostics,
        notes=(
            "Weights saved in bf16 (e_score_correction_bias in fp32); reference computed by "
            "from_pretrained(dtype=float32, attn_implementation='eager') on CPU, so the math is "
            "fp32 on the exact bf16 values. Greedy decoding, plain argmax over the whole vocab "
            "(EOS not suppressed, decoding never stops early; see per_prompt.hit_eos). "
            "golden_logits.safetensors: logits_k [16, vocab] float32, row s = logits that "
            "produced output_ids[k][s] (prefill then one-token steps with the KV cache); "
            "prefill_logits_k [len(prompt_k), vocab] = no-cache forward over prompt_k. "
            "cache_vs_recompute_max_abs_diff compares logits_k with a single no-cache forward "
            "over prompt+output at the same positions."
            + (" config.json was rewritten to DeepSeek's legacy rope_theta/rope_scaling "
               "form; legacy_rope_check compares with the rope_parameters form."
               if spec["legacy_rope"] else "")
            + (" V3.2/V4: each prompt is the first seeded random prompt of its length that is "
               "well posed (prompt_is_well_posed: no indexer top-k boundary within 1e-5, "
               "transformers' cached decoding equal to its recomputation); full_logits_k "
               "[len(prompt_k) + 16, vocab] = no-cache forward over prompt_k + output; "
               "golden_debug.safetensors holds intermediate tensors (debug_tensors())."
               if new_family else "")
        ),
    )
    with open(os.path.join(path, "golden.json"), "w") as f:
        json.dump(golden, f, indent=1, default=str)
        f.write("\n")
    safetensors.torch.save_file(tensors, os.path.join(path, "golden_logits.safetensors"))
    for k, r in enumerate(records):
        log(f"  prompt {k} len {r['prompt_len']}: ids {r['output_ids']} eos={r['hit_eos']} "
            f"cache-vs-recompute {r['cache_vs_recompute_max_abs_diff']:.3g} "
            f"generate {r['generate_crosscheck']}")
    log(f"  reload weight diff {weight_diff}, rope {rope}")
    return checkpoint_facts(name, path, ref)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)),
                        help="root folder for <name>/ outputs (default: this script's folder)")
    parser.add_argument("--facts", default=None, help="facts file (default <out>/hf_facts.txt)")
    parser.add_argument("--only", nargs="*", default=None,
                        help="subset of config names; 'new' stands for the V3.2 and V4 ones")
    args = parser.parse_args()
    if args.only:
        args.only = [n for name in args.only for n in (NEW_FAMILY_CONFIGS if name == "new" else [name])]
        unknown = [n for n in args.only if n not in CONFIGS]
        if unknown:
            parser.error(f"unknown config names {unknown}; known: {list(CONFIGS)}")

    torch.set_num_threads(min(8, os.cpu_count() or 1))
    os.makedirs(args.out, exist_ok=True)
    facts = [transformers_facts()]
    failed = []
    for name, spec in CONFIGS.items():
        if args.only and name not in args.only:
            continue
        try:
            facts.append(make_one(name, spec, args.out))
        except Exception:
            failed.append(name)
            facts.append(f"\n===== {name}: FAILED =====\n{traceback.format_exc()}")
            traceback.print_exc()
    facts_path = args.facts or os.path.join(args.out, "hf_facts.txt")
    with open(facts_path, "w") as f:
        f.write("".join(facts))
    log(f"facts -> {facts_path}; failed: {failed or 'none'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
