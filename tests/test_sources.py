"""A source model's folder end to end (issue #49): a tiny Qwen3 and Llama built with transformers, with a byte-level
BPE trained here, saved in the layout the hub ships (config.json, model.safetensors, tokenizer.json,
tokenizer_config.json); data prepared with data/text/prepare.py --tokenizer=<folder>; train.py --init_from=<folder>
reads the data with the source's own tokenizer (the run's codec), starts at the source's own loss, trains, resumes
bit-identically, samples text the source's tokenizer decodes, evaluates and exports; the export reloads to the same
logits. The Qwen3 is padded past its tokenizer (rows the tokenizer never names, as Qwen3-0.6B's 151,936 rows for
151,669 ids) and names a chat turn's end as its eos, so its data is prepared with --eot_token=<|endoftext|>."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from test_train import log, run_inprocess

from aogpt import bins
from aogpt.checkpoint import load_checkpoint, load_model
from aogpt.errors import UserError
from aogpt.valloss import val_windows

transformers = pytest.importorskip('transformers')
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
N = 16  # block_size
WORDS = "the quick brown fox jumps over a lazy dog while seven red birds sing near old stone walls".split()
SPECIALS = ["<|endoftext|>", "<|im_end|>", "<s>"]  # ids 0, 1, 2
# no shape keys: a fine-tune takes its shape from the source, and a key set here would contradict it
TINY = f"""
block_size = {N}
batch_size = 4
gradient_accumulation_steps = 1
eval_iters = 2
eval_orders = 1
warmup_iters = 1
learning_rate = 1e-3
min_lr = 1e-4
ema_decay = 0.9
log_interval = 1
device = 'cpu'
"""


def corpus(n, seed):
    rng = np.random.default_rng(seed)
    return "".join(" ".join(rng.choice(WORDS, int(rng.integers(3, 12)))) + "\n" for _ in range(n))


def tokenizer_files(folder, tok_config):
    """A byte-level BPE trained here on the corpus's words, saved as a model folder holds it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([corpus(50, 9)], trainer)
    tok.save(str(folder / 'tokenizer.json'))
    (folder / 'tokenizer_config.json').write_text(json.dumps(tok_config))
    return tok.get_vocab_size()


# family: (config class, model class, config keys, tokenizer_config.json, prepare.py's extra flags, [None]'s id)
FAMILIES = {
    'qwen3': ('Qwen3Config', 'Qwen3ForCausalLM', dict(num_key_value_heads=1, head_dim=16, rope_theta=1e6,
                                                      eos_token_id=1, bos_token_id=None, tie_word_embeddings=True),
              {'eos_token': '<|im_end|>', 'bos_token': None}, ['--eot_token=<|endoftext|>'], 0),
    'llama': ('LlamaConfig', 'LlamaForCausalLM', dict(num_key_value_heads=1, rope_theta=1e5, bos_token_id=2,
                                                      eos_token_id=0, tie_word_embeddings=False),
              {'eos_token': '<|endoftext|>', 'bos_token': '<s>'}, [], 2),
}


# a GPT-2 of its own 300-id BPE (not in FAMILIES: the module's fixture runs those through everything); GPT2Config reads
# hidden_size and the like as n_embd, n_layer, n_head, n_positions
GPT2_OWN = ('GPT2Config', 'GPT2LMHeadModel', dict(bos_token_id=0, eos_token_id=0),
            {'eos_token': '<|endoftext|>', 'bos_token': '<|endoftext|>'}, [], 0)


