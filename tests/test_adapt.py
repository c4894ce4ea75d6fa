"""Adapting a GPT into an AO-GPT or sigma-GPT (model.adapt, train.py --init_from=<GPT> --cond=adaln|sigma): the
adapted model computes exactly its source's distribution at step 0, whichever source (our checkpoint, an export,
a Hugging Face GPT-2 folder); the run records where it came from; bad sources are one line.

Why the step-0 logits are compared bit for bit (atol=0) against the source's own forward: the adapted forward
runs the very ops of the source's forward on the same float32 inputs, plus steps that are identities in IEEE
arithmetic whatever the kernels (x * (1 + 0) + 0, x + 1 * y, x + 0: exact even when fused into an FMA). So the
result is the same bits on any CPU and under any ATEN_CPU_CAPABILITY; no tolerance is needed. Against HF's
GPT2LMHeadModel the ops differ (its Conv1D is addmm over transposed weights, its attention its own), so both run
in float64 there, where two orders of summing the same O(1) terms over these few hundred ops differ by far less
than 1e-10 (float64's unit roundoff is 1.1e-16).
"""
import json

import pytest
import torch

import export
from aogpt.checkpoint import load_checkpoint, load_model, weights_sha256
from aogpt.families import load_hf
from aogpt.orders import random_orders
from model import GPT, GPTConfig, adapt
from test_train import (N, args, assert_same_run, env, gpt2_runs, log, run, run_inprocess, runs_corpus,  # noqa: F401
                        tiny_gpt2)  # env: a fixture

FROZEN = ['--max_iters=1', '--eval_interval=1', '--learning_rate=0', '--warmup_iters=0', '--decay_lr=False']


def gpt(**kw):
    torch.manual_seed(0)
    return GPT(GPTConfig(**dict(dict(block_size=N, vocab_size=64, n_layer=2, n_head=2, n_embd=32, cond='none',
                                     target_dim=8), **kw))).eval()


def train(argv):
    """train.py in-process, for a module's fixture (run_inprocess takes a test's monkeypatch)."""
    with pytest.MonkeyPatch.context() as mp:
        run_inprocess(mp, argv)


def logits(model, x, order=None):
    with torch.no_grad():
        return model(x, order=order)[0]


@pytest.mark.parametrize('cond,adaln_std', [('adaln', None), ('adaln', 0.2), ('sigma', None)])
@pytest.mark.parametrize('norm', ['rms', 'layer'])
def test_adapt_computes_the_gpt_bit_for_bit_and_can_learn_the_target(cond, adaln_std, norm):
    """Every order, not only L2R: slot k predicts from the tokens revealed before it, as the GPT fed the permuted
    tokens does; and adaln_table (the same function computed per position) as well. Then one backward pass: the
    new parts get a gradient, so the model can start reading the target (a zero gradient would leave it a GPT):
    the Linears when the table is drawn, the table when the Linears are (adaln_std)."""
    src = gpt(norm=norm, tie_head=norm == 'layer')
    x = torch.randint(0, 64, (3, N), generator=torch.Generator().manual_seed(1))
    order = random_orders(3, N, generator=torch.Generator().manual_seed(2))
    torch.manual_seed(5)
    model = adapt(src, cond, adaln_std=adaln_std, target_dim=8)
    if adaln_std is not None:  # the Linears drawn at that scale, not zero; the table zero
        w = model.transformer.h[0].adaLN[1].weight
        assert 0.5 * adaln_std < w.std() < 1.5 * adaln_std and not model.transformer.wtpe.weight.any()
    assert model.config.cond == cond and model.any_order
    for table in (False, True):
        model.config.adaln_table = table
        torch.testing.assert_close(logits(model, x), logits(src, x), atol=0, rtol=0)
        torch.testing.assert_close(logits(model, x, order), logits(src, x, order), atol=0, rtol=0)
    model.train()
    model(x, order=order, targets=x)[1].backward()
    new = ([b.adaLN[1].weight for b in model.transformer.h] + [model.transformer.adaLN_f[1].weight]
           if cond == 'adaln' and adaln_std is None else [model.transformer.wtpe.weight])
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in new)
    shared = dict(src.named_parameters())
    assert all(torch.equal(p, shared[k]) for k, p in model.named_parameters() if k in shared)


