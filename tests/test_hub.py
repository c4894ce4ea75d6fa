"""Checkpoints to and from the Hugging Face hub: export.py's folder, and the hf: sources every script reads.

The hub itself is never contacted. hf: ids are resolved by the real huggingface_hub, offline, from an HF
cache this file lays out the way huggingface_hub does (blobs, snapshots/<commit>/ links, refs/<branch>),
in subprocesses, since huggingface_hub reads HF_HUB_CACHE and HF_HUB_OFFLINE when it is imported.
Exported weights are checked against the in-memory models the checkpoints were saved from.
"""
import json
import os
import pathlib
import pickle
import runpy
import subprocess
import sys
from dataclasses import asdict

import numpy as np
import pytest
import torch
from helpers import BACKBONES, hub_cache, tiny

import eval_ppl
import export
from aogpt import genppl
from aogpt.checkpoint import checkpoint_codec, load_checkpoint, load_model, save_checkpoint
from aogpt.errors import UserError
from aogpt.families import load_hf
from model import GPT, GPTConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEXT = ("the quick brown fox jumps over the lazy dog . " * 3 + "\n") * 40
CHARS = ''.join(sorted(set(TEXT)))
CODEC = {'tokenizer': 'char', 'vocab_size': len(CHARS), 'eot': None, 'chars': CHARS}
EXPORT_FILES = ('config.json', 'model.safetensors')
KINDS = {'adaln': {}, 'sigma': dict(cond='sigma', norm='layer', qk_norm=False, tie_head=True, head_bias=False),
         'gpt': dict(cond='none', tie_head=True, head_bias=False), 'rope': BACKBONES['rope']}


def make_run(path, kind='adaln', seed=0, codec=CODEC, extra_config=None, **extra):
    """A train.py-style checkpoint whose EMA differs from its raw weights; returns (raw, ema) state dicts."""
    model = tiny(seed=seed, block_size=16, vocab_size=32, **KINDS[kind])
    raw = {k: v.clone() for k, v in model.state_dict().items()}
    g = torch.Generator().manual_seed(seed + 100)
    ema = {k: v.detach() + 0.2 * torch.randn(v.shape, generator=g) for k, v in model.named_parameters()}
    ckpt = dict(format='aogpt-v1', model_args=asdict(model.config), model=raw,
                ema=dict(decay=0.99, num_updates=9, params=ema), iter_num=9, tokens=9 * 64,
                config={'dataset': 'tinychars', 'learning_rate': 1e-3, **(extra_config or {})}, order=None, **extra)
    if codec:
        ckpt['codec'] = codec
    save_checkpoint(ckpt, os.path.join(path, 'ckpt.pt'))
    return raw, ema


def reference(config, raw, ema=None):
    """The model the checkpoint was saved from, with the EMA tensors put in place by name."""
    model = GPT(GPTConfig(**config))
    sd = dict(raw)
    if ema is not None:
        sd.update(ema)
        if model.config.tie_head:  # both names are one tensor; the state dict lists lm_head last
            sd['lm_head.weight'] = ema['transformer.wte.weight']
    model.load_state_dict(sd)
    return model.eval()


def logits(model, seed=3):
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, len(CHARS), (4, 16), generator=g)
    order = torch.stack([torch.arange(16)] + [torch.randperm(16, generator=g) for _ in range(3)])
    with torch.no_grad():
        return model(idx, order if model.any_order else None)[0]


def run_export(*args):
    export.main(list(args))


def one_line(capsys, fn, *needles):
    with pytest.raises(SystemExit) as e:
        fn()
    assert e.value.code not in (0, None)
    err = capsys.readouterr().err.strip()
    assert err.startswith('error:') and len(err.splitlines()) == 1, err
    for s in needles:
        assert s in err, err
    return err


# ------------------------------------------------------------------------------------------ export, load
@pytest.mark.parametrize('kind', ['adaln', 'sigma', 'gpt', 'rope'])
def test_export_loads_the_same_logits_without_pickle(tmp_path, kind, monkeypatch, capsys):
    raw, ema = make_run(tmp_path / 'run', kind)
    config = load_checkpoint(str(tmp_path / 'run'))['model_args']
    want = {True: logits(reference(config, raw, ema)), False: logits(reference(config, raw))}
    assert (want[True] - want[False]).abs().max() > 1e-2  # the two weight sets are told apart
    run_export('--out_dir', str(tmp_path / 'run'), '--dest', str(tmp_path / 'ema'))
    run_export('--out_dir', str(tmp_path / 'run'), '--dest', str(tmp_path / 'raw'), '--use_ema', 'False')
    capsys.readouterr()
    from safetensors.torch import load_file
    for name, is_ema in (('ema', True), ('raw', False)):
        folder = tmp_path / name
        assert sorted(os.listdir(folder)) == ['README.md', 'config.json', 'model.safetensors']
        stored = load_file(folder / 'model.safetensors')
        assert ('lm_head.weight' in stored) == (kind in ('adaln', 'rope'))  # a tied head is stored once
        with monkeypatch.context() as m:
            for mod, fn in ((torch, 'load'), (pickle, 'load'), (pickle, 'loads')):
                m.setattr(mod, fn, lambda *a, **k: pytest.fail('an export was read with pickle'))
            model, ck, used = load_model(str(folder))
        assert used is is_ema and ck['weights'] == name and 'optimizer' not in ck
        assert torch.equal(logits(model), want[is_ema])
        if model.config.tie_head:
            assert model.lm_head.weight is model.transformer.wte.weight
        # the export holds one weight set: asking for the other is one line, not a silent swap
        with pytest.raises(UserError, match='holds only its'):
            load_model(str(folder), use_ema=not is_ema)