def build_source(root, family, prepare=True, spec=None):
    """The model folder, its transformers model (float32, eval) and the data prepared with its tokenizer (None
    with prepare=False). spec: FAMILIES[family]'s form, for a family not there."""
    cfg_cls, model_cls, kw, tok_config, flags, _ = spec or FAMILIES[family]
    folder = root / family
    folder.mkdir()
    vocab = tokenizer_files(folder, tok_config)
    rows = vocab + 37  # padded past the tokenizer, to no multiple of 64 (Qwen's rows are the source's choice)
    cfg = getattr(transformers, cfg_cls)(vocab_size=rows, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                         intermediate_size=48, max_position_embeddings=2 * N, rms_norm_eps=1e-6, **kw)
    torch.manual_seed(0)
    hf = getattr(transformers, model_cls)(cfg).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    hf.save_pretrained(folder)
    if not prepare:
        return folder, hf, None
    (root / 'book.txt').write_text(corpus(300, 1))
    data = root / 'data' / 'book'
    r = subprocess.run([sys.executable, 'data/text/prepare.py', f"--input={root / 'book.txt'}", f'--tokenizer={folder}',
                        f'--out_dir={data}', '--doc_unit=line', *flags], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    (root / 'tiny.py').write_text(TINY)
    return folder, hf, data


@pytest.fixture(scope='module', params=list(FAMILIES))
def source(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    folder, hf, data = build_source(root, request.param)
    return request.param, root, folder, hf, data


def train_args(root, out, *extra):
    return [str(root / 'tiny.py'), f"--data_root={root / 'data'}", '--dataset=book', f'--out_dir={root / out}',
            *extra]


def source_loss(hf, val, none_id, eval_iters=2, batch_size=4):
    """The source's own mean loss on train.py's val windows, each read after [none_id], with transformers."""
    nll = n = 0.0
    with torch.no_grad():
        for starts in val_windows(len(val), N, eval_iters, batch_size):
            x = torch.stack([val[s:s + N] for s in starts])
            logits = hf(torch.cat([torch.full((len(x), 1), none_id), x], 1)).logits[:, :N]
            nll += torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), x.reshape(-1),
                                                     reduction='sum').item()
            n += x.numel()
    return nll / n


def test_a_source_starts_at_its_own_loss_with_its_tokenizer_as_the_codec(source, monkeypatch):
    """--init_from=<folder> --cond=adaln --eval_only: val_l2r is the source's own loss on the same windows, read
    after its BOS (Llama) or the data's end of document (Qwen, whose config names <|im_end|> but whose data ends
    with <|endoftext|>), computed by transformers (class 4 of tests/README.md: float32 sums of 2 x 4 x 16 token
    losses in another order, rel 1e-5). The checkpoint's codec is the source's tokenizer.json, the data's eot."""
    family, root, folder, hf, data = source
    none_id = FAMILIES[family][5]
    run_inprocess(monkeypatch, train_args(root, 'eval', f'--init_from={folder}', '--cond=adaln', '--eval_only=True'))
    val = torch.from_numpy(bins.load_bin(str(data), 'val').astype(np.int64))
    got = log(root, 'eval')[-1]['val_l2r']
    assert got == pytest.approx(source_loss(hf, val, none_id), rel=1e-5)
    # a checkpoint of one step at learning rate 0: the source's record and its codec
    run_inprocess(monkeypatch, train_args(root, 'rec', f'--init_from={folder}', '--max_iters=1', '--eval_interval=1',
                                          '--learning_rate=0', '--warmup_iters=0', '--decay_lr=False'))
    ck = load_checkpoint(str(root / 'rec'))
    src = ck['started_from']['source']
    assert (src['family'], src['none_id']) == (family, none_id)
    assert src['none_from'] == ('doc_end' if family == 'qwen3' else 'bos_token_id')
    tok = (folder / 'tokenizer.json').read_text()
    assert ck['codec']['json'] == tok and ck['codec']['eot'] == 0
    model, _, _, codec = load_model(str(root / 'rec'), 'cpu', dataset='')  # padded rows past the tokenizer: accepted
    assert model.config.vocab_size == codec.vocab_size + 37
    # its export (rope, SwiGLU, GQA, and Qwen3's q/k norms and head width) reloads to the same logits
    import export
    export.main([f'--ckpt={root / "rec"}', f'--dest={root / "rec-hub"}'])
    again, ck, _ = load_model(str(root / 'rec-hub'), 'cpu')
    assert ck['started_from'] == load_checkpoint(str(root / 'rec'))['started_from']
    from aogpt.tokenizer import folder_codec  # the tokenizer files beside it read back as the model's codec
    assert folder_codec(str(root / 'rec-hub')).record() == ck['codec']
    x = val[:2 * N].view(2, N)
    with torch.no_grad():
        assert torch.equal(model(x)[0], again(x)[0])