@pytest.fixture(scope='module')
def gpt_run(env):
    """A GPT (cond='none', L2R) trained 3 steps, so its EMA and raw weights differ, and its export."""
    out = env / 'adapt_src'
    train(args(env, 'adapt_src', '--cond=none', '--order=l2r', '--max_iters=3', '--eval_interval=3'))
    export.main([f'--ckpt={out}', f'--dest={env / "adapt_src_export"}'])
    return out


@pytest.mark.parametrize('cond', ['adaln', 'sigma'])
@pytest.mark.parametrize('source', ['ckpt', 'export'])
def test_train_adapts_our_gpt_and_its_export_exactly(env, gpt_run, monkeypatch, capsys, tmp_path, cond, source):
    """Learning rate 0: the checkpoint after one step is the adapted model at step 0. Its L2R logits are the
    source's (the EMA weights, train.py's default for a fine-tune) bit for bit; its val L2R loss at iteration 0 is
    the source run's last one; the checkpoint and its export say where it came from; init_from=auto resumes the
    adapted run, not its source."""
    src = gpt_run if source == 'ckpt' else env / 'adapt_src_export'
    out = tmp_path / 'ao'
    width = ['--target_dim=8'] if cond == 'adaln' else []  # AdaLN's table; sigma's is the stream's width
    argv = args(env, '', f'--out_dir={out}', f'--cond={cond}', *width, *FROZEN)
    run_inprocess(monkeypatch, argv + [f'--init_from={src}'])
    assert f"adapting the GPT {src} (EMA weights) into cond='{cond}'" in capsys.readouterr().out
    ck = load_checkpoint(str(out))
    assert ck['model_args']['cond'] == cond and ck['model_args']['target_dim'] == (8 if width else 128)
    source_model = load_model(str(src))[0]
    x = torch.randint(0, 12, (4, N), generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(logits(load_model(str(out))[0], x), logits(source_model, x), atol=0, rtol=0)
    assert log(tmp_path, 'ao')[0]['val_l2r'] == log(env, 'adapt_src')[-1]['val_l2r']
    assert ck['started_from'] == dict(init_from=str(src), path=str(src / 'ckpt.pt' if source == 'ckpt' else src),
                                      weights='ema',
                                      weights_sha256=weights_sha256(source_model), cond='none', adapted=True)
    export.main([f'--ckpt={out}', f'--dest={tmp_path / "hub"}'])
    assert json.loads((tmp_path / 'hub' / 'config.json').read_text())['started_from'] == ck['started_from']
    card = (tmp_path / 'hub' / 'README.md').read_text()
    assert 'Adapted from a left-to-right GPT' in card and f"**Adapted** from the left-to-right GPT `{src}`" in card \
        and ck['started_from']['weights_sha256'] in card
    run_inprocess(monkeypatch, argv[:-len(FROZEN)] + ['--init_from=auto', '--max_iters=2', *FROZEN[1:]])
    assert f"resumed {out / 'ckpt.pt'} at iteration 1" in capsys.readouterr().out
    resumed = load_checkpoint(str(out))
    assert resumed['iter_num'] == 2 and resumed['started_from'] == ck['started_from']


@pytest.fixture(scope='module')
def gpt2_data(env):
    return gpt2_runs(env)


@pytest.mark.parametrize('cond', ['adaln', 'sigma'])
def test_train_adapts_gpt2_into_hfs_own_logits(env, gpt2_data, monkeypatch, tmp_path, cond):
    """gpt2:DIR goes the same way: the adapted model's L2R logits are HF GPT2LMHeadModel's for
    [<|endoftext|>] + x (both in float64: see the module docstring), and its bits are our GPT-2's."""
    hf = tiny_gpt2(tmp_path / 'hf').eval()
    with torch.no_grad():  # bigger weights than the default init, so a mismatch cannot hide
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    hf.save_pretrained(tmp_path / 'hf')
    run_inprocess(monkeypatch, args(env, '', f'--out_dir={tmp_path / "ao"}', gpt2_data,
                                    f'--init_from=gpt2:{tmp_path / "hf"}', f'--cond={cond}', '--eval_iters=1', *FROZEN))
    model, ck, _ = load_model(str(tmp_path / 'ao'))
    assert ck['model_args']['cond'] == cond and ck['started_from']['adapted'] and ck['started_from']['weights'] is None
    x = torch.randint(0, 50256, (2, N), generator=torch.Generator().manual_seed(4))
    ours = load_hf(str(tmp_path / 'hf')).eval()
    torch.testing.assert_close(logits(model, x), logits(ours, x), atol=0, rtol=0)
    assert ck['started_from']['weights_sha256'] == weights_sha256(ours)
    with torch.no_grad():
        ref = hf.double()(torch.cat([torch.full((2, 1), 50256), x], 1)).logits[:, :N]
    torch.testing.assert_close(logits(model.double(), x), ref, atol=1e-10, rtol=0)


@pytest.mark.slow
def test_adapting_under_ddp_is_one_process_adapting(env, gpt_run):
    """Two torchrun ranks adapt as one process does (each rank draws the same target table; DDP broadcasts rank
    0's too) and train on a mix of near-L2R and uniform orders with the EMA: the same losses and weights."""
    common = ['--max_iters=4', '--eval_interval=2', '--batch_size=4', '--gradient_accumulation_steps=4',
              f'--init_from={gpt_run}', '--cond=adaln', '--target_dim=8', '--order=mix:0.5*nearl2r:4+0.5*random']
    run(env, args(env, 'adapt_single', *common))
    run(env, args(env, 'adapt_ddp', *common), torchrun=True)
    assert_same_run(env, [0, 2, 4], moved=0.05, single='adapt_single', ddp='adapt_ddp')
    ca, cb = load_checkpoint(str(env / 'adapt_single')), load_checkpoint(str(env / 'adapt_ddp'))
    assert ca['ema']['num_updates'] == 4 and cb['started_from'] == ca['started_from'] and ca['started_from']['adapted']


@pytest.mark.parametrize('cond', ['adaln', 'sigma'])
def test_adapting_with_muon_learns_to_read_the_target(env, gpt_run, monkeypatch, tmp_path, cond):
    """Muon (for adaln the AdaLN Linears in it: zero matrices whose first update is all Muon's) on the orders of a
    mix: the any-order loss falls from the GPT's (order-blind) one within a few steps, and the run resumes."""
    argv = args(env, '', f'--out_dir={tmp_path}', f'--cond={cond}', '--optimizer=muon',
                '--order=mix:0.5*nearl2r:4+0.5*random', '--eval_interval=4', '--warmup_iters=0')
    argv += ['--target_dim=8', '--muon_adaln=True'] if cond == 'adaln' else []  # sigma has no AdaLN to size or place
    run_inprocess(monkeypatch, argv + [f'--init_from={gpt_run}', '--max_iters=8'])
    a = log(tmp_path.parent, tmp_path.name)
    assert a[-1]['val_ao'] < a[0]['val_ao'] - 0.1, a
    ck = load_checkpoint(str(tmp_path))
    assert ck['optimizers'][1]['state'] and ck['ema']['num_updates'] == 8
    run_inprocess(monkeypatch, argv + ['--init_from=auto', '--max_iters=9'])
    assert load_checkpoint(str(tmp_path))['iter_num'] == 9


@pytest.fixture(scope='module')
def other_sources(env):
    """An encoder MDM, an AO-GPT, and the GPT's data re-tokenized with another alphabet."""
    train(args(env, 'adapt_mdm', '--causal=False', '--cond=none', '--max_iters=1', '--eval_interval=1'))
    train(args(env, 'adapt_ao', '--max_iters=1', '--eval_interval=1'))
    data = env / 'data' / 'runs_other'
    data.mkdir(exist_ok=True)
    runs_corpus(20000, 0).tofile(data / 'train.bin')
    runs_corpus(4000, 1).tofile(data / 'val.bin')
    (data / 'meta.json').write_text(json.dumps(dict(tokenizer='char', vocab_size=12, chars='abcdefghijkl', eot=None)))
    return env


@pytest.mark.parametrize('source,argv,needle', [
    ('adapt_mdm', ['--cond=adaln'], "adapt_mdm is an encoder MDM (causal=False): its attention sees every position, "
                                    "so it is no left-to-right model to adapt into cond='adaln'"),
    ('adapt_ao', ['--cond=sigma'], "holds a model with cond='adaln', but this config asks for cond='sigma': a "
                                   "fine-tuned model keeps its source's shape (only a GPT's cond may change"),
    ('adapt_src', ['--cond=adaln', '--n_layer=3'], "holds a model with n_layer=2, but this config asks for n_layer=3"),
    ('adapt_src', ['--cond=adaln', '--block_size=32'], "holds a model of block_size 16: use block_size<=16"),
    ('adapt_src', ['--cond=adaln', '--dataset=runs_other'], "runs_other is tokenized with a char codec (12 symbols), "
                                                            "but"),
    ('adapt_src', ['--cond=adaln', '--adaln_init=paper'],
     "opens the AdaLN gates (adaln_init='gate1'), so that the model is its source at step 0; adaln_init='paper' "
     "would close them: leave it out"),
    ('adapt_src', ['--cond=adaln', '--adaln_std=0.2', '--target_std=1.0'],
     "with adaln_std=0.2 draws the AdaLN Linears and starts the target table at zero (so that the model is its "
     "source at step 0), so target_std=1.0 would be ignored"),
    # the table's keys, which an adaptation into sigma-GPT never reads (its table starts at zero, full width)
    ('adapt_src', ['--cond=sigma', '--target_std=1.0'], "target_std=1.0: read only by AO-GPT's AdaLN (cond='adaln'), "
                                                        "and this run trains a sigma-GPT (causal=True, cond='sigma')"),
    ('adapt_src', ['--cond=sigma', '--adaln_std=0.2'], "holds a model with adaln_std=None, but this config asks for "
                                                       "adaln_std=0.2"),  # the adaptation never drew with it
    ('gpt2', ['--cond=adaln'], "runs is tokenized with a char codec (12 symbols), but gpt2:"),
    ('gpt2', ['--cond=adaln', '--dataset=runs_gpt2', '--block_size=32'],
     "holds a model of block_size 16 (GPT-2's positions less the one the [None] start slot takes)"),
])
def test_a_source_that_cannot_be_adapted_is_one_line(env, gpt_run, gpt2_data, other_sources, monkeypatch, capsys,
                                                      tmp_path, source, argv, needle):
    if source == 'gpt2':
        tiny_gpt2(tmp_path / 'hf')
        capsys.readouterr()  # transformers' progress bar
        source = f'gpt2:{tmp_path / "hf"}'
    else:
        source = str(env / source)
    with pytest.raises(SystemExit) as e:
        run_inprocess(monkeypatch, args(env, '', f'--out_dir={tmp_path / "out"}', f'--init_from={source}',
                                        '--max_iters=1', *argv))
    err = capsys.readouterr().err.strip()
    assert e.value.code == 1 and len(err.splitlines()) == 1 and needle in err, err
    assert not (tmp_path / 'out').exists()
