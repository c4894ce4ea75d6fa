"""Any open causal LM as our GPT (aogpt/families.py, model.py's pos/mlp/n_kv_head/head_dim/qkv_bias switches):
transformers' own Llama, Mistral, Qwen2, Qwen3 and GPT-2 built from tiny random configs, saved with save_pretrained,
loaded through our loader. Our L2R logits on x equal theirs on [none_id] + x, as the source (cond='none') and
adapted (adaln, sigma). float64: 1e-10 (the same ops up to summation order: ~sqrt(64)·1.1e-16·|logit| ≈ 1e-14 per
matmul, far below; the rotary angles are float32 on both sides, as HF computes them). float32: ATOL 1e-5, the
class-3 bound of tests/README.md (16-48 wide, 2 layers, logits ≤ 10). A negative control (theta, rope convention,
position off by one) moves the logits by far more, so the comparison has power."""
import hashlib
import json
import os

import numpy as np
import pytest
import torch
from test_train import N as TN, args, env, log, run_inprocess  # noqa: F401 (env: a fixture)

from aogpt.checkpoint import load_checkpoint
from aogpt.errors import UserError
from aogpt.families import hf_source, load_hf
from aogpt.valloss import val_windows
from model import adapt

transformers = pytest.importorskip('transformers')
V, N = 64, 12

# name: (config class, model class, config keys): GQA and full heads, tied and untied, qkv bias, thetas, llama3
CASES = {
    'llama_gqa_tied': ('LlamaConfig', 'LlamaForCausalLM', dict(num_key_value_heads=2, tie_word_embeddings=True,
                                                                rope_theta=1e5, bos_token_id=3)),
    'llama3_scaled': ('LlamaConfig', 'LlamaForCausalLM', dict(num_key_value_heads=4, rope_theta=5e5, bos_token_id=1,
                      rope_scaling=dict(rope_type='llama3', factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                        original_max_position_embeddings=8))),
    'mistral': ('MistralConfig', 'MistralForCausalLM', dict(num_key_value_heads=1, sliding_window=None,
                                                            bos_token_id=1)),
    'qwen2_bias': ('Qwen2Config', 'Qwen2ForCausalLM', dict(num_key_value_heads=2, rope_theta=1e6, eos_token_id=5,
                                                            tie_word_embeddings=True)),
    'qwen3_headdim': ('Qwen3Config', 'Qwen3ForCausalLM', dict(num_key_value_heads=2, head_dim=16, rope_theta=1e6,
                                                               eos_token_id=7)),
    'gpt2': ('GPT2Config', 'GPT2LMHeadModel', dict(n_layer=2, n_head=4, n_embd=32, n_positions=N + 1,
                                                   bos_token_id=9, eos_token_id=9)),
}


def build(tmp_path, name, seed=0):
    """A tiny random HF model of CASES[name], saved in tmp_path/name; weights shaken so a mismatch cannot hide."""
    cfg_cls, model_cls, kw = CASES[name]
    base = {} if name == 'gpt2' else dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                           intermediate_size=48, max_position_embeddings=N + 1, rms_norm_eps=1e-5)
    cfg = getattr(transformers, cfg_cls)(vocab_size=V, **base, **kw)
    torch.manual_seed(seed)
    hf = getattr(transformers, model_cls)(cfg).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    hf.save_pretrained(tmp_path / name)
    return hf, tmp_path / name


def _rms_in_float64(hf):
    """HF's RMSNorm computes in float32 whatever the model's dtype (a precision choice, not the function): its
    float64 twin here, so that the float64 comparison is one of two float64 models. (Both sides compute the rotary
    angles in float32, as HF does: that part is the same function.)"""
    for m in hf.modules():
        if type(m).__name__.endswith('RMSNorm'):
            m.forward = lambda x, m=m: m.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + m.variance_epsilon)
    return hf


def hf_logits(hf, x, none_id):
    return hf(torch.cat([torch.full((len(x), 1), none_id), x], 1)).logits[:, :x.size(1)]