def test_export_in_16_bits_is_half_the_size_and_close(tmp_path, capsys):
    raw, ema = make_run(tmp_path / 'run')
    run_export('--out_dir', str(tmp_path / 'run'), '--dest', str(tmp_path / 'f32'))
    run_export('--out_dir', str(tmp_path / 'run'), '--dest', str(tmp_path / 'bf16'), '--dtype', 'bfloat16')
    size = lambda d: os.path.getsize(tmp_path / d / 'model.safetensors')
    assert size('bf16') < 0.55 * size('f32')
    model, _, _ = load_model(str(tmp_path / 'bf16'))
    assert json.loads((tmp_path / 'bf16' / 'config.json').read_text())['dtype'] == 'bfloat16'
    want = logits(reference(load_checkpoint(str(tmp_path / 'run'))['model_args'], raw, ema))
    got = logits(model)
    assert not torch.equal(got, want) and torch.allclose(got, want, atol=0.1, rtol=0.05)


def test_config_json_carries_the_codec_and_provenance(tmp_path, capsys):
    """The codec travels in config.json: the export decodes and scores the same after the data is gone,
    also for a checkpoint from before codecs were stored (its codec then comes from its data dir)."""
    data = tmp_path / 'tinychars'
    data.mkdir()
    (data / 'meta.json').write_text(json.dumps(CODEC))
    make_run(tmp_path / 'run', codec=None)
    ckpt = load_checkpoint(str(tmp_path / 'run'))
    ckpt['config']['dataset'] = str(data)  # where an old checkpoint's codec is looked up
    save_checkpoint(ckpt, str(tmp_path / 'run' / 'ckpt.pt'))
    original = checkpoint_codec(ckpt)
    assert original.record() == CODEC
    run_export('--out_dir', str(tmp_path / 'run'), '--dest', str(tmp_path / 'hub'))
    text = tmp_path / 'text.txt'
    text.write_text(TEXT)
    args = ['--datasets', 'ptb', '--data_path', f'ptb={text}', '--max_chunks', '3', '--progress', 'False']
    eval_ppl.main(['--out_dir', str(tmp_path / 'run'), '--json_out', str(tmp_path / 'a.json')] + args)
    (data / 'meta.json').unlink()  # the dataset is gone (or re-prepared): the export does not need it
    cfg = json.loads((tmp_path / 'hub' / 'config.json').read_text())
    assert cfg['codec'] == CODEC and cfg['format'] == 'aogpt-export' and cfg['format_version'] == 1
    assert cfg['weights'] == 'ema' and cfg['iter_num'] == 9 and cfg['tokens'] == 9 * 64
    assert cfg['source'] == {'checkpoint': str(tmp_path / 'run'), 'format': 'aogpt'}
    assert cfg['model_args'] == ckpt['model_args'] and cfg['train_config']['learning_rate'] == 1e-3
    _, ck, _ = load_model(str(tmp_path / 'hub'))
    assert checkpoint_codec(ck).record() == original.record()
    eval_ppl.main(['--ckpt', str(tmp_path / 'hub')] + args)  # writes hub/eval_ppl.json
    out = capsys.readouterr().out
    assert 'char codec' in out
    a = json.loads((tmp_path / 'a.json').read_text())['datasets']['ptb']
    b = json.loads((tmp_path / 'hub' / 'eval_ppl.json').read_text())['datasets']['ptb']
    assert a['l2r']['nll'] == b['l2r']['nll'] and a['any_order']['nll'] == b['any_order']['nll']


def test_model_card_has_metadata_eval_table_and_commands(tmp_path, capsys):
    yaml = pytest.importorskip('yaml')
    make_run(tmp_path / 'run')
    text = tmp_path / 'text.txt'
    text.write_text(TEXT)
    eval_ppl.main(['--out_dir', str(tmp_path / 'run'), '--datasets', 'ptb', '--data_path', f'ptb={text}',
                   '--max_chunks', '3', '--eval_orders', '2', '--progress', 'False'])  # run/eval_ppl.json
    res = json.loads((tmp_path / 'run' / 'eval_ppl.json').read_text())
    # results the card must leave out: another iteration's, and the raw weights'
    stale = dict(res, iter_num=3, datasets={'lambada': res['datasets']['ptb']})
    (tmp_path / 'run' / 'ckpt_0000003.eval_ppl.json').write_text(json.dumps(stale))
    raw = dict(res, ema=False, datasets={'wikitext2': res['datasets']['ptb']})
    (tmp_path / 'run' / 'raw.eval_ppl.json').write_text(json.dumps(raw))
    run_export('--out_dir', str(tmp_path / 'run'), '--dest', str(tmp_path / 'hub'), '--repo_id', 'me/tiny-ao')
    err = capsys.readouterr().err
    assert 'evaluated iteration 3' in err and 'evaluated the raw weights' in err
    card = (tmp_path / 'hub' / 'README.md').read_text()
    _, front, body = card.split('---\n', 2)
    meta = yaml.safe_load(front)
    assert meta['library_name'] == 'aogpt' and meta['license'] == 'other' and 'masked-diffusion' in meta['tags']
    assert 'License: not set' in body and '# tiny-ao' in body
    row = res['datasets']['ptb']
    line = next(ln for ln in body.splitlines() if ln.startswith('| ptb |'))
    assert f"{row['l2r']['ppl']:.2f}" in line and f"{row['any_order']['ppl']:.2f}" in line and 'bpc' in line
    assert 'lambada' not in body and 'wikitext2' not in body
    assert 'python sample.py --ckpt hf:me/tiny-ao' in body
    assert 'python eval_ppl.py --ckpt hf:me/tiny-ao --datasets ptb --eval_orders 2 --max_chunks 3' in body
    assert 'hf upload me/tiny-ao hub' in body and 'learning_rate' in body
    # a license given: no placeholder; a dataset with a hub id is listed in the metadata
    ck = load_checkpoint(str(tmp_path / 'run'))
    ck['config']['dataset'] = 'openwebtext'
    save_checkpoint(ck, str(tmp_path / 'owt' / 'ckpt.pt'))
    run_export('--out_dir', str(tmp_path / 'owt'), '--dest', str(tmp_path / 'hub2'), '--license', 'mit')
    card = (tmp_path / 'hub2' / 'README.md').read_text()
    meta = yaml.safe_load(card.split('---\n', 2)[1])
    assert meta['license'] == 'mit' and meta['datasets'] == ['Skylion007/openwebtext']
    assert 'License: not set' not in card and 'hf:<owner>/<repo>' in card


