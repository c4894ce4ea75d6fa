"""
Open causal language models from a local Hugging Face folder, as our GPT (model.py): each family's config.json
read into a GPTConfig, and its names for the weights mapped to ours, every tensor checked.

    model = load_hf(folder, state_dict=None, cond='none', **overrides)    the source itself, or adapted into cond
    model, source = hf_source(folder, state_dict=None, **overrides)       and what it was: the record a run keeps
    config, source, rows = source_rows(folder, ...)     without the model: each parameter's rows, read when asked

Families: gpt2, llama (SmolLM2 is one), mistral (without a sliding window), qwen2, qwen3. In the identity order the
model is its source run on [none_id] + x: [None] is the source's own BOS embedding (bos_token_id), or, where it has
none (Qwen), that of its document separator (eos_token_id, or the data's end of document where the run names
one: <|endoftext|>); the record says which. A field that
would change the function and that the block cannot represent (a sliding window, another rope type, MoE, soft
caps, biases where the block has none) is a UserError naming it, never ignored: a silently different model is the
worst outcome. Weights are read from safetensors (one file, or the shards model.safetensors.index.json lists);
GPT-2's pytorch_model.bin through checkpoint.load_checkpoint's weights_only checks (open_weights: the one
place HF weights are read, only the rows asked for). Nothing is unpickled.
"""

if __name__ == '__main__':  # run as a script (python aogpt/families.py): one line, not an ImportError
    raise SystemExit("error: aogpt/families.py is a library module, with nothing to run: the commands are train.py, "
                     "sample.py, eval_ppl.py, eval_harness.py and export.py at the repository's root")

import functools
import json
import os

import torch

from aogpt.checkpoint import file_sha256
from aogpt.errors import UserError
from aogpt.parallel import materialise
from model import GPT, LLAMA3_KEYS, GPTConfig, adapt

ROTARY = ('llama', 'mistral', 'qwen2', 'qwen3')
CLASS_IDS = {'gpt2': (50256, 50256), 'llama': (1, 2), 'mistral': (1, 2)}  # (bos, eos) where config.json has none