@pytest.mark.parametrize('name', list(CASES))
def test_l2r_logits_equal_the_source_in_float64_and_float32(tmp_path, name):
    hf, folder = build(tmp_path, name)
    ours, source = hf_source(str(folder))
    x = torch.randint(0, V, (2, N), generator=torch.Generator().manual_seed(1))
    none_id = source['none_id']
    assert source['none_from'] == ('eos_token_id' if name.startswith('qwen') else 'bos_token_id')
    with torch.no_grad():
        ref32, got32 = hf_logits(hf, x, none_id), ours.eval()(x)[0]
        _rms_in_float64(hf.double()), ours.double()
        ref = hf_logits(hf, x, none_id)
        worst = {'none': (ours(x)[0] - ref).abs().max().item()}
        for cond in ('adaln', 'sigma'):
            worst[cond] = (adapt(ours, cond).double().eval()(x)[0] - ref).abs().max().item()
        worst['adaln_std'] = (adapt(ours, 'adaln', adaln_std=0.2).double().eval()(x)[0] - ref).abs().max().item()
    print(f"{name}: max |dlogit| float64 {worst}, float32 {(got32 - ref32).abs().max().item():.2e}")
    assert max(worst.values()) < 1e-10, worst
    torch.testing.assert_close(got32, ref32, atol=1e-5, rtol=0)
    assert 1 < ref.abs().max() < 10  # logits of a real size (not met by zeros), and the size the bound assumes