# ------------------------------------------------------------------------------------------ export's output
def test_a_tied_head_over_two_head_tensors_is_refused(tmp_path, capsys):
    """config.json edited to tie_head=true (config_sha256 deleted, as the changed-file error advises) over an
    export of an untied model: loading kept one of the two head tensors and dropped the other without a word
    (PPL 53.67 instead of 52.21)."""
    make_run(tmp_path / 'run')
    run_export('--out_dir', str(tmp_path / 'run'), '--dest', str(tmp_path / 'hub'))
    cfg_path = tmp_path / 'hub' / 'config.json'
    meta = json.loads(cfg_path.read_text())
    assert meta['model_args']['tie_head'] is False
    meta['model_args']['tie_head'] = True
    del meta['config_sha256']
    cfg_path.write_text(json.dumps(meta))
    with pytest.raises(UserError, match="its model_args say tie_head=True .* but it holds two different ones"):
        load_model(str(tmp_path / 'hub'))


def test_export_never_leaves_a_half_written_folder(tmp_path, monkeypatch, capsys):
    make_run(tmp_path / 'run')
    dest = tmp_path / 'hub'
    run_export('--out_dir', str(tmp_path / 'run'), '--dest', str(dest))
    before = {f: (dest / f).read_bytes() for f in os.listdir(dest)}
    # an existing export is replaced only with --overwrite; a folder of other things never
    one_line(capsys, lambda: run_export('--out_dir', str(tmp_path / 'run'), '--dest', str(dest)), '--overwrite')
    (tmp_path / 'notes').mkdir()
    (tmp_path / 'notes' / 'todo.txt').write_text('mine')
    one_line(capsys, lambda: run_export('--out_dir', str(tmp_path / 'run'), '--dest', str(tmp_path / 'notes'),
                                        '--overwrite'), 'holds no export')
    # the disk fills while writing: one line, the earlier export untouched, no temp folder left behind
    import safetensors.torch

    def full(*a, **k):
        raise OSError(28, 'No space left on device')
    monkeypatch.setattr(safetensors.torch, 'save_file', full)
    one_line(capsys, lambda: run_export('--out_dir', str(tmp_path / 'run'), '--dest', str(dest), '--overwrite',
                                        '--use_ema', 'False'), 'No space left', 'nothing was changed')
    assert {f: (dest / f).read_bytes() for f in os.listdir(dest)} == before
    assert sorted(os.listdir(tmp_path)) == ['hub', 'notes', 'run']
    monkeypatch.undo()
    run_export('--out_dir', str(tmp_path / 'run'), '--dest', str(dest), '--overwrite', '--use_ema', 'False')
    assert json.loads((dest / 'config.json').read_text())['weights'] == 'raw'
    assert sorted(os.listdir(tmp_path)) == ['hub', 'notes', 'run']


def test_overwrite_keeps_the_records_beside_the_export(tmp_path):
    """--overwrite replaces the export, not what the eval scripts wrote into its folder (eval_ppl.json, the
    .jsonl history where every run is kept, the plot, harness.json): those once were deleted with it."""
    make_run(tmp_path / 'run')
    dest = tmp_path / 'hub'
    run_export('--out_dir', str(tmp_path / 'run'), '--dest', str(dest))
    records = {'eval_ppl.json': '{"a": 1}', 'eval_ppl.jsonl': '{"a": 1}\n{"a": 2}\n', 'eval_ppl.png': 'png',
               'harness.json': '{"h": 1}'}
    for f, text in records.items():
        (dest / f).write_text(text)
    (dest / 'notes').mkdir()
    (dest / 'notes' / 'n.txt').write_text('mine')
    run_export('--out_dir', str(tmp_path / 'run'), '--dest', str(dest), '--overwrite', '--use_ema', 'False')
    assert json.loads((dest / 'config.json').read_text())['weights'] == 'raw'  # the export was replaced
    assert {f: (dest / f).read_text() for f in records} == records and (dest / 'notes' / 'n.txt').read_text() == 'mine'
    assert sorted(os.listdir(tmp_path)) == ['hub', 'run']


def test_an_export_that_lands_meanwhile_is_not_replaced(tmp_path, monkeypatch, capsys):
    """Two exports to the same new --dest without --overwrite: the second once replaced the first silently
    (dest was new when it was checked). The check holds at the moment of the write."""
    make_run(tmp_path / 'run')
    dest = tmp_path / 'hub'
    real = export.weights

    def other_export_lands_first(model, dtype):  # while this export loads and converts, another one finishes
        monkeypatch.setattr(export, 'weights', real)
        run_export('--out_dir', str(tmp_path / 'run'), '--dest', str(dest), '--use_ema', 'False')
        return real(model, dtype)
    monkeypatch.setattr(export, 'weights', other_export_lands_first)
    one_line(capsys, lambda: run_export('--out_dir', str(tmp_path / 'run'), '--dest', str(dest)),
             'filled by another export', 'nothing was changed')
    assert json.loads((dest / 'config.json').read_text())['weights'] == 'raw'  # the first one stands
    assert sorted(os.listdir(tmp_path)) == ['hub', 'run']