RECIPE_KEYS = ('target_std', 'adaln_std', 'target_lr_scale', 'order_warmup', 'order_warmup_iters')


def recipe(config):
    """finding 11's recipe as an adapt config carries it: its keys among RECIPE_KEYS, read as the configurator
    reads a config file (plain assignments)."""
    env = {}
    exec(open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'config', config)).read(), env)
    return {k: env[k] for k in RECIPE_KEYS if k in env}


@pytest.mark.parametrize('config', ['adapt_smollm2_135m.py', 'adapt_qwen3_0p6b.py'])
def test_the_adapt_configs_recipe_starts_at_the_source_and_trains_on_every_family(source, monkeypatch, config):
    """The levers finding 11 chose, as config/adapt_*.py carries them, on a Llama and a Qwen3 folder: the adapted
    model is still the source at step 0 (val_l2r = transformers' loss, as above), and it trains with them."""
    family, root, folder, hf, data = source
    keys = recipe(config)
    assert keys, f"config/{config} carries no recipe key"
    extra = [f'--{k}={v}' for k, v in keys.items()]
    out = f'recipe_{config[:-3]}'
    run_inprocess(monkeypatch, train_args(root, out, f'--init_from={folder}', '--cond=adaln', '--max_iters=2',
                                          '--eval_interval=2', *extra))
    val = torch.from_numpy(bins.load_bin(str(data), 'val').astype(np.int64))
    first, last = log(root, out)[0], log(root, out)[-1]
    assert first['val_l2r'] == pytest.approx(source_loss(hf, val, FAMILIES[family][5]), rel=1e-5)
    assert last['iter'] == 2 and np.isfinite(last['val_ao'])
    assert {k: load_checkpoint(str(root / out))['config'][k] for k in keys} == keys  # recorded as given


def test_a_source_folder_judges_samples_in_its_own_codec(source):
    """genppl.load_judge(<Llama/Qwen folder>): the folder's model through the loader, its tokenizer as the codec,
    reading from its BOS, or where it has none from the samples' end of document when they share its
    tokenizer.json (the Qwen's <|endoftext|>, not its config's <|im_end|>); per-sample NLL is transformers' on
    [that token] + the sample (class 4: float32 means of 8 token losses, rel 1e-5)."""
    from aogpt.genppl import judge_nll, load_judge
    from aogpt.tokenizer import get_codec
    family, _, folder, hf, data = source
    codec = get_codec(str(data))
    judge, judge_codec, is_hf = load_judge(str(folder), 'cpu', codec)
    assert not is_hf and judge_codec.record() == codec.record()
    x = torch.from_numpy(bins.load_bin(str(data), 'val')[:16].astype(np.int64)).view(2, 8)
    with torch.no_grad():
        logits = hf(torch.cat([torch.full((2, 1), FAMILIES[family][5]), x], 1)).logits[:, :8]
        want = torch.nn.functional.cross_entropy(logits.transpose(1, 2), x, reduction='none').mean(1)
    assert judge_nll(judge, x).tolist() == pytest.approx(want.tolist(), rel=1e-5)