def test_a_wrong_theta_convention_or_position_is_caught(tmp_path):
    """The negative controls: each changes the function, by far more than the bound."""
    hf, folder = build(tmp_path, 'qwen3_headdim')
    ours, source = hf_source(str(folder))
    x = torch.randint(0, V, (2, N), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf_logits(_rms_in_float64(hf.double()), x, source['none_id'])
        ours.double().eval()
        ours.config.rope_theta = 1e4                                   # another theta
        assert (ours(x)[0] - ref).abs().max() > 1e-3
        ours.config.rope_theta = 1e6
        pos = torch.arange(N).expand(2, N)
        none = torch.full((2, 1), -1)
        tok, spos = torch.cat([none, x[:, :-1]], 1), torch.cat([none, pos[:, :-1]], 1)
        # tokens turned by p instead of p + 1 ([None] by 0): a shift of every slot would change nothing (rotary
        # sees only differences), a shift of the tokens against [None] does
        assert (ours.forward_slots(tok, torch.cat([none, pos[:, :-1] - 1], 1), pos) - ref).abs().max() > 1e-3
        assert (ours.forward_slots(tok, spos, pos) - ref).abs().max() < 1e-10
        import model as M
        orig = M.rotate
        try:  # interleaved pairs instead of rotate_half's halves
            M.rotate = lambda q, cos, sin: (q.unflatten(-1, (-1, 2)).flip(-1) * torch.tensor([-1, 1.0], dtype=q.dtype)
                                            ).flatten(-2) * sin.to(q.dtype) + q * cos.to(q.dtype)
            assert (ours(x)[0] - ref).abs().max() > 1e-3
        finally:
            M.rotate = orig


def _edit_config(folder, **kw):
    path = folder / 'config.json'
    cfg = json.loads(path.read_text())
    cfg.update(kw)
    path.write_text(json.dumps(cfg))


@pytest.mark.parametrize('name, edit, needle', [
    ('qwen2_bias', dict(use_sliding_window=True, sliding_window=4), "sliding_window=4"),
    ('qwen3_headdim', dict(layer_types=['sliding_attention', 'full_attention']), "layer_types"),
    ('llama_gqa_tied', dict(rope_parameters=dict(rope_type='yarn', rope_theta=1e4, factor=2.0)), "rope_type='yarn'"),
    ('llama_gqa_tied', dict(mlp_bias=True), "mlp_bias=True"),
    ('llama_gqa_tied', dict(hidden_act='gelu'), "hidden_act='gelu'"),
    ('llama_gqa_tied', dict(final_logit_softcapping=30.0), "final_logit_softcapping"),
    ('mistral', dict(sliding_window=4), "sliding_window=4"),
    ('gpt2', dict(activation_function='relu'), "activation_function='relu'"),
    # values the block cannot take, named as config.json spells them (once a TypeError or a ValueError naming ours)
    ('llama_gqa_tied', dict(num_key_value_heads=3), "num_key_value_heads=3 cannot make this block (n_kv_head must be "
                                                    "a divisor of n_head (4), got 3)"),
    ('llama_gqa_tied', dict(hidden_size=32.0), "hidden_size=32.0 must be an integer >= 1"),
    ('llama_gqa_tied', dict(hidden_size='32'), "hidden_size='32' must be an integer >= 1"),
    ('mistral', dict(num_hidden_layers=-2), "num_hidden_layers=-2 must be an integer >= 1"),
    ('qwen2_bias', dict(vocab_size=True), "vocab_size=True must be an integer >= 1"),
    ('qwen3_headdim', dict(rms_norm_eps='1e-6'), "rms_norm_eps='1e-6' must be a number > 0"),
    ('qwen2_bias', dict(rope_parameters=dict(rope_type='default', rope_theta=True)),
     "rope_theta=True must be a number"),
    ('llama3_scaled', dict(rope_parameters=dict(rope_type='llama3', rope_theta=5e5, factor=8.0, low_freq_factor=0.0,
                                                high_freq_factor=4.0, original_max_position_embeddings=8)),
     "rope_parameters={'rope_type': 'llama3', 'rope_theta': 500000.0, 'factor': 8.0, 'low_freq_factor': 0.0"),
    ('gpt2', dict(n_layer=-1), "n_layer=-1 must be an integer >= 1"),
    ('gpt2', dict(n_embd=32.0), "n_embd=32.0 must be an integer >= 1"),
    ('gpt2', dict(n_positions=1), "n_positions=1 cannot make this block (block_size must be an integer >= 1, got 0)"),
])
def test_what_the_block_cannot_represent_is_refused_by_name(tmp_path, name, edit, needle):
    _, folder = build(tmp_path, name)
    _edit_config(folder, **edit)
    with pytest.raises(UserError, match='config.json') as e:
        load_hf(str(folder))
    assert needle in str(e.value) and '\n' not in str(e.value)


def test_a_config_the_block_cannot_take_is_one_line_in_train_and_as_a_judge(env, monkeypatch, capsys, tmp_path):
    """train.py --init_from=<folder> and sample.py --gen_ppl <folder> both read config.json through hf_source: a
    value the block cannot take was a ValueError or TypeError traceback in each."""
    from aogpt.genppl import load_judge
    _, folder = build(tmp_path, 'llama_gqa_tied')
    _edit_config(folder, num_key_value_heads=3)
    capsys.readouterr()  # save_pretrained's bar
    with pytest.raises(SystemExit):
        run_inprocess(monkeypatch, args(env, '', f'--out_dir={tmp_path / "run"}', f'--init_from={folder}'))
    err = capsys.readouterr().err.strip()
    assert err == (f"error: {folder}/config.json: num_key_value_heads=3 cannot make this block (n_kv_head must be a "
                   f"divisor of n_head (4), got 3)"), err
    _, judge = build(tmp_path, 'gpt2')
    _edit_config(judge, n_embd=32.0)
    with pytest.raises(UserError, match=r"config.json: n_embd=32.0 must be an integer >= 1"):
        load_judge(str(judge), 'cpu')


@pytest.mark.parametrize('init_from', ['source', 'scratch', 'auto'])
def test_a_source_folder_is_not_a_run_directory(env, monkeypatch, capsys, tmp_path, init_from):
    """--init_from=F --out_dir=F wrote the run's ckpt.pt into the Hugging Face folder it started from, and from then
    on --init_from=F meant the trained run, not the source (as an export folder, which was refused already). Now
    any start into a model folder is one line, the folder untouched."""
    _, folder = build(tmp_path, 'qwen2_bias')
    before = sorted(os.listdir(folder))
    capsys.readouterr()
    with pytest.raises(SystemExit):
        run_inprocess(monkeypatch, args(env, '', f'--out_dir={folder}', '--max_iters=1',
                                        f'--init_from={folder if init_from == "source" else init_from}'))
    err = capsys.readouterr().err.strip()
    assert err == (f"error: out_dir {folder} is a Hugging Face model folder (its config.json: a qwen2), not a run "
                   f"directory: train into a new folder, e.g. --init_from={folder} --out_dir=<a new folder>"), err
    assert sorted(os.listdir(folder)) == before


def test_the_4x_config_layout_reads_the_same(tmp_path):
    """transformers 4.x files: rope_theta and rope_scaling at the top level, no rope_parameters."""
    hf, folder = build(tmp_path, 'llama3_scaled')
    cfg = json.loads((folder / 'config.json').read_text())
    rp = cfg.pop('rope_parameters')
    cfg['rope_theta'] = rp.pop('rope_theta')
    cfg['rope_scaling'] = dict(rp, type=rp.pop('rope_type'))
    (folder / 'config.json').write_text(json.dumps(cfg))
    ours = load_hf(str(folder)).double().eval()
    x = torch.randint(0, V, (1, N))
    with torch.no_grad():
        assert (ours(x)[0] - hf_logits(_rms_in_float64(hf.double()), x, 1)).abs().max() < 1e-10


@pytest.mark.parametrize('name', ['gpt2', 'qwen3_headdim'])
def test_every_weight_is_checked(tmp_path, name):
    """A missing, extra or misshapen tensor, or a config.json that is not JSON: one line naming it (GPT-2's folder
    loader used to train a missing weight from its random init, and to raise a traceback for the others)."""
    from safetensors.torch import load_file, save_file
    _, folder = build(tmp_path, name)
    st = folder / 'model.safetensors'
    sd = load_file(st)
    key = 'h.0.attn.c_attn.weight' if name == 'gpt2' else 'model.layers.0.self_attn.k_proj.weight'
    key = next(k for k in sd if k.endswith(key))
    for spoil, needle in [(lambda d: d.pop(key), f"have no {key.removeprefix('transformer.')}"),
                          (lambda d: d.update(extra=torch.zeros(2)), "hold extra"),
                          (lambda d: d.update({key: d[key][:-1]}), f"{key.removeprefix('transformer.')} has shape")]:
        d = dict(sd)
        spoil(d)
        save_file(d, st)
        with pytest.raises(UserError) as e:
            load_hf(str(folder))
        assert needle in str(e.value), str(e.value)
    (folder / 'config.json').write_text('{not json')
    with pytest.raises(UserError, match='it is not JSON'):
        load_hf(str(folder))


@pytest.mark.parametrize('name', ['llama_gqa_tied', 'gpt2'])
def test_a_tied_config_whose_file_holds_another_head_loads_as_transformers_loads_it(tmp_path, name, capsys):
    """config.json says tied embeddings, the file holds a head that differs: transformers keeps that head untied (it
    warns), so the source is that model. Ours dropped the head and tied it to the embedding: another model (the
    issue's eval_only val_l2r 6.330 where transformers' was 6.388). Now it is loaded untied, with a note; a file
    whose stored head is the embedding's copy stays tied. Compared with transformers' own from_pretrained."""
    from safetensors.torch import load_file, save_file
    _, folder = build(tmp_path, name)
    st = folder / 'model.safetensors'
    sd = load_file(st)
    emb = next(k for k in sd if k.endswith(('wte.weight', 'embed_tokens.weight')))
    x = torch.randint(0, V, (2, N), generator=torch.Generator().manual_seed(1))
    for head, tied in ((sd[emb].clone(), True), (torch.randn_like(sd[emb]) * 0.5, False)):
        save_file(dict(sd, **{'lm_head.weight': head}), st, metadata={'format': 'pt'})
        theirs = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
        capsys.readouterr()
        ours, source = hf_source(str(folder))
        note = capsys.readouterr().out
        assert ours.config.tie_head is tied and ('loaded untied, as transformers loads it' in note) is not tied, note
        with torch.no_grad():
            ref, got = hf_logits(theirs, x, source['none_id']), ours.eval()(x)[0]
        torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)  # the float32 bound of the module docstring