def test_ctrl_c_during_an_overwrite_leaves_the_old_export(tmp_path, monkeypatch):
    make_run(tmp_path / 'run')
    dest = tmp_path / 'hub'
    run_export('--out_dir', str(tmp_path / 'run'), '--dest', str(dest))
    before = {f: (dest / f).read_bytes() for f in os.listdir(dest)}
    real = os.rename

    def interrupted(a, b):  # Ctrl-C right after the old export was moved aside
        real(a, b)
        if '.old.' in str(b):
            raise SystemExit(130)
    monkeypatch.setattr(os, 'rename', interrupted)
    with pytest.raises(SystemExit):
        run_export('--out_dir', str(tmp_path / 'run'), '--dest', str(dest), '--overwrite', '--use_ema', 'False')
    monkeypatch.undo()
    assert {f: (dest / f).read_bytes() for f in os.listdir(dest)} == before
    assert sorted(os.listdir(tmp_path)) == ['hub', 'run']


@pytest.mark.parametrize('spoil, dtype, says', [
    (lambda w: w.__setitem__((0, 0), 7e4), 'float16', 'does not fit float16: its largest magnitude 7e+04 exceeds 65504'),
    (lambda w: w.__setitem__((0, 0), float('nan')), 'float32', 'holds NaN in its EMA weights'),  # refused at load
])
def test_export_refuses_non_finite_weights(tmp_path, capsys, spoil, dtype, says):
    """float16 turns a weight above 65504 into inf without a word, and an export of inf or NaN weights once
    scored acc 1.0 and sampled padding with exit 0. The export names the tensor and writes nothing."""
    make_run(tmp_path / 'run')
    ck = load_checkpoint(str(tmp_path / 'run'))
    spoil(ck['ema']['params']['transformer.h.0.mlp.c_fc.weight'])
    save_checkpoint(ck, str(tmp_path / 'run' / 'ckpt.pt'))
    one_line(capsys, lambda: run_export('--out_dir', str(tmp_path / 'run'), '--dest', str(tmp_path / 'hub'),
                                        '--dtype', dtype), 'transformer.h.0.mlp.c_fc.weight', says)
    assert sorted(os.listdir(tmp_path)) == ['run']