def test_a_gpt2_folder_with_its_own_tokenizer_uses_it(tmp_path, monkeypatch):
    """A GPT-2-family folder was always taken as tiktoken's GPT-2 codec, so data prepared as the README says
    (prepare.py --tokenizer=<the folder>) was refused ("trained with a gpt2 one (50257)" for a 300-id model), and
    the folder as a judge read the samples in GPT-2's ids. Its tokenizer.json is its codec, as every family's: it
    starts at transformers' own loss on the data it prepared, and judges in that codec; a tokenizer.json that holds
    GPT-2's own vocabulary (the hub's gpt2) is still tiktoken's codec, the one the README's GPT-2 data is in."""
    from aogpt.genppl import load_judge
    from aogpt.tokenizer import byte_chars, gpt2_encoding, is_gpt2_vocabulary
    folder, hf, data = build_source(tmp_path, 'gpt2', spec=GPT2_OWN)
    assert not is_gpt2_vocabulary(str(folder))
    run_inprocess(monkeypatch, train_args(tmp_path, 'eval', f'--init_from={folder}', '--cond=adaln',
                                          '--eval_only=True'))
    val = torch.from_numpy(bins.load_bin(str(data), 'val').astype(np.int64))
    assert log(tmp_path, 'eval')[-1]['val_l2r'] == pytest.approx(source_loss(hf, val, 0), rel=1e-5)  # as above
    judge, codec, is_hf = load_judge(str(folder), 'cpu')
    assert (codec.name, codec.vocab_size, is_hf) == ('tokenizers', 300, False)
    chars, enc = byte_chars(), gpt2_encoding()  # GPT-2's vocabulary written as a tokenizer.json writes it
    vocab = {''.join(chars[b] for b in enc.decode_single_token_bytes(i)): i for i in range(50256)}
    (tmp_path / 'hub_gpt2').mkdir()
    (tmp_path / 'hub_gpt2' / 'tokenizer.json').write_text(json.dumps(dict(model=dict(
        type='BPE', vocab=dict(vocab, **{'<|endoftext|>': 50256}), merges=[]))))
    assert vocab['Ġthe'] == 262 and is_gpt2_vocabulary(str(tmp_path / 'hub_gpt2'))


def test_data_in_another_codec_or_a_disagreeing_bos_is_refused(tmp_path, monkeypatch, capsys):
    """A Llama folder whose data was prepared with GPT-2's BPE (or another tokenizer) is one line; a config.json
    whose bos_token_id is not its tokenizer's bos is one line."""
    folder, _, data = build_source(tmp_path, 'llama')
    other = tmp_path / 'data' / 'gpt2'
    (tmp_path / 'gpt2.txt').write_text(corpus(40, 3))
    r = subprocess.run([sys.executable, 'data/text/prepare.py', f"--input={tmp_path / 'gpt2.txt'}",
                        f'--out_dir={other}', '--doc_unit=line'], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    from aogpt.startup import source_tokenizer
    from aogpt.tokenizer import get_codec
    with pytest.raises(UserError, match="is tokenized with a gpt2 codec .* not .*tokenizer.json .* --tokenizer="):
        source_tokenizer(str(folder), get_codec(str(other)), str(other), str(folder))
    # config.json's bos_token_id changed after the data was prepared: the data's bos is not the folder's
    cfg = json.loads((folder / 'config.json').read_text())
    (folder / 'config.json').write_text(json.dumps(dict(cfg, bos_token_id=0)))
    capsys.readouterr()
    with pytest.raises(SystemExit):
        run_inprocess(monkeypatch, train_args(tmp_path, 'x', f'--init_from={folder}', '--eval_only=True'))
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "meta.json says bos 2 where the folder now says bos 0" in err, err
    # no bos_token_id in config.json: transformers' Llama default (1) is [None], while its tokenizer's bos is <s> (2)
    (folder / 'config.json').write_text(json.dumps({k: v for k, v in cfg.items() if k != 'bos_token_id'}))
    with pytest.raises(SystemExit):
        run_inprocess(monkeypatch, train_args(tmp_path, 'y', f'--init_from={folder}', '--eval_only=True'))
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "[None] would take token 1" in err and "bos is 2" in err, err


def test_an_hf_id_fetches_the_tokenizer_and_the_shards(tmp_path, monkeypatch):
    """--init_from=hf:owner/repo[@rev] of a sharded model with its tokenizer (offline, from a hub cache laid out in
    tmp_path): config.json, the index and every shard it names, tokenizer.json and tokenizer_config.json come from
    the cache, and the snapshot reads as the local folder does, codec and weights alike; a shard the cache lacks
    is one line naming it."""
    import huggingface_hub.constants as C
    from helpers import hub_cache

    from aogpt.families import hf_source
    from aogpt.startup import hf_folder
    from aogpt.tokenizer import folder_codec
    folder, hf, _ = build_source(tmp_path, 'qwen3', prepare=False)
    hf.save_pretrained(tmp_path / 'shards', max_shard_size='20KB')
    shards = sorted(p.name for p in (tmp_path / 'shards').iterdir() if p.name.endswith('.safetensors'))
    assert len(shards) > 1
    files = {f: tmp_path / 'shards' / f for f in ['config.json', 'model.safetensors.index.json'] + shards}
    files.update({f: folder / f for f in ('tokenizer.json', 'tokenizer_config.json')})
    sha = hub_cache(tmp_path / 'hub', 'me/tiny-qwen3', files, refs=('main', 'v1'))
    monkeypatch.setattr(C, 'HF_HUB_CACHE', str(tmp_path / 'hub'))
    got = hf_folder('hf:me/tiny-qwen3@v1')
    assert got.endswith(f'snapshots/{sha}')
    assert folder_codec(got).record() == folder_codec(str(folder)).record()
    ours, source = hf_source(got)
    theirs, _ = hf_source(str(folder))
    assert source['revision'] == sha and sorted(source['weights_sha256']) == shards
    assert all(torch.equal(a, b) for a, b in zip(ours.state_dict().values(), theirs.state_dict().values()))
    files.pop(shards[-1])
    hub_cache(tmp_path / 'hub2', 'me/tiny-qwen3', files)
    monkeypatch.setattr(C, 'HF_HUB_CACHE', str(tmp_path / 'hub2'))
    with pytest.raises(UserError, match=f"{shards[-1]} not in the Hugging Face cache"):
        hf_folder('hf:me/tiny-qwen3')


def python(*argv):
    r = subprocess.run([sys.executable, *map(str, argv)], cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, OMP_NUM_THREADS='1', HF_HUB_OFFLINE='1', WANDB_MODE='disabled'))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return r