def test_sharded_safetensors_are_read_and_recorded(tmp_path):
    hf, folder = build(tmp_path, 'qwen2_bias')
    hf.save_pretrained(tmp_path / 'shards', max_shard_size='20KB')
    assert (tmp_path / 'shards' / 'model.safetensors.index.json').exists()
    one, src1 = hf_source(str(folder))
    many, src2 = hf_source(str(tmp_path / 'shards'))
    assert len(src2['weights_sha256']) > 1 and list(src1['weights_sha256']) == ['model.safetensors']
    assert all(torch.equal(a, b) for a, b in zip(one.state_dict().values(), many.state_dict().values()))


def test_train_starts_from_a_qwen3_folder_at_its_own_loss(env, monkeypatch, tmp_path):
    """train.py --init_from=<a Qwen3 folder> --cond=adaln --eval_only: the adapted model's val_l2r is the source's
    own loss on the same val windows, each read after [eos] (class 4 of tests/README.md: float32 sums of
    4 x 8 x 16 token losses in another order, rel 1e-5)."""
    cfg = transformers.Qwen3Config(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                   num_key_value_heads=1, head_dim=16, intermediate_size=48,
                                   max_position_embeddings=TN, eos_token_id=7)  # the toy config's shape
    torch.manual_seed(0)
    hf = transformers.Qwen3ForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    hf.save_pretrained(tmp_path / 'qwen3')
    run_inprocess(monkeypatch, args(env, '', f'--out_dir={tmp_path / "ao"}', f'--init_from={tmp_path / "qwen3"}',
                                    '--cond=adaln', '--eval_only=True'))
    got = log(env, tmp_path / 'ao')[-1]['val_l2r']
    val = torch.from_numpy(np.fromfile(env / 'data' / 'runs' / 'val.bin', dtype=np.uint16).astype(np.int64))
    nll = n = 0.0
    with torch.no_grad():
        for starts in val_windows(len(val), TN, 4, 8):  # the toy config's eval_iters and batch_size
            x = torch.stack([val[s:s + TN] for s in starts])
            logits = hf_logits(hf, x, 7)
            nll += torch.nn.functional.cross_entropy(logits.reshape(-1, V), x.reshape(-1), reduction='sum').item()
            n += x.numel()
    assert got == pytest.approx(nll / n, rel=1e-5), (got, nll / n)
    # a run that saves: its checkpoint records the source (family, [None]'s token and where it came from, the
    # sha256 of the weights file as read)
    run_inprocess(monkeypatch, args(env, '', f'--out_dir={tmp_path / "run"}', f'--init_from={tmp_path / "qwen3"}',
                                    '--max_iters=1', '--eval_interval=1', '--learning_rate=0', '--warmup_iters=0',
                                    '--decay_lr=False', '--eval_iters=1'))
    source = load_checkpoint(str(tmp_path / 'run'))['started_from']['source']
    sha = hashlib.sha256((tmp_path / 'qwen3' / 'model.safetensors').read_bytes()).hexdigest()
    assert source['family'] == 'qwen3' and (source['none_id'], source['none_from']) == (7, 'eos_token_id')
    assert source['weights_sha256'] == {'model.safetensors': sha}


