#!/usr/bin/env python3
"""Side-by-side decode baseline: DeepSeek-V2-Lite shapes through Hugging Face transformers.

Builds DeepseekV2ForCausalLM at DeepSeek-V2-Lite's real shapes with random (dummy) bf16
weights directly on the GPU, prefills `--context` random tokens per sequence into a
DynamicCache (chunked along the sequence so eager attention's [batch, heads, q, kv] score
tensor stays bounded), then times `--steps` greedy decode steps of one token per sequence.
The figure to compare with moesh's own decode benchmark is tok/s = batch / median step time.

Run on the GPU machine (no internet needed; nothing is downloaded):
    python3 tools/device/hf_baseline.py --batch 32 --context 2048 --out $OUT/hf_baseline.json
Other forms:
    python3 tools/device/hf_baseline.py --batch 1,32,128,256
    python3 tools/device/hf_baseline.py --experts eager,grouped_mm   # also transformers' default MoE backend

Notes on what is measured (transformers 5.17, models/deepseek_v2/modeling_deepseek_v2.py):
  * The KV cache holds the compressed MLA latent (kv_a_layernorm(kv) [B,1,S,512] and the roped
    k_pe [B,1,S,64]); every step re-expands the whole cached sequence through kv_b_proj and
    runs eager attention over it. That is transformers' algorithm, not ours.
  * `--experts eager` (default) is the Python loop over the experts hit (DeepseekV2Experts.forward);
    `grouped_mm` / `batched_mm` are transformers' other built-in MoE backends.
  * Decode is fed the way GenerationMixin's greedy loop does it: the argmax token of the last
    logits, one per sequence, with past_key_values and explicit position_ids (the 5.17 model
    has no cache_position argument; it derives the causal mask from position_ids and the
    cache length), logits_to_keep=1, under torch.no_grad().
"""

import argparse
import contextlib
import dataclasses
import gc
import json
import os
import statistics
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
import transformers  # noqa: E402

try:
    from transformers import DeepseekV2Config, DeepseekV2ForCausalLM
except ImportError:  # pragma: no cover - older/odd layouts
    from transformers.models.deepseek_v2.configuration_deepseek_v2 import DeepseekV2Config
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2ForCausalLM

try:
    from transformers import DynamicCache
except ImportError:  # pragma: no cover
    from transformers.cache_utils import DynamicCache