def read_config(folder):
    path = os.path.join(folder, 'config.json')
    if not os.path.exists(path):
        raise UserError(f"{folder} is not a Hugging Face model folder: it has no config.json")
    try:
        with open(path) as f:
            hf = json.load(f)
    except (ValueError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read {path}: it is not JSON ({e})")
    if not isinstance(hf, dict) or hf.get('model_type') not in ('gpt2',) + ROTARY:
        raise UserError(f"{path}: model_type {hf.get('model_type') if isinstance(hf, dict) else hf!r} is not one "
                        f"this loader reads (gpt2, {', '.join(ROTARY)})")
    return hf


def _field(hf, key, default=KeyError, path=''):
    if key in hf and hf[key] is not None:
        return hf[key]
    if default is KeyError:
        raise UserError(f"{path}config.json has no {key}")
    return default


def _refuse(path, key, value, why):
    raise UserError(f"{path}config.json: {key}={value!r} {why}; this block cannot represent it, so the source is "
                    f"refused rather than loaded as a different model")


def _rope(hf, where):
    """(rope_theta, rope_scaling) from either layout: transformers 5's rope_parameters {rope_theta, rope_type, ...},
    or 4.x's top-level rope_theta and rope_scaling {type or rope_type, ...}."""
    params = hf.get('rope_parameters') or {}
    scaling = dict(hf.get('rope_scaling') or params)
    theta = float(params.get('rope_theta', hf.get('rope_theta', 10000.0)))
    kind = scaling.get('rope_type', scaling.get('type', 'default'))
    if scaling.get('partial_rotary_factor', hf.get('partial_rotary_factor', 1.0)) != 1.0:
        _refuse(where, 'partial_rotary_factor', scaling.get('partial_rotary_factor', hf.get('partial_rotary_factor')),
                "rotates part of each head")
    if kind == 'default':
        return theta, None
    if kind != 'llama3':
        _refuse(where, 'rope_type', kind, "is a rope other than the plain one and Llama 3's")
    missing = [k for k in LLAMA3_KEYS if k not in scaling]
    if missing:
        raise UserError(f"{where}config.json: the llama3 rope scaling has no {', '.join(missing)}")
    return theta, {k: scaling[k] for k in LLAMA3_KEYS}


# Each family's config.json keys that size the block: integers >= 1 (None: the class's default, where it has one),
# and numbers; and the key each GPTConfig field is read from, so that a value the block cannot take is named as the
# source's config.json spells it (JSON's 32.0 or "32" reached GPTConfig as a TypeError, or a ValueError naming ours)
SIZES = {'gpt2': ('n_positions', 'vocab_size', 'n_layer', 'n_head', 'n_embd', 'n_inner'),
         'rotary': ('max_position_embeddings', 'vocab_size', 'num_hidden_layers', 'num_attention_heads', 'hidden_size',
                    'num_key_value_heads', 'head_dim', 'intermediate_size')}
NUMBERS = {'gpt2': ('layer_norm_epsilon',), 'rotary': ('rms_norm_eps', 'rope_theta')}
FIELD_KEYS = {'gpt2': dict(zip(('block_size', 'vocab_size', 'n_layer', 'n_head', 'n_embd', 'mlp_hidden', 'norm_eps'),
                               SIZES['gpt2'][:6] + NUMBERS['gpt2'])),
              'rotary': dict(zip(('block_size', 'vocab_size', 'n_layer', 'n_head', 'n_embd', 'n_kv_head', 'head_dim',
                                  'mlp_hidden', 'norm_eps', 'rope_theta'), SIZES['rotary'] + NUMBERS['rotary']))}


def check_sizes(hf, where=''):
    """config.json's sizes and numbers, as the block needs them: one line naming the key and the folder."""
    kind = 'gpt2' if hf['model_type'] == 'gpt2' else 'rotary'
    params = hf.get('rope_parameters') if isinstance(hf.get('rope_parameters'), dict) else {}
    for key in SIZES[kind]:
        v = hf.get(key)
        if v is not None and not (isinstance(v, int) and not isinstance(v, bool) and v >= 1):
            raise UserError(f"{where}config.json: {key}={v!r} must be an integer >= 1 for this block")
    for key in NUMBERS[kind]:
        v = params.get(key, hf.get(key))
        if v is not None and not (isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < float('inf')):
            raise UserError(f"{where}config.json: {key}={v!r} must be a number > 0 for this block")


def source_config(hf, args, where='', **overrides):
    """GPTConfig(**args, **overrides) of a source's config.json (hf_config's args), or the line that names the
    config.json key whose value the block cannot take (an override's own ValueError is the caller's)."""
    try:
        return GPTConfig(**dict(args, **overrides))
    except ValueError as e:
        field = str(e).split()[0]
        if field in overrides:
            raise
        key = FIELD_KEYS['gpt2' if hf['model_type'] == 'gpt2' else 'rotary'].get(field)
        if field == 'rope_scaling':
            key = 'rope_parameters' if isinstance(hf.get('rope_parameters'), dict) else 'rope_scaling'
        shown = f"{key}={hf.get(key)!r}" if key in hf else f"its {key or field}"
        raise UserError(f"{where}config.json: {shown} cannot make this block ({e})") from None


def hf_config(hf, where=''):
    """GPTConfig arguments of a source's config.json (cond='none': the source itself), and [None]'s token id and
    which config field gave it."""
    f = lambda key, default=KeyError: _field(hf, key, default, where)  # noqa: E731
    family = hf['model_type']
    check_sizes(hf, where)
    for key in ('attn_logit_softcapping', 'final_logit_softcapping', 'num_experts', 'num_local_experts'):
        if hf.get(key):
            _refuse(where, key, hf[key], "changes the function (soft caps, a mixture of experts)")
    if family == 'gpt2':
        if f('activation_function', 'gelu_new') != 'gelu_new':
            _refuse(where, 'activation_function', hf['activation_function'], "is not GPT-2's gelu_new")
        for key in ('scale_attn_by_inverse_layer_idx', 'reorder_and_upcast_attn', 'add_cross_attention'):
            if hf.get(key):
                _refuse(where, key, hf[key], "changes GPT-2's attention")
        if not f('scale_attn_weights', True):
            _refuse(where, 'scale_attn_weights', False, "drops attention's 1/sqrt(head_dim)")
        args = dict(block_size=f('n_positions') - 1, vocab_size=f('vocab_size'), n_layer=f('n_layer'),
                    n_head=f('n_head'), n_embd=f('n_embd'), mlp_hidden=f('n_inner', 0), bias=True, norm='layer',
                    qk_norm=False, tie_head=f('tie_word_embeddings', True), head_bias=False, gelu='tanh',
                    norm_eps=float(f('layer_norm_epsilon', 1e-5)))
    else:
        if f('hidden_act', 'silu') != 'silu':
            _refuse(where, 'hidden_act', hf['hidden_act'], "is not silu (the SwiGLU MLP)")
        if hf.get('mlp_bias'):
            _refuse(where, 'mlp_bias', True, "puts biases in the MLP")
        if hf.get('attention_bias') and family != 'qwen2':
            _refuse(where, 'attention_bias', True, "puts a bias on o_proj too")
        window = hf.get('use_sliding_window', family == 'mistral') and hf.get('sliding_window') is not None
        if window:
            _refuse(where, 'sliding_window', hf['sliding_window'], "limits how far attention looks back")
        if any(t != 'full_attention' for t in hf.get('layer_types') or []):
            _refuse(where, 'layer_types', sorted(set(hf['layer_types'])), "are not all full attention")
        theta, scaling = _rope(hf, where)
        hidden, heads = f('hidden_size'), f('num_attention_heads')
        args = dict(block_size=f('max_position_embeddings'), vocab_size=f('vocab_size'), n_layer=f('num_hidden_layers'),
                    n_head=heads, n_embd=hidden, n_kv_head=f('num_key_value_heads', heads),
                    head_dim=f('head_dim', 128 if family == 'qwen3' else hidden // heads), bias=False,
                    qkv_bias=family == 'qwen2', norm='rms', qk_norm=family == 'qwen3', tie_head=f('tie_word_embeddings',
                    False), head_bias=False, mlp='swiglu', mlp_hidden=f('intermediate_size'), pos='rope',
                    rope_theta=theta, rope_scaling=scaling, norm_eps=float(f('rms_norm_eps', 1e-6)))
    # a key left out takes its transformers class's default (GPT-2's <|endoftext|>, Llama's 1 and 2; Qwen has none)
    bos, eos = (hf.get(k, d) for k, d in zip(('bos_token_id', 'eos_token_id'), CLASS_IDS.get(family, (None, None))))
    eos = eos[0] if isinstance(eos, list) and eos else eos
    none_from = 'bos_token_id' if isinstance(bos, int) else 'eos_token_id'
    none_id = bos if isinstance(bos, int) else eos
    if not isinstance(none_id, int) or not 0 <= none_id < args['vocab_size']:
        raise UserError(f"{where}config.json has neither a bos_token_id nor an eos_token_id in the vocabulary, so "
                        f"there is no token whose embedding [None] can take")
    return dict(args, cond='none'), none_id, none_from


def hf_names(cfg, family):
    """{our parameter name: (how, [their tensor names])}: how is 'copy', 't' (GPT-2's Conv1D, transposed) or 'cat'
    (their q, k, v or gate, up, stacked along the rows of our fused Linear)."""
    names = {}
    if family == 'gpt2':
        names['transformer.wte.weight'] = ('copy', ['wte.weight'])
        names['transformer.wpe.weight'] = ('copy', ['wpe.weight'])
        names.update({f'transformer.ln_f.{p}': ('copy', [f'ln_f.{p}']) for p in ('weight', 'bias')})
        for i in range(cfg.n_layer):
            for ours in ('ln_1.weight', 'ln_1.bias', 'ln_2.weight', 'ln_2.bias', 'attn.c_attn.bias',
                         'attn.c_proj.bias', 'mlp.c_fc.bias', 'mlp.c_proj.bias'):
                names[f'transformer.h.{i}.{ours}'] = ('copy', [f'h.{i}.{ours}'])
            for ours in ('attn.c_attn.weight', 'attn.c_proj.weight', 'mlp.c_fc.weight', 'mlp.c_proj.weight'):
                names[f'transformer.h.{i}.{ours}'] = ('t', [f'h.{i}.{ours}'])
    else:
        names['transformer.wte.weight'] = ('copy', ['model.embed_tokens.weight'])
        names['transformer.ln_f.weight'] = ('copy', ['model.norm.weight'])
        for i in range(cfg.n_layer):
            h, m = f'transformer.h.{i}.', f'model.layers.{i}.'
            names[h + 'ln_1.weight'] = ('copy', [m + 'input_layernorm.weight'])
            names[h + 'ln_2.weight'] = ('copy', [m + 'post_attention_layernorm.weight'])
            for p in ('weight', 'bias') if cfg.qkv_bias else ('weight',):
                names[h + f'attn.c_attn.{p}'] = ('cat', [m + f'self_attn.{x}_proj.{p}' for x in 'qkv'])
            names[h + 'attn.c_proj.weight'] = ('copy', [m + 'self_attn.o_proj.weight'])
            if cfg.qk_norm:
                names.update({h + f'attn.{x}_norm.weight': ('copy', [m + f'self_attn.{x}_norm.weight']) for x in 'qk'})
            names[h + 'mlp.c_fc.weight'] = ('cat', [m + 'mlp.gate_proj.weight', m + 'mlp.up_proj.weight'])
            names[h + 'mlp.c_proj.weight'] = ('copy', [m + 'mlp.down_proj.weight'])
    if not cfg.tie_head:
        names['lm_head.weight'] = ('copy', ['lm_head.weight'])
    return names


def _their_shapes(ours, how, parts, cfg):
    """The shape each of their tensors must have for our parameter of shape `ours`."""
    if how == 't':
        return [tuple(reversed(ours))]
    if how == 'copy':
        return [ours]
    nh, nkv, hd = cfg.heads
    rows = [nh * hd, nkv * hd, nkv * hd] if len(parts) == 3 else [ours[0] // 2] * 2
    return [(r,) + tuple(ours[1:]) for r in rows]


def open_weights(folder, hash_files=True):
    """A Hugging Face folder's tensors by their names, each read only when indexed (a torch tensor, or a safetensors
    slice: .shape, [rows], [:, columns]), and {file: sha256} of the files (None unless hash_files): model.safetensors
    or the shards model.safetensors.index.json lists, else GPT-2's pytorch_model.bin (through load_checkpoint's
    weights_only, memory-mapped: nothing unpickled, pages read as used). The one place HF weights are read. A bad
    file is one line."""
    index = os.path.join(folder, 'model.safetensors.index.json')
    if not os.path.exists(os.path.join(folder, 'model.safetensors')) and not os.path.exists(index):
        binary = os.path.join(folder, 'pytorch_model.bin')
        if not os.path.exists(binary):
            raise UserError(f"{folder} holds neither model.safetensors, model.safetensors.index.json nor "
                            f"pytorch_model.bin")
        from aogpt.checkpoint import load_checkpoint
        return load_checkpoint(binary), {'pytorch_model.bin': file_sha256(binary)} if hash_files else None
    if os.path.exists(index):
        try:
            with open(index) as f:
                files = sorted(set(json.load(f)['weight_map'].values()))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise UserError(f"cannot read {index}: not a safetensors index with a weight_map ({e})")
    else:
        files = ['model.safetensors']
    from safetensors import safe_open
    tensors, sha = {}, {} if hash_files else None
    for name in files:
        path = os.path.join(folder, name)
        if not os.path.exists(path):
            raise UserError(f"{folder} has no {name}" + (" (its index names it)" if os.path.exists(index) else ""))
        try:
            handle = safe_open(path, framework='pt')
            tensors.update({t: _Slices(handle, t) for t in handle.keys()})
        except Exception as e:
            raise UserError(f"cannot read {path}: it is truncated, corrupt or not a safetensors file ({e})")
        if hash_files:
            sha[name] = file_sha256(path)
    return tensors, sha


class _Slices:
    """One tensor of a safetensors file, read only when indexed (the rows or columns asked for)."""

    def __init__(self, handle, name):
        self.handle, self.name = handle, name
        self.shape = torch.Size(handle.get_slice(name).get_shape())

    def __getitem__(self, index):
        return self.handle.get_slice(self.name)[index]


def _equal(a, b, rows=4096):
    """Whether two of their tensors are equal bit for bit, read rows at a time (an embedding of 150k rows is not read
    whole)."""
    return tuple(a.shape) == tuple(b.shape) and all(torch.equal(a[i:i + rows], b[i:i + rows])
                                                    for i in range(0, a.shape[0], rows))


def source_rows(folder, state_dict=None, doc_end=None, hash_files=True, say=print, **overrides):
    """(config, record, rows): the source's GPTConfig (cond='none'), its record (hf_source's), and {each of our
    parameters' names: rows(a, b), its rows [a, b) read from their tensors}, which reads only those rows of the files
    (a sharded model's rank asks for its own: aogpt/parallel.py). Every one of their tensors is checked first, by name
    and shape from the files' headers: a missing, extra or misshapen one is a UserError naming it. state_dict: their
    tensors already in memory; hash_files: whether the record gets each file's sha256 (reading every byte); say:
    where a note goes (a tied head that the weights untie)."""
    hf = read_config(folder)
    where = os.path.join(folder, '')
    family = hf['model_type']
    args, none_id, none_from = hf_config(hf, where)
    if doc_end is not None and none_from != 'bos_token_id' and doc_end != none_id:
        if not 0 <= doc_end < args['vocab_size']:
            raise UserError(f"{where}: the documents' end id {doc_end} is not one of its {args['vocab_size']} rows")
        none_id, none_from = doc_end, 'doc_end'
    cfg = source_config(hf, args, where, **overrides)
    theirs, sha = (dict(state_dict), None) if state_dict is not None else open_weights(folder, hash_files)
    if family == 'gpt2':  # with or without the 'transformer.' prefix; the causal-mask buffers are not weights
        theirs = {k.removeprefix('transformer.'): v for k, v in theirs.items()
                  if not k.endswith(('.attn.bias', '.attn.masked_bias'))}
    else:
        theirs = {k: v for k, v in theirs.items() if not k.endswith('rotary_emb.inv_freq')}
    head = theirs.get('lm_head.weight')
    emb = theirs.get('wte.weight' if family == 'gpt2' else 'model.embed_tokens.weight')
    if cfg.tie_head and head is not None and emb is not None and not _equal(head, emb):
        # config.json ties them, but the file holds another head: transformers keeps it, untied (with a warning), so
        # the source is that model; dropping the head would load another one
        cfg = source_config(hf, dict(args, tie_head=False), where, **overrides)
        say(f"note: {where}config.json ties the head to the embedding (tie_word_embeddings), but its weights hold "
            f"another lm_head.weight: loaded untied, as transformers loads it")
    if cfg.tie_head:
        theirs.pop('lm_head.weight', None)  # a tied head is the embedding (some files store the copy)
    with torch.device('meta'):
        shapes = {k: tuple(v.shape) for k, v in GPT(cfg).state_dict().items()}  # no memory
    names = hf_names(cfg, family)
    wanted = {t for _, parts in names.values() for t in parts}
    for t in sorted(wanted - set(theirs)):
        raise UserError(f"{where}: the weights have no {t}, which a {family} of this config.json needs")
    for t in sorted(set(theirs) - wanted):
        raise UserError(f"{where}: the weights hold {t}, which a {family} of this config.json has no use for")
    rows = {}
    for ours, (how, parts) in names.items():
        shape = shapes[ours]
        if ours == 'transformer.wpe.weight':  # GPT-2's rows: n_positions of config.json; block_size may cut
            shape = (args['block_size'] + 1, shape[1])
        for t, want in zip(parts, _their_shapes(shape, how, parts, cfg)):
            if tuple(theirs[t].shape) != want:
                raise UserError(f"{where}: {t} has shape {tuple(theirs[t].shape)}, this config.json needs {want}")
        rows[ours] = functools.partial(_read_rows, how, [theirs[t] for t in parts])
    embedding = theirs[names['transformer.wte.weight'][1][0]]
    rows['transformer.wnonee.weight'] = lambda a, b: embedding[none_id:none_id + 1][a:b]  # [None]: that token's row
    here = os.path.abspath(folder)  # a hub download lives in .../snapshots/<commit>: that commit is its revision
    revision = os.path.basename(here) if os.path.basename(os.path.dirname(here)) == 'snapshots' else None
    return cfg, dict(family=family, folder=here, revision=revision, none_id=none_id, none_from=none_from,
                     weights_sha256=sha), rows


def _read_rows(how, parts, a, b):
    """Rows [a, b) of one of our parameters from their tensors: 'copy' one tensor's rows, 't' the columns of GPT-2's
    Conv1D (transposed), 'cat' the rows of their parts stacked (q, k, v or gate, up), each part read only where
    [a, b) meets it."""
    if how == 't':
        return parts[0][:, a:b].t()
    out, start = [], 0
    for t in parts:
        lo, hi = max(a, start), min(b, start + t.shape[0])
        if lo < hi:
            out.append(t[lo - start:hi - start])
        start += t.shape[0]
    return torch.cat(out) if len(out) > 1 else out[0] if out else parts[0][0:0]


def hf_source(folder, state_dict=None, doc_end=None, say=print, **overrides):
    """The source model (cond='none'), and its record {family, folder, revision (a hub snapshot's commit, else None),
    none_id, none_from, weights_sha256: {file: sha256} (None when state_dict was given)}. Built on the meta device
    and filled from source_rows (every tensor checked there): no draws, no second copy. doc_end: the id that ends
    the data's documents, which [None] takes where the source has no BOS (a Qwen whose config.json names a chat
    turn's end as its eos, trained on data ended by <|endoftext|>); none_from then says 'doc_end'. overrides:
    GPTConfig keys (block_size may shrink the context; dropout and the like). say: where a note goes (a tied head
    that the weights untie)."""
    cfg, source, rows = source_rows(folder, state_dict, doc_end, say=say, **overrides)
    with torch.device('meta'):
        model = GPT(cfg)
    materialise(model, 'cpu', rows.items())
    return model, source


def load_hf(path, state_dict=None, cond='none', doc_end=None, **overrides):
    """The source model of a local Hugging Face folder (hf_source) with cond='none', or adapted into cond 'adaln' or
    'sigma' (model.adapt), which starts as the source for every order and learns to use the target."""
    model, _ = hf_source(path, state_dict, doc_end, **overrides)
    return model if cond == 'none' else adapt(model, cond)