def test_a_judge_folder_without_its_tokenizer_is_refused(tmp_path):
    """sample.py's --gen_ppl judge reads the samples' text with its own codec: a Qwen folder with no tokenizer.json
    has none, and would score ids it cannot name; it is one line (tests/test_sources.py judges with one that has)."""
    from aogpt.genppl import load_judge
    _, folder = build(tmp_path, 'qwen3_headdim')
    with pytest.raises(UserError, match="holds no tokenizer.json, so nothing says which text its ids are"):
        load_judge(str(folder), 'cpu')


def test_an_hf_id_names_a_model_folder_in_the_hub_cache(tmp_path, monkeypatch):
    """--init_from=hf:owner/repo[@rev] of a transformers model (offline, from the cache): its config.json and
    model.safetensors are fetched as an export's would be, and the folder read as any; the revision is the path's."""
    import huggingface_hub.constants as C
    from helpers import hub_cache

    from aogpt.startup import hf_folder
    _, folder = build(tmp_path, 'qwen2_bias')
    sha = hub_cache(tmp_path / 'hub', 'me/tiny-qwen2', {f: folder / f for f in ('config.json', 'model.safetensors')},
                    refs=('main', 'v1'))
    monkeypatch.setattr(C, 'HF_HUB_CACHE', str(tmp_path / 'hub'))
    got = hf_folder('hf:me/tiny-qwen2@v1')
    assert got.endswith(f'snapshots/{sha}')
    ours, source = hf_source(got)
    theirs, _ = hf_source(str(folder))
    assert (source['family'], source['revision']) == ('qwen2', sha)
    assert all(torch.equal(a, b) for a, b in zip(ours.state_dict().values(), theirs.state_dict().values()))