def log(msg):
    print(f"[hf_baseline {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# DeepSeek-V2-Lite (deepseek-ai/DeepSeek-V2-Lite config.json), in the field names that
# transformers 5.17's DeepseekV2Config declares. rope is plain (no yarn) at theta 10000, as in
# moesh's benchmark; yarn would only change inv_freq and the softmax scale, not the cost.
def lite_config_kwargs(max_positions):
    return dict(
        vocab_size=102400,
        hidden_size=2048,
        intermediate_size=10944,  # the dense MLP of layer 0 (first_k_dense_replace=1)
        moe_intermediate_size=1408,
        num_hidden_layers=27,
        num_attention_heads=16,
        num_key_value_heads=16,
        n_shared_experts=2,
        n_routed_experts=64,  # read by the model as config.num_experts (attribute_map)
        num_experts_per_tok=6,
        routed_scaling_factor=1.0,
        topk_method="greedy",
        n_group=1,
        topk_group=1,
        norm_topk_prob=False,
        first_k_dense_replace=1,
        kv_lora_rank=512,
        q_lora_rank=None,  # V2-Lite: plain q_proj, no q LoRA
        qk_rope_head_dim=64,
        qk_nope_head_dim=128,
        v_head_dim=128,
        hidden_act="silu",
        max_position_embeddings=max_positions,
        initializer_range=0.02,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        attention_bias=False,
        attention_dropout=0.0,
        mlp_bias=False,
        tie_word_embeddings=False,
        use_cache=True,
    )


def make_config(max_positions):
    kwargs = lite_config_kwargs(max_positions)
    try:
        known = {f.name for f in dataclasses.fields(DeepseekV2Config)}
    except TypeError:  # not a dataclass in this version: pass everything
        known = set(kwargs)
    ctor = {k: v for k, v in kwargs.items() if k in known}
    late = {k: v for k, v in kwargs.items() if k not in known}
    if late:
        log(f"config fields not declared by DeepseekV2Config, set as attributes: {sorted(late)}")
    config = DeepseekV2Config(**ctor)
    for k, v in late.items():
        setattr(config, k, v)
    # Fail loudly if the config does not hold the shapes we asked for.
    expect = dict(
        num_experts=64,
        num_experts_per_tok=6,
        n_shared_experts=2,
        moe_intermediate_size=1408,
        first_k_dense_replace=1,
        num_hidden_layers=27,
        hidden_size=2048,
        num_attention_heads=16,
        kv_lora_rank=512,
        q_lora_rank=None,
        qk_rope_head_dim=64,
        qk_nope_head_dim=128,
        v_head_dim=128,
        vocab_size=102400,
        topk_method="greedy",
    )
    for k, v in expect.items():
        got = getattr(config, k, "<missing>")
        if got != v:
            raise SystemExit(f"config.{k} = {got!r}, expected {v!r}")
    rope = getattr(config, "rope_parameters", None) or {}
    log(
        f"config ok: head_dim={getattr(config, 'head_dim', None)} rope={dict(rope)} "
        f"max_pos={config.max_position_embeddings}"
    )
    return config


def no_init_context():
    """transformers' own 'skip weight init' switch; every parameter is overwritten afterwards."""
    for modname in ("transformers.initialization", "transformers.modeling_utils"):
        try:
            mod = __import__(modname, fromlist=["no_init_weights"])
            return mod.no_init_weights()
        except (ImportError, AttributeError):
            continue
    log("no_init_weights not found; transformers will initialize on the GPU (slower, still correct)")
    return contextlib.nullcontext()


def build_model(config, device, attn, experts, seed, std):
    t0 = time.perf_counter()
    dtype = torch.bfloat16
    model = None
    with torch.device(device), no_init_context():
        try:
            model = DeepseekV2ForCausalLM._from_config(
                config, dtype=dtype, attn_implementation=attn, experts_implementation=experts
            )
        except Exception as e:  # noqa: BLE001 - fall back to the plain constructor
            log(f"_from_config failed ({type(e).__name__}: {e}); using the constructor")
            config._attn_implementation = attn
            try:
                config._experts_implementation = experts
            except Exception as e2:  # noqa: BLE001
                log(f"cannot set _experts_implementation on the config: {e2}")
            old = torch.get_default_dtype()
            torch.set_default_dtype(dtype)
            try:
                model = DeepseekV2ForCausalLM(config)
            finally:
                torch.set_default_dtype(old)
    model.eval()
    log(f"model constructed in {time.perf_counter() - t0:.1f}s; initializing weights")

    # Random weights, drawn on the GPU: N(0, std) for every matrix/expert tensor, ones for the
    # RMSNorm scales (the only 1-D parameters; this config has no biases).
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)
    n_params = 0
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.device.type != "cuda" or p.dtype != dtype:
                p.data = p.data.to(device=device, dtype=dtype)
            if p.dim() == 1:
                if name.endswith("bias"):
                    p.zero_()
                else:
                    p.fill_(1.0)
            else:
                p.normal_(mean=0.0, std=std)
            n_params += p.numel()
        for name, b in model.named_buffers():
            if b.device.type != "cuda":
                log(f"buffer {name} on {b.device}; moving to {device}")
                b.data = b.data.to(device)
    torch.cuda.synchronize()
    log(
        f"weights ready: {n_params / 1e9:.2f}B params, "
        f"{torch.cuda.memory_allocated() / 2**30:.1f} GiB allocated, "
        f"build {time.perf_counter() - t0:.1f}s"
    )
    return model, n_params, time.perf_counter() - t0


def set_experts(model, experts):
    if hasattr(model, "set_experts_implementation"):
        model.set_experts_implementation(experts)
    else:
        model.config._experts_implementation = experts


def current_impls(model):
    attn = getattr(model.config, "_attn_implementation", None)
    experts = getattr(model.config, "_experts_implementation", None)
    return attn, experts


def new_cache(model):
    try:
        return DynamicCache(config=model.config)
    except TypeError:
        return DynamicCache()


