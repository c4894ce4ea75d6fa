"""
aogpt: the library behind the commands at the repository's root (train.py, sample.py, eval_ppl.py,
eval_harness.py, export.py) and the model they share (model.py, also at the root).

    errors        UserError, the library's one exception for bad input, and how a command prints it
    configurator  the command-line / config-file settings of every script, and how its processes end (Ctrl-C,
                  SIGTERM, a parent's death)
    runtime       device, dtype, autocast, process settings, torchrun ranks
    tokenizer     codecs (GPT-2 BPE, character level) and dataset metadata
    hub, evalsets the Hugging Face hub; the zero-shot eval sets and their detokenizers
    checkpoint    checkpoint and export files: reading, writing, resolving, the hub; paper_ckpt: the paper's
                  released checkpoints, converted to ours
    families      open causal LMs from a Hugging Face folder (GPT-2, Llama, Mistral, Qwen2, Qwen3) as our GPT, every
                  weight checked, what the block cannot represent refused by name
    paths         where a command writes, checked before the work (--save, --json_out, --runs_dir, ...)
    preflight, startup   train.py's checks before its first step; where its model and state come from (init_from)
    rundir, valloss, ema train.py's out_dir (lock, periodic copies), val losses, EMA
    optim         train.py's optimizers: AdamW, or Muon for the blocks' hidden matrices beside AdamW (configure_optimizers)
    engine        the KV caches (shared, per-sample) and how a forward call runs (dynamic, fixed shapes,
                  CUDA graphs)
    orders        the order distributions (semiar:K, nearl2r:W, mixtures) every command trains, samples, scores with
    generate      the samplers (Lemma 1 on the KV cache, AR, confidence samplers, the encoder MDM) and the one
                  temperature / top-p transform every draw goes through (logits_to_probs)
    samplers      the one settings object every sampler takes (Sampling), the encoder's EncoderPlan, and the
                  table of which sampler reads which setting (SAMPLERS)
    speculative   exact parallel decoding; genppl: generative perplexity; tracepage: --trace's HTML page
    likelihood    the estimators every score comes from: exact L2R, the any-order bound, the context-order
                  ensemble, the encoder MDM's ELBO
    plot          loss curves and eval bars

Modules are imported by their full name (`from aogpt.engine import KVCache`); nothing is re-exported here.
"""
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository: data/, config/
