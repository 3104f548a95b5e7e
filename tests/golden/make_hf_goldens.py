#!/usr/bin/env python3
"""Generate tiny DeepSeek V2/V3 reference checkpoints and greedy-decoding goldens with HF transformers.

The moesh C++ engine is tested against these files: each tiny checkpoint is produced by
transformers' own `save_pretrained`, and the goldens are transformers' own fp32 logits for
greedy decoding with a KV cache.  Nothing here is needed at build time; the outputs are
committed under tests/golden/<name>/ and this script documents (and can regenerate) them.

Usage (needs torch, transformers >= 5, safetensors; runs on CPU in about a minute):

    python3 tests/golden/make_hf_goldens.py --out tests/golden [--facts FILE]

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
}


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
        if type(module).__name__.endswith("RMSNorm"):
            norm_params.add(id(module.weight))
    for _name, param in model.named_parameters():  # tied lm_head/embedding appears once
        if id(param) in norm_params:
            param.copy_(1.0 + 0.1 * torch.randn_like(param))
        else:
            param.normal_(mean=0.0, std=0.05)
    for name, buf in model.named_buffers():
        if name.endswith("e_score_correction_bias"):
            buf.copy_(0.1 * torch.randn_like(buf))


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
    return dict(
        rope_parameters={k: v for k, v in dict(model.config.rope_parameters).items()},
        head_dim=getattr(model.config, "head_dim", None),
        inv_freq=[float(x) for x in rotary.inv_freq],
        attention_scaling=float(rotary.attention_scaling),
        softmax_scale=float(attn.scaling),
        rope_interleave=getattr(model.config, "rope_interleave", None),
    )


def run_goldens(model, prompts):
    """Decodes every prompt; returns (per-prompt records, tensors to save)."""
    records, tensors = [], {}
    for k, prompt in enumerate(prompts):
        ids, logits = greedy_with_cache(model, prompt)
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
        try:
            record["generate_crosscheck"] = generate_crosscheck(model, prompt, ids, logits)
        except Exception as exc:  # informative only; the loop above is the reference
            record["generate_crosscheck"] = dict(error=repr(exc))
        tensors[f"logits_{k}"] = logits.contiguous()
        tensors[f"prefill_logits_{k}"] = full[:plen].contiguous()
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
    try:
        import transformers.conversion_mapping as cm
        for model_type in ("deepseek_v2", "deepseek_v3"):
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
    model_cls, config = make_config(spec)
    model = model_cls(config)
    randomize_weights(model, spec["seed"])
    to_bf16_keep_bias_fp32(model)
    model.save_pretrained(path, safe_serialization=True)
    for extra in os.listdir(path):  # keep only what the tests need
        if extra not in ("config.json", "model.safetensors"):
            os.remove(os.path.join(path, extra))

    gen = torch.Generator().manual_seed(spec["seed"] + 1)
    vocab = config.vocab_size
    prompts = [torch.randint(2, vocab, (n,), generator=gen) for n in PROMPT_LENGTHS]

    legacy = None
    if spec["legacy_rope"]:
        # Reference run on the rope_parameters form, then the same on the legacy form.
        with tempfile.TemporaryDirectory() as modern_dir:
            for f in ("config.json", "model.safetensors"):
                shutil.copy(os.path.join(path, f), modern_dir)
            modern = load_fp32(model_cls, modern_dir)
            modern_rope = rope_summary(modern)
            modern_records, modern_tensors = run_goldens(modern, prompts)
        rewrite_config_legacy_rope(path)

    ref = load_fp32(model_cls, path)
    # The reloaded fp32 weights must be exactly the bf16 values that were saved.
    saved = model.state_dict()
    weight_diff = max(float((ref.state_dict()[k].float() - v.float()).abs().max()) for k, v in saved.items())
    records, tensors = run_goldens(ref, prompts)
    rope = rope_summary(ref)

    if spec["legacy_rope"]:
        legacy = dict(
            rope_summary_equal=modern_rope == rope,
            rope_parameters_modern=modern_rope["rope_parameters"],
            rope_parameters_legacy=rope["rope_parameters"],
            output_ids_equal=[a["output_ids"] == b["output_ids"] for a, b in zip(modern_records, records)],
            max_abs_logit_diff=max(float((modern_tensors[k] - tensors[k]).abs().max()) for k in tensors),
        )
        log(f"  legacy rope form check: {legacy}")

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
    parser.add_argument("--only", nargs="*", default=None, help="subset of config names")
    args = parser.parse_args()

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