def _corrupt_weights(folder):
    data = (folder / 'model.safetensors').read_bytes()
    (folder / 'model.safetensors').write_bytes(data[:len(data) // 2])


def _zero_bytes(folder):  # 100 zeroed bytes inside the tensors: safetensors itself reads them without a word
    data = bytearray((folder / 'model.safetensors').read_bytes())
    data[-300:-200] = bytes(100)
    (folder / 'model.safetensors').write_bytes(bytes(data))


def _edit_config(seal_broken=False, **changes):
    """An edit of config.json. By default its config_sha256 goes too (an edit accepted on purpose), so that the
    checks behind the seal are what the case meets; seal_broken=True keeps the seal, as an edit by mistake would."""
    def edit(folder):
        cfg = json.loads((folder / 'config.json').read_text())
        if not seal_broken:
            del cfg['config_sha256']
        for k, v in changes.items():
            if k in GPTConfig.__dataclass_fields__ or k == 'n_layers':
                cfg['model_args'][k] = v
            else:
                cfg[k] = v
        (folder / 'config.json').write_text(json.dumps(cfg))
    return edit


@pytest.mark.parametrize('chars, vocab', [('abc', None), (None, 32)], ids=['far-fewer', 'gpt2-over-32'])
def test_every_command_gets_its_codec_checked_by_load_model(tmp_path, capsys, cli, chars, vocab):
    """load_model(..., dataset=) returns the codec with the model, checked to fit it (codec_misfit). Each
    command once checked a codec from --dataset itself, three of them only for `more symbols than the model`:
    a checkpoint without a stored codec (older, the paper's) was scored or sampled with a 3-symbol codec its
    train config says it never had. Now the one check refuses it in one line, the same from every command."""
    import eval_harness
    make_run(tmp_path / 'run', codec=None, extra_config={'vocab_size': vocab})
    data = tmp_path / 'data'
    data.mkdir()
    (data / 'meta.json').write_text(json.dumps({'tokenizer': 'char', 'chars': list(chars)} if chars else
                                               {'tokenizer': 'gpt2'}))
    run = str(tmp_path / 'run')
    with pytest.raises(UserError) as e:
        load_model(run, dataset=str(data))
    line = e.value.msg
    assert line.endswith('so its ids cannot be read with that codec; pick the --dataset it was trained on'), line
    assert ('far fewer than the model' if chars else 'gpt2 codec has 50257 symbols but the model only 32') in line
    assert load_model(run)[0].config.vocab_size == 32  # without dataset: the model alone, as before
    make_run(tmp_path / 'ok')  # a stored codec: returned as checkpoint_codec reads it
    model, ck, _, codec = load_model(str(tmp_path / 'ok'), dataset='')
    assert codec.record() == checkpoint_codec(ck).record() == CODEC
    for err in (one_line(capsys, lambda: eval_ppl.main(['--ckpt', run, '--dataset', str(data), '--datasets', 'ptb',
                                                          '--progress', 'False'])),
                one_line(capsys, lambda: run_export('--ckpt', run, '--dataset', str(data),
                                                    '--dest', str(tmp_path / 'x'))),
                cli('--ckpt', run, '--dataset', str(data))[2].strip()):
        assert err == f'error: {line}', err
    with pytest.raises(UserError) as e:
        eval_harness.AOGPTLM(ckpt=run, dataset=str(data))
    assert e.value.msg == line


@pytest.mark.parametrize('spoil,spec,needles', [
    (_corrupt_weights, None, ['model.safetensors', 'corrupt']),
    (lambda f: (f / 'model.safetensors').unlink(), None, ['no model.safetensors']),
    (_edit_config(n_layers=3), None, ["unknown model_args ['n_layers']"]),
    (_edit_config(n_layer='2'), None, ['n_layer must be int']),
    (_edit_config(n_head=3), None, ['do not describe a valid model']),
    (_edit_config(codec={'tokenizer': 'bpe', 'vocab_size': 12}), None, ['unreadable codec record']),
    (_edit_config(codec={'tokenizer': 'char', 'vocab_size': 5, 'chars': 'ab'}), None, ['unreadable codec record']),
    (_edit_config(format_version=2), None, ['export format version 2']),
    (_zero_bytes, None, ['model.safetensors does not match the sha256', 'delete "weights_sha256"']),
    (_edit_config(codec={'tokenizer': 'char', 'vocab_size': 3, 'chars': 'abc'},
                  train_config={'vocab_size': None}), None, ['char codec has 3 symbols, far fewer than', 'export the '
                                                             'checkpoint again']),
    (_edit_config(codec={'tokenizer': 'gpt2', 'vocab_size': 50257, 'eot': 50256}), None,
     ['gpt2 codec has 50257 symbols but the model only 32']),
    (lambda f: (f / 'config.json').unlink(), None, ['holds model.safetensors but no config.json']),
    (lambda f: (f / 'config.json').write_text('{"model_type": "gpt2", "n_layer": 2}'), None,
     ['not an export.py folder', '--init_from=DIR']),
    (None, 'hf:owner', ["'hf:owner' names no hub checkpoint", 'hf:owner/repo']),
    (None, 'hf:', ['names no hub checkpoint']),
    (None, 'hf:owner/re po/x.pt', ['names no hub checkpoint']),
    (None, 'me/no-such-model', ['checkpoint not found', 'write hf:me/no-such-model']),
], ids=['corrupt-weights', 'no-weights', 'unknown-key', 'bad-type', 'bad-shape', 'bad-codec', 'short-codec',
        'newer-format', 'zeroed-bytes', 'codec-of-3', 'codec-too-big', 'no-config', 'transformers-folder', 'no-repo',
        'empty', 'bad-repo', 'hub-id-without-hf'])
def test_bad_exports_and_hub_ids_are_one_line(tmp_path, capsys, spoil, spec, needles):
    if spec is None:
        make_run(tmp_path / 'run')
        run_export('--out_dir', str(tmp_path / 'run'), '--dest', str(tmp_path / 'hub'))
        spoil(tmp_path / 'hub')
        spec = str(tmp_path / 'hub')
    capsys.readouterr()
    one_line(capsys, lambda: eval_ppl.main(['--ckpt', spec, '--datasets', 'ptb', '--progress', 'False']), *needles)


def test_weights_edited_on_purpose_load_once_their_sha256_is_deleted(tmp_path, capsys):
    make_run(tmp_path / 'run')
    run_export('--out_dir', str(tmp_path / 'run'), '--dest', str(tmp_path / 'hub'))
    cfg = json.loads((tmp_path / 'hub' / 'config.json').read_text())
    assert len(cfg['weights_sha256']) == 64 and len(cfg['config_sha256']) == 64
    _zero_bytes(tmp_path / 'hub')
    one_line(capsys, lambda: load_model_cli(tmp_path / 'hub'), 'delete "weights_sha256" and "config_sha256"')
    del cfg['weights_sha256'], cfg['config_sha256']
    (tmp_path / 'hub' / 'config.json').write_text(json.dumps(cfg))
    load_model(str(tmp_path / 'hub'))  # the escape hatch: no check without a recorded sha256


def load_model_cli(folder):
    eval_ppl.main(['--ckpt', str(folder), '--datasets', 'ptb', '--progress', 'False'])


@pytest.mark.parametrize('kind, change', [
    ('adaln', dict(gelu='tanh')), ('adaln', dict(causal=False)), ('gpt', dict(gelu='tanh')),
    ('adaln', dict(codec=dict(CODEC, chars=CHARS[::-1]))), ('gpt', dict(weights='raw')),
    ('adaln', dict(fixed_order=list(range(16))[::-1])), ('gpt', dict(train_config={'order': 'random'}))])
def test_an_edit_of_config_json_that_keeps_the_shapes_is_refused(tmp_path, capsys, kind, change):
    """The weights' sha256 was checked but not what says how to run them: a GELU, a norm, the encoder switch,
    the codec's order of characters, the weight set, the order all fit the same tensors and silently made
    another model. config_sha256 covers config.json whole; deleting it accepts an edit made on purpose."""
    make_run(tmp_path / 'run', kind)
    run_export('--out_dir', str(tmp_path / 'run'), '--dest', str(tmp_path / 'hub'))
    _edit_config(seal_broken=True, **change)(tmp_path / 'hub')
    one_line(capsys, lambda: load_model_cli(tmp_path / 'hub'), 'config.json was changed after export',
             'delete "config_sha256"')
    if 'weights' not in change and 'causal' not in change:
        cfg = json.loads((tmp_path / 'hub' / 'config.json').read_text())
        del cfg['config_sha256']
        (tmp_path / 'hub' / 'config.json').write_text(json.dumps(cfg))
        load_model(str(tmp_path / 'hub'))  # accepted on purpose: it loads as edited


def test_non_finite_weights_are_refused_at_load(tmp_path, capsys):
    """A checkpoint holding a NaN once scored acc 1.0 in eval_harness and sampled padding characters, exit 0."""
    make_run(tmp_path / 'run')
    ck = load_checkpoint(str(tmp_path / 'run'))
    ck['model']['transformer.h.1.attn.c_proj.weight'][0, 0] = float('inf')
    save_checkpoint(ck, str(tmp_path / 'run' / 'ckpt.pt'))
    load_model(str(tmp_path / 'run'))  # the EMA weights are finite: they load
    one_line(capsys, lambda: eval_ppl.main(['--out_dir', str(tmp_path / 'run'), '--use_ema', 'False', '--datasets',
                                            'ptb', '--progress', 'False']),
             'transformer.h.1.attn.c_proj.weight holds inf in its raw weights')


def test_a_card_never_shows_another_checkpoints_numbers(tmp_path, capsys):
    """--evals naming another model's eval_ppl.json is refused in one line (no card at all, so none can say
    "no results"); the record names the weights it scored."""
    make_run(tmp_path / 'a', seed=0)
    make_run(tmp_path / 'b', seed=1)  # the same iteration and weight set: only the weights tell them apart
    text = tmp_path / 'text.txt'
    text.write_text(TEXT)
    eval_ppl.main(['--out_dir', str(tmp_path / 'a'), '--datasets', 'ptb', '--data_path', f'ptb={text}',
                   '--max_chunks', '2', '--eval_orders', '1', '--progress', 'False'])
    rec = json.loads((tmp_path / 'a' / 'eval_ppl.json').read_text())
    assert rec['iter_num'] == 9 and len(rec['weights']) == 16
    capsys.readouterr()
    one_line(capsys, lambda: run_export('--out_dir', str(tmp_path / 'b'), '--dest', str(tmp_path / 'hub'),
                                        '--evals', str(tmp_path / 'a' / 'eval_ppl.json')),
             'scored other weights than', "its numbers are not this model's")
    assert not (tmp_path / 'hub').exists()
    run_export('--out_dir', str(tmp_path / 'a'), '--dest', str(tmp_path / 'hub'),  # its own: on the card
               '--evals', str(tmp_path / 'a' / 'eval_ppl.json'))
    assert '| ptb |' in (tmp_path / 'hub' / 'README.md').read_text()
    # iter_num edited into a string once gave "evaluated iteration 9, this checkpoint is at 9"
    rec['iter_num'] = '9'
    (tmp_path / 'a' / 'eval_ppl.json').write_text(json.dumps(rec))
    one_line(capsys, lambda: run_export('--out_dir', str(tmp_path / 'a'), '--dest', str(tmp_path / 'hub2'),
                                        '--evals', str(tmp_path / 'a' / 'eval_ppl.json')),
             "not an eval_ppl.py result", "its iter_num is '9', a str, not an int")


@pytest.mark.parametrize('repo', ['bad id', 'me/bad id', 'a/b/c', 'noowner', 'me/-x'])
def test_a_repo_id_the_hub_refuses_is_one_line(tmp_path, capsys, repo):
    make_run(tmp_path / 'run')
    one_line(capsys, lambda: run_export('--out_dir', str(tmp_path / 'run'), '--dest', str(tmp_path / 'hub'),
                                        '--repo_id', repo), f"--repo_id {repo!r} is not a hub repo id")
    assert not (tmp_path / 'hub').exists()


# ------------------------------------------------------------------------------------------ hf: sources
def hub_env(tmp_path, offline=True):
    env = dict(os.environ, PYTHONPATH=ROOT, HF_HOME=str(tmp_path / 'hf'), HF_HUB_CACHE=str(tmp_path / 'hf' / 'hub'),
               OMP_NUM_THREADS='1')
    if offline:
        env['HF_HUB_OFFLINE'] = '1'
    else:  # left to find out for itself; any request that gets out goes to a closed local port
        env.pop('HF_HUB_OFFLINE', None)
        env.pop('HF_DATASETS_OFFLINE', None)
        env['HF_ENDPOINT'] = 'http://127.0.0.1:9'
    return env


def python(tmp_path, env, *args, timeout=180):
    return subprocess.run([sys.executable, *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=timeout)


PAPER_PATH = '124M/124M-AdaLN6_cond_128_drop_0.0_CL_0.1/ckpt_7.pt'  # dots in folder names, like the paper's


@pytest.mark.slow
def test_hf_ids_resolve_offline_from_the_cache_end_to_end(tmp_path, monkeypatch, capsys):
    from test_paper_ckpt import gpt2_sized_paper_file
    make_run(tmp_path / 'run')
    run_export('--out_dir', str(tmp_path / 'run'), '--dest', str(tmp_path / 'hub'))
    paper = gpt2_sized_paper_file(tmp_path, 'paper-aogpt')
    cache = tmp_path / 'hf' / 'hub'
    files = {f: tmp_path / 'hub' / f for f in ('config.json', 'model.safetensors', 'README.md')}
    files.update({f'v2/{k}': v for k, v in files.items()})  # a second copy in a folder of the repo
    ours = hub_cache(cache, 'me/tiny-ao', files, refs=('main', 'v1'))
    theirs = hub_cache(cache, 'them/AO-GPT-MDM', {PAPER_PATH: pathlib.Path(paper)})
    env = hub_env(tmp_path)

    # which local path each form resolves to
    specs = ['hf:me/tiny-ao', 'hf:me/tiny-ao@v1', f'hf:me/tiny-ao@{ours}', 'hf:me/tiny-ao/v2',
             'hf:me/tiny-ao/v2/model.safetensors', f'hf:them/AO-GPT-MDM/{PAPER_PATH}']
    r = python(tmp_path, env, '-c', 'import json, sys; from aogpt.checkpoint import resolve_path; '
                                    'print(json.dumps([resolve_path(s) for s in sys.argv[1:]]))', *specs)
    assert r.returncode == 0, r.stderr
    snap = lambda repo, commit: str(cache / f'models--{repo.replace("/", "--")}' / 'snapshots' / commit)
    ours_dir = snap('me/tiny-ao', ours)
    assert json.loads(r.stdout) == [ours_dir] * 3 + [os.path.join(ours_dir, 'v2')] * 2 + \
        [os.path.join(snap('them/AO-GPT-MDM', theirs), PAPER_PATH)]

    # eval_ppl.py from our export on the hub: the numbers of the local folder; results land here
    text = tmp_path / 'text.txt'
    text.write_text(TEXT)
    args = ['--datasets', 'ptb', '--data_path', f'ptb={text}', '--max_chunks', '3', '--progress', 'False']
    eval_ppl.main(['--ckpt', str(tmp_path / 'hub'), '--json_out', str(tmp_path / 'local.json')] + args)
    r = python(tmp_path, env, os.path.join(ROOT, 'eval_ppl.py'), '--ckpt', 'hf:me/tiny-ao', *args)
    assert r.returncode == 0, r.stderr
    local = json.loads((tmp_path / 'local.json').read_text())
    remote = json.loads((tmp_path / 'tiny-ao.eval_ppl.json').read_text())
    assert remote['checkpoint'] == 'hf:me/tiny-ao' and remote['ema'] is True
    assert remote['datasets']['ptb']['l2r']['nll'] == pytest.approx(local['datasets']['ptb']['l2r']['nll'],
                                                                     rel=1e-6)

    # sample.py from the paper-format file inside the repo, judged by a (tiny) HF GPT-2 on the hub: the
    # samples of the local file, and the judge's scores of the local GPT-2 folder
    transformers = pytest.importorskip('transformers')
    torch.manual_seed(0)
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16, n_positions=32))
    gpt2.save_pretrained(tmp_path / 'gpt2')
    hub_cache(cache, 'openai-community/gpt2', {f: tmp_path / 'gpt2' / f for f in EXPORT_FILES})
    common = ['--length', '8', '--steps', '3', '--batch_size', '2', '--device', 'cpu', '--seed', '1', '--quiet']
    r = python(tmp_path, env, os.path.join(ROOT, 'sample.py'), '--ckpt', f'hf:them/AO-GPT-MDM/{PAPER_PATH}',
               '--gen_ppl', 'hf:openai-community/gpt2', '--save', str(tmp_path / 'hub.json'), *common)
    assert r.returncode == 0, r.stderr
    r = python(tmp_path, env, os.path.join(ROOT, 'sample.py'), '--ckpt', paper, '--gen_ppl', str(tmp_path / 'gpt2'),
               '--save', str(tmp_path / 'file.json'), *common)
    assert r.returncode == 0, r.stderr
    a, b = (json.loads((tmp_path / f).read_text()) for f in ('hub.json', 'file.json'))
    assert a['samples'] == b['samples'] and a['gen_ppl']['mode'] == b['gen_ppl']['mode'] == 'hf'
    assert a['gen_ppl']['per_sample'] == pytest.approx(b['gen_ppl']['per_sample'], rel=1e-5)
    judge = load_hf(str(tmp_path / 'gpt2')).eval()
    want = genppl.judge_nll(judge, torch.tensor(a['samples']), 'hf').exp()
    assert a['gen_ppl']['per_sample'] == pytest.approx(want.tolist(), rel=1e-5)


@pytest.mark.parametrize('forced', [True, False], ids=['HF_HUB_OFFLINE', 'unreachable'])
def test_an_uncached_hf_id_offline_fails_at_once_in_one_line(tmp_path, forced):
    code = ("import sys, time, eval_ppl\nt = time.time()\ntry:\n    eval_ppl.main(sys.argv[1:])\n"
            "except SystemExit as e:\n    print(f'seconds {time.time() - t:.3f}')\n    raise\n")
    for spec, download in [('hf:nobody/nothing/sub/ckpt_1.pt', 'hf download nobody/nothing sub/ckpt_1.pt'),
                           ('hf:nobody/nothing@v2', 'hf download nobody/nothing config.json model.safetensors '
                                                   '--revision v2 --local-dir DIR')]:
        r = python(tmp_path, hub_env(tmp_path, offline=forced), '-c', code, '--ckpt', spec, '--progress', 'False')
        err = r.stderr.strip()
        assert r.returncode == 1 and len(err.splitlines()) == 1 and 'Traceback' not in r.stderr, r.stderr
        assert err.startswith(f'error: {spec}: ') and 'not in the Hugging Face cache' in err and download in err
        assert ('HF_HUB_OFFLINE is set' in err) == forced
        assert float(r.stdout.split('seconds ')[1]) < 5  # no retries


# ------------------------------------------------------------------------------------------ train.py
@pytest.mark.slow
def test_train_fine_tunes_from_an_exported_folder(tmp_path, monkeypatch, capsys):
    data = tmp_path / 'data' / 'tinychars'
    data.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for split, n in (('train', 4000), ('val', 1000)):
        np.repeat(rng.integers(0, len(CHARS), n // 4), 4).astype(np.uint16).tofile(data / f'{split}.bin')
    (data / 'meta.json').write_text(json.dumps(CODEC))
    tiny_run = ['--dataset=tinychars', f'--data_root={tmp_path / "data"}', '--n_layer=1', '--n_head=2',
                '--n_embd=16', '--target_dim=8', '--block_size=16', '--batch_size=4', '--eval_iters=1',
                '--gradient_accumulation_steps=1', '--eval_orders=1', '--warmup_iters=0', '--device=cpu',
                '--ema_decay=0.5']

    def train(*args):
        monkeypatch.setattr(sys, 'argv', ['train.py', *tiny_run, *args])
        runpy.run_path(os.path.join(ROOT, 'train.py'), run_name='__main__')

    train(f'--out_dir={tmp_path / "src"}', '--max_iters=3', '--eval_interval=3', '--learning_rate=1e-2')
    run_export('--out_dir', str(tmp_path / 'src'), '--dest', str(tmp_path / 'hub'))
    from safetensors.torch import load_file
    exported = load_file(tmp_path / 'hub' / 'model.safetensors')
    src = load_checkpoint(str(tmp_path / 'src'))
    assert not torch.equal(src['model']['lm_head.weight'], exported['lm_head.weight'])  # EMA, not raw
    frozen = ['--max_iters=1', '--eval_interval=1', '--learning_rate=0', '--decay_lr=False']
    train(f'--out_dir={tmp_path / "ft"}', f'--init_from={tmp_path / "hub"}', *frozen)
    assert 'fine-tuning from' in capsys.readouterr().out
    ft = load_checkpoint(str(tmp_path / 'ft'))
    assert ft['model_args'] == src['model_args'] and ft['iter_num'] == 1 and ft['codec'] == CODEC
    assert set(ft['model']) == set(exported)
    for k, v in exported.items():  # lr 0: the fine-tuned run's weights are the exported ones
        assert torch.equal(ft['model'][k], v), k
    # the same export as a hub repo, offline from the cache
    hub_cache(tmp_path / 'hf' / 'hub', 'me/tiny-ao', {f: tmp_path / 'hub' / f for f in EXPORT_FILES})
    r = python(tmp_path, hub_env(tmp_path), os.path.join(ROOT, 'train.py'), *tiny_run, '--init_from=hf:me/tiny-ao',
               f'--out_dir={tmp_path / "ft_hub"}', *frozen)
    assert r.returncode == 0, r.stderr
    ft_hub = load_checkpoint(str(tmp_path / 'ft_hub'))
    assert all(torch.equal(ft_hub['model'][k], v) for k, v in exported.items())
    # resume needs a train.py checkpoint; a malformed hub id fails before anything is read
    one_line(capsys, lambda: train(f'--out_dir={tmp_path / "x"}', '--init_from=hf:owner'),
             'names no hub checkpoint')
    one_line(capsys, lambda: train(f'--out_dir={tmp_path / "y"}', f'--init_from={tmp_path / "hub"}',
                                   '--init_ema=False', *frozen), 'holds only its EMA weights')


@pytest.mark.parametrize('kind', ['adaln', 'gpt'])
def test_the_cards_commands_run_as_written(tmp_path, monkeypatch, kind):
    """Every command in an export's card runs on the model it describes (block_size 16, a char codec): the
    fine-tune line once failed on any model whose block_size is not train.py's 1024 (and its sample lines
    asked for 64 tokens of it, and a prompt its alphabet may not have). Only <data>, the hub id and the
    fine-tune's length are filled in here; the card's keys are kept."""
    import shlex

    import sample
    data = tmp_path / 'data' / 'tinychars'
    data.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for split, n in (('train', 4000), ('val', 1000)):
        rng.integers(0, len(CHARS), n).astype(np.uint16).tofile(data / f'{split}.bin')
    (data / 'meta.json').write_text(json.dumps(CODEC))
    (tmp_path / 'test.txt').write_text(TEXT)
    make_run(tmp_path / 'run', kind, extra_config=dict(batch_size=4, gradient_accumulation_steps=1))
    run_export('--out_dir', str(tmp_path / 'run'), '--dest', str(tmp_path / 'hub'), '--repo_id', 'me/tiny')
    card = (tmp_path / 'hub' / 'README.md').read_text()
    block = card.split('## Use')[1].split('```bash\n')[1].split('```')[0]
    lines = [ln.split('   #')[0].strip() for ln in block.splitlines() if ln.startswith('python ')]
    assert {ln.split()[1] for ln in lines} == {'sample.py', 'eval_ppl.py', 'train.py'}, lines
    monkeypatch.chdir(tmp_path)
    for line in lines:
        line = line.replace('hf:me/tiny', str(tmp_path / 'hub')).replace('<data>', 'tinychars')
        script, *argv = shlex.split(line)[1:]
        if script == 'train.py':
            argv += [f'--data_root={tmp_path / "data"}', '--max_iters=2', '--eval_interval=2', '--eval_iters=1',
                     '--device=cpu']
            monkeypatch.setattr(sys, 'argv', ['train.py', *argv])
            runpy.run_path(os.path.join(ROOT, 'train.py'), run_name='__main__')
            assert load_checkpoint(str(tmp_path / 'out-finetune'))['iter_num'] == 2
        elif script == 'sample.py':
            sample.main(argv + ['--device', 'cpu', '--quiet', 'True'])
        else:
            eval_ppl.main(argv + ['--device', 'cpu', '--progress', 'False', '--plot', 'False'])


@pytest.mark.parametrize('cfg,want', [({'order': 'l2r'}, 'l2r'), ({'order': 'fixed:2'}, 'fixed:2'),
                                      ({'order_mode': 'fixed_random', 'order_seed': 2}, 'fixed:2'),
                                      ({'order_mode': 'block_random'}, 'fixedblocks:4:0'),
                                      ({'order_mode': 'random'}, 'l2r'), ({}, 'l2r')])
def test_a_gpt_cards_finetune_line_keeps_its_order_in_the_new_spelling(cfg, want):
    """A GPT's card fine-tunes in the order it was trained in (a fixed one, else L2R), written as train.py reads
    it now, whether its export's train_config is in the new spelling or the old."""
    ma = dict(block_size=16, causal=True, cond='none')
    line = export.finetune_command('hf:me/gpt', ma, cfg)
    assert f' --order={want} ' in line and 'order_mode' not in line, line