def forward(model, ids, start, cache):
    """One forward of ids [B, q] at positions [start, start+q) appending to cache; returns logits [B, 1, V]."""
    q = ids.shape[1]
    pos = torch.arange(start, start + q, device=ids.device, dtype=torch.long).unsqueeze(0)
    out = model(
        input_ids=ids,
        position_ids=pos,
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=1,
    )
    return out.logits


class ExpertHitProbe:
    """Counts distinct routed experts per MoE layer for one forward (diagnostic, untimed)."""

    def __init__(self, model):
        self.routers = [m for m in model.modules() if type(m).__name__.endswith("TopkRouter")]
        self.hits = []
        self.handles = []

    def _hook(self, module, inputs, output):
        if isinstance(output, tuple) and len(output) >= 3:
            self.hits.append(int(output[2].unique().numel()))

    def __enter__(self):
        self.handles = [r.register_forward_hook(self._hook) for r in self.routers]
        return self

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()
        self.handles = []
        return False


def is_oom(e):
    if isinstance(e, torch.cuda.OutOfMemoryError):
        return True
    return isinstance(e, RuntimeError) and "out of memory" in str(e).lower()


def run_one(model, args, batch, experts, label, device):
    row = dict(
        impl=label,
        attn=args.attn,
        experts=experts,
        batch=batch,
        context=args.context,
        steps=args.steps,
        warmup=args.warmup,
        feed=args.feed,
        status="ok",
    )
    vocab = model.config.vocab_size
    gen = torch.Generator(device=device)
    gen.manual_seed(args.seed + batch)
    chunk = max(1, min(args.context, args.prefill_tokens // batch))
    row["prefill_chunk"] = chunk
    cache = None
    try:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        with torch.no_grad():
            # Untimed warm-up forward (cuBLAS handles, allocator) on a throwaway cache.
            warm = torch.randint(0, vocab, (batch, min(16, args.context)), device=device, generator=gen)
            forward(model, warm, 0, new_cache(model))
            del warm
            torch.cuda.synchronize()

            ids = torch.randint(0, vocab, (batch, args.context), device=device, generator=gen)
            cache = new_cache(model)
            n_chunks = (args.context + chunk - 1) // chunk
            log(f"[{label} b={batch}] prefill {args.context} tokens/seq in {n_chunks} chunks of {chunk}")
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            logits = None
            for i, s in enumerate(range(0, args.context, chunk)):
                e = min(args.context, s + chunk)
                logits = forward(model, ids[:, s:e], s, cache)
                if args.verbose or i == 0 or i == n_chunks - 1:
                    torch.cuda.synchronize()
                    log(f"[{label} b={batch}]   chunk {i + 1}/{n_chunks} done, {time.perf_counter() - t0:.2f}s")
            torch.cuda.synchronize()
            prefill_s = time.perf_counter() - t0
            row["prefill_s"] = prefill_s
            row["prefill_tok_s"] = batch * args.context / prefill_s
            row["logits_finite"] = bool(torch.isfinite(logits).all().item())
            row["cache_len_after_prefill"] = int(cache.get_seq_length())
            log(
                f"[{label} b={batch}] prefill {prefill_s:.2f}s = {row['prefill_tok_s']:.0f} tok/s, "
                f"cache len {row['cache_len_after_prefill']}, logits finite {row['logits_finite']}"
            )
            del ids

            pos = args.context
            total_steps = args.warmup + args.steps + 1
            if args.feed == "random":
                feed_ids = torch.randint(0, vocab, (total_steps, batch), device=device, generator=gen)
            next_tok = logits[:, -1, :].argmax(dim=-1)
            del logits

            def step(i):
                nonlocal next_tok, pos
                cur = feed_ids[i] if args.feed == "random" else next_tok
                lg = forward(model, cur.unsqueeze(1), pos, cache)
                next_tok = lg[:, -1, :].argmax(dim=-1)
                pos += 1

            for i in range(args.warmup):
                step(i)
            torch.cuda.synchronize()
            times = []
            for i in range(args.steps):
                t = time.perf_counter()
                step(args.warmup + i)
                torch.cuda.synchronize()
                times.append(time.perf_counter() - t)
                if args.verbose or i == 0 or i == args.steps - 1:
                    log(f"[{label} b={batch}]   decode step {i + 1}/{args.steps}: {times[-1] * 1e3:.1f} ms")
            # One more untimed step with the router probe on.
            with ExpertHitProbe(model) as probe:
                step(args.warmup + args.steps)
                torch.cuda.synchronize()
            row["unique_next_tokens"] = int(next_tok.unique().numel())
            if probe.hits:
                row["experts_hit_mean"] = sum(probe.hits) / len(probe.hits)
                row["experts_hit_min"] = min(probe.hits)
                row["experts_hit_max"] = max(probe.hits)
            med = statistics.median(times)
            row.update(
                step_ms_median=med * 1e3,
                step_ms_mean=statistics.fmean(times) * 1e3,
                step_ms_min=min(times) * 1e3,
                step_ms_max=max(times) * 1e3,
                step_ms_all=[t * 1e3 for t in times],
                tok_s=batch / med,
                cache_len_at_end=int(cache.get_seq_length()),
            )
    except Exception as e:  # noqa: BLE001
        if is_oom(e):
            row["status"] = "OOM"
            log(f"[{label} b={batch}] OOM: {str(e).splitlines()[0][:200]}")
        else:
            row["status"] = f"error: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
            log(f"[{label} b={batch}] {row['status']}")
            if args.raise_errors:
                raise
    finally:
        row["peak_mem_gib"] = torch.cuda.max_memory_allocated() / 2**30
        cache = None
        gc.collect()
        torch.cuda.empty_cache()
    return row


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def table(rows):
    lines = [
        "| impl | batch | context | step ms (median) | tok/s | prefill tok/s | peak GiB | experts hit/layer |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if r["status"] != "ok":
            lines.append(
                f"| {r['impl']} | {r['batch']} | {r['context']} | {r['status']} | - | "
                f"{fmt(r.get('prefill_tok_s'), '.0f')} | {fmt(r.get('peak_mem_gib'), '.1f')} | - |"
            )
            continue
        lines.append(
            f"| {r['impl']} | {r['batch']} | {r['context']} | {r['step_ms_median']:.2f} | {r['tok_s']:.1f} | "
            f"{r['prefill_tok_s']:.0f} | {r['peak_mem_gib']:.1f} | {fmt(r.get('experts_hit_mean'), '.1f')} |"
        )
    return "\n".join(lines)


def parse_ints(s):
    return [int(x) for x in s.split(",") if x.strip()]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", default="32", help="batch size or comma list, e.g. 1,32,128,256")
    ap.add_argument("--context", type=int, default=2048, help="prefilled tokens per sequence")
    ap.add_argument("--steps", type=int, default=16, help="timed decode steps")
    ap.add_argument("--warmup", type=int, default=2, help="untimed decode steps before timing")
    ap.add_argument("--attn", default="eager", help="attn_implementation (eager, sdpa, ...)")
    ap.add_argument(
        "--experts",
        default="eager",
        help="experts_implementation or comma list (eager, grouped_mm, batched_mm); "
        "transformers' own default is grouped_mm",
    )
    ap.add_argument(
        "--prefill-tokens",
        type=int,
        default=16384,
        help="tokens (batch x chunk) per prefill forward; bounds eager attention's score tensor",
    )
    ap.add_argument("--feed", choices=["argmax", "random"], default="argmax", help="decode input tokens")
    ap.add_argument("--std", type=float, default=0.02, help="std of the random weights")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="write rows + environment as JSON here")
    ap.add_argument("--verbose", action="store_true", help="log every chunk and step")
    ap.add_argument("--raise-errors", action="store_true", help="re-raise non-OOM errors")
    args = ap.parse_args()

    if not torch.cuda.is_available():
        raise SystemExit("CUDA is not available")
    device = torch.device("cuda", torch.cuda.current_device())
    batches = parse_ints(args.batch)
    experts_list = [x.strip() for x in args.experts.split(",") if x.strip()]
    if not batches or not experts_list or args.context < 1 or args.steps < 1:
        raise SystemExit("need at least one batch, one experts backend, context >= 1, steps >= 1")

    tf_ver = transformers.__version__
    tf_short = ".".join(tf_ver.split(".")[:2])
    props = torch.cuda.get_device_properties(device)
    meta = dict(
        torch=torch.__version__,
        torch_cuda=torch.version.cuda,
        transformers=tf_ver,
        gpu=torch.cuda.get_device_name(device),
        gpu_mem_gib=props.total_memory / 2**30,
        python=sys.version.split()[0],
        args=vars(args),
    )
    log(
        f"torch {meta['torch']} (CUDA {meta['torch_cuda']}), transformers {tf_ver}, "
        f"GPU {meta['gpu']} ({meta['gpu_mem_gib']:.0f} GiB)"
    )
    if not tf_ver.startswith("5.17"):
        log(f"WARNING: transformers {tf_ver} is not 5.17; results are labelled with the real version")
    try:
        import inspect

        meta["modeling_file"] = inspect.getsourcefile(DeepseekV2ForCausalLM)
        with open(meta["modeling_file"]) as f:
            src = f.read()
        # 5.17 caches the compressed latent and re-expands it every step (kv_b_proj over the cache).
        meta["caches_compressed_latent"] = "past_key_values.update(k_nope, k_pe" in src
        log(f"modeling file: {meta['modeling_file']} (caches compressed latent: {meta['caches_compressed_latent']})")
    except Exception:  # noqa: BLE001
        pass

    max_pos = max(4096, args.context + args.warmup + args.steps + 64)
    config = make_config(max_pos)
    model, n_params, build_s = build_model(config, device, args.attn, experts_list[0], args.seed, args.std)
    attn_impl, experts_impl = current_impls(model)
    log(f"attn_implementation={attn_impl} experts_implementation={experts_impl}")
    if attn_impl != args.attn:
        log(f"WARNING: requested attn {args.attn!r} but the model runs {attn_impl!r}")
    meta.update(params=n_params, build_s=build_s)
    try:
        meta["config"] = config.to_dict()
    except Exception as e:  # noqa: BLE001
        meta["config"] = f"to_dict failed: {e}"

    rows = []

    def dump():
        if not args.out:
            return
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(dict(meta=meta, rows=rows), f, indent=2, default=str)

    t_all = time.perf_counter()
    for experts in experts_list:
        try:
            set_experts(model, experts)
        except Exception as e:  # noqa: BLE001
            log(f"cannot switch experts implementation to {experts!r}: {e}")
            for b in batches:
                rows.append(dict(impl=f"transformers {tf_short} {args.attn} bf16 experts={experts}",
                                 batch=b, context=args.context, status=f"error: {e}"))
            dump()
            continue
        got = current_impls(model)[1]
        if got != experts:
            log(f"WARNING: requested experts {experts!r} but the model runs {got!r}")
        label = f"transformers {tf_short} {args.attn} bf16"
        if experts != "eager" or args.attn != "eager":
            label += f" experts={got}"
        for b in batches:
            log(f"=== {label}: batch {b}, context {args.context}, {args.steps} steps (+{args.warmup} warm-up)")
            row = run_one(model, args, b, experts, label, device)
            rows.append(row)
            if row["status"] == "ok":
                log(
                    f"[{label} b={b}] RESULT step {row['step_ms_median']:.2f} ms (median), "
                    f"{row['tok_s']:.1f} tok/s, prefill {row['prefill_tok_s']:.0f} tok/s, "
                    f"peak {row['peak_mem_gib']:.1f} GiB, experts hit/layer "
                    f"{fmt(row.get('experts_hit_mean'), '.1f')}, unique next tokens {row.get('unique_next_tokens')}"
                )
            dump()

    meta["total_s"] = time.perf_counter() - t_all
    meta["peak_mem_gib_overall"] = max((r.get("peak_mem_gib") or 0.0) for r in rows) if rows else None
    dump()
    print()
    print(
        f"torch {meta['torch']} (CUDA {meta['torch_cuda']}), transformers {tf_ver}, GPU {meta['gpu']}, "
        f"{n_params / 1e9:.2f}B params, peak memory {fmt(meta['peak_mem_gib_overall'], '.1f')} GiB "
        f"(torch.cuda.max_memory_allocated)"
    )
    print()
    print(table(rows), flush=True)
    if args.out:
        log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