@pytest.mark.slow
def test_a_qwen3_folder_end_to_end(tmp_path, monkeypatch):
    """From a Qwen3 folder: a short adaln run equals, bit for bit, one stopped halfway and resumed; it samples
    text the source's own tokenizer decodes, judged by the folder itself (--gen_ppl <folder>: its per-sample NLL
    is transformers' on [<|endoftext|>] + the sample); eval_ppl.py scores a local text file in the source's codec;
    the export reloads to the same logits, and its card names the source (family, sha256 of its weights file)."""
    from tokenizers import Tokenizer
    folder, hf, data = build_source(tmp_path, 'qwen3')
    common = [f'--init_from={folder}', '--cond=adaln', '--eval_interval=2', '--dropout=0.1', '--decay_lr=False']
    run_inprocess(monkeypatch, train_args(tmp_path, 'whole', *common, '--max_iters=4'))
    run_inprocess(monkeypatch, train_args(tmp_path, 'split', *common, '--max_iters=2'))
    run_inprocess(monkeypatch, train_args(tmp_path, 'split', *common[1:], '--init_from=auto', '--max_iters=4'))
    a, b = load_checkpoint(str(tmp_path / 'whole')), load_checkpoint(str(tmp_path / 'split'))
    assert a['iter_num'] == b['iter_num'] == 4 and a['started_from'] == b['started_from']
    for k in a['model']:
        assert torch.equal(a['model'][k], b['model'][k]), k
    strip = lambda recs: [{k: v for k, v in r.items() if k not in ('time', 'tok_per_s')} for r in recs]  # noqa: E731
    assert strip(log(tmp_path, 'whole')) == strip(log(tmp_path, 'split'))
    # samples, decoded with the source's tokenizer, judged by the source folder itself
    python('sample.py', '--ckpt', tmp_path / 'whole', '--length', 8, '--steps', 8, '--batch_size', 2, '--device', 'cpu',
           '--seed', 1, '--quiet', '--gen_ppl', folder, '--save', tmp_path / 's.json')
    s = json.loads((tmp_path / 's.json').read_text())
    tok = Tokenizer.from_file(str(folder / 'tokenizer.json'))
    assert s['texts'] == [tok.decode(ids, skip_special_tokens=False) for ids in s['samples']]
    assert s['gen_ppl']['mode'] == 'none' and s['gen_ppl']['per_sequence_tokens'] == 'sample ids'
    with torch.no_grad():
        x = torch.tensor(s['samples'])
        logits = hf(torch.cat([torch.zeros(len(x), 1, dtype=torch.long), x], 1)).logits[:, :x.size(1)]
        nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), x, reduction='none').mean(1)
    assert s['gen_ppl']['per_sample'] == pytest.approx(nll.exp().tolist(), rel=1e-5)
    # eval_ppl on a local text file, encoded with the run's codec (the source's tokenizer)
    (tmp_path / 'held.txt').write_text(corpus(20, 5))
    python('eval_ppl.py', '--ckpt', tmp_path / 'whole', '--datasets', 'ptb', '--data_path',
           f"ptb={tmp_path / 'held.txt'}", '--max_chunks', 2, '--device', 'cpu', '--progress', False,
           '--plot', False, '--json_out', tmp_path / 'e.json')
    e = json.loads((tmp_path / 'e.json').read_text())
    assert e['codec'] == 'tokenizers' and 0 < e['datasets']['ptb']['l2r']['nll'] < 10
    # the export reloads to the same logits; its card names the source
    python('export.py', '--ckpt', tmp_path / 'whole', '--dest', tmp_path / 'exp')
    m1, _, _ = load_model(str(tmp_path / 'whole'), 'cpu')
    m2, ck2, _ = load_model(str(tmp_path / 'exp'), 'cpu')
    assert ck2['codec']['json'] == (folder / 'tokenizer.json').read_text()
    x = torch.tensor(s['samples'])
    with torch.no_grad():
        assert torch.equal(m1(x)[0], m2(x)[0])
    card = (tmp_path / 'exp' / 'README.md').read_text()
    sha = a['started_from']['source']['weights_sha256']['model.safetensors']
    assert 'a Hugging Face qwen3 model' in card and sha in card and 'its token 0 (doc_end)' in card
    # the card's sampling and quick eval lines run as written, on the export folder in place of the hub id
    lines = [l.split('   #')[0] for l in card.splitlines() if l.startswith('python sample.py') or '--max_chunks' in l]
    assert len(lines) == 2
    for line in lines:
        python(*line.replace('hf:<owner>/<repo>', str(tmp_path / 'exp')).split()[1:], '--device', 'cpu')
    # and its line that prepares fine-tuning data gives data in the model's codec
    line, = [l.split('   #')[0] for l in card.splitlines() if l.startswith('python data/text/prepare.py')]
    python(*line.replace('hf:<owner>/<repo>', str(tmp_path / 'exp')).replace('<text file>', str(tmp_path / 'held.txt'))
           .replace('data/<data>', str(tmp_path / 'data' / 'more')).split()[1:], '--val_fraction=0.5')
    from aogpt.tokenizer import get_codec
    assert get_codec(str(tmp_path / 'data' / 'more')).record() == ck2['codec']


@pytest.mark.parametrize('spoil,needle', [
    ('config', "config.json: it is not JSON"),
    ('tensor', "the weights have no model.layers.1.mlp.down_proj.weight"),
])
def test_a_judge_folder_goes_through_the_loaders_checks(tmp_path, capsys, spoil, needle):
    """A --gen_ppl judge folder is read by the loader every source goes through: a config.json that is not JSON or
    a missing tensor is a UserError (sample.py's one line), before any sampling."""
    from safetensors.torch import load_file, save_file
    folder, _, _ = build_source(tmp_path, 'llama', prepare=False)
    if spoil == 'config':
        (folder / 'config.json').write_text('{not json')
    else:
        sd = load_file(str(folder / 'model.safetensors'))
        del sd['model.layers.1.mlp.down_proj.weight']
        save_file(sd, str(folder / 'model.safetensors'))
    from aogpt.genppl import load_judge
    with pytest.raises(UserError, match=needle):
        load_judge(str(folder), 'cpu')
