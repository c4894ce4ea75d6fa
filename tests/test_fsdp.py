"""fsdp=True: train.py's sharded path (aogpt/parallel.py, aogpt/sharded.py) on CPU, with gloo ranks under torchrun (and
a world of one in this process), against the same runs unsharded in one process.

Tolerances. A world of one is one process's run bit for bit (its reduce-scatter over one rank is the identity), and so
is a resume at the same world size. Two ranks sum each gradient in another order than one process accumulating the
same micro-steps: float32 rounding, a few ulps (2^-23 relative each) per step, which the next steps carry on.
AdamW normalises every update by its running RMS, so such a perturbation moves a weight by about lr x (relative
gradient change) per step, and over 20 steps at lr 1e-2 the losses (about 2 to 6) stay within 1e-5 of each other,
as DDP's own test holds them (test_train.assert_same_run); Muon runs its Newton-Schulz iteration in float32 there
(muon_dtype), as the DDP test does, for the reason that test gives."""
import json
import os
import signal
import socket
import subprocess
import sys

import numpy as np
import pytest
import torch
from test_train import args, env, run, run_inprocess  # noqa: F401 (env: a fixture)

from aogpt.checkpoint import load_checkpoint

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENVIRON = dict(os.environ, OMP_NUM_THREADS='1', WANDB_MODE='disabled')
CHECKS = os.path.join(ROOT, 'tests', 'fsdp_checks.py')
ROPE = ['--pos=rope', '--mlp=swiglu', '--mlp_hidden=48', '--n_kv_head=1', '--bias=False', '--qkv_bias=True']


def torchrun(*argv, nproc=2):
    cmd = [sys.executable, '-m', 'torch.distributed.run', '--standalone', f'--nproc_per_node={nproc}', *argv]
    p = subprocess.run(cmd, capture_output=True, text=True, env=ENVIRON, cwd=ROOT, timeout=600)
    if p.returncode != 0 and 'connectFullMesh' in p.stderr:  # gloo's loopback connect can race on a loaded machine
        p = subprocess.run(cmd, capture_output=True, text=True, env=ENVIRON, cwd=ROOT, timeout=600)
    assert p.returncode == 0, f"{' '.join(argv)} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-5000:]}"
    return p


def same_weights(a, b, atol=0.0):
    """Two runs' checkpoints (ckpt.pt or a sharded save) hold the same weights and EMA: bit for bit (atol 0) or to
    atol (rtol 1e-4)."""
    ca, cb = load_checkpoint(str(a)), load_checkpoint(str(b))
    assert ca['iter_num'] == cb['iter_num']
    for part in ('model', 'ema'):
        ta, tb = (ca['model'], cb['model']) if part == 'model' else (ca['ema']['params'], cb['ema']['params'])
        assert set(ta) == set(tb)
        for k in ta:
            if atol == 0:
                assert torch.equal(ta[k], tb[k]), (part, k)
            else:
                torch.testing.assert_close(ta[k], tb[k], atol=atol, rtol=1e-4)


def same_logs(a, b, tol=0.0):
    la, lb = ([json.loads(line) for line in open(os.path.join(d, 'log.jsonl'))] for d in (a, b))
    assert [r['iter'] for r in la] == [r['iter'] for r in lb]
    for ra, rb in zip(la, lb):
        for k in ('train_loss', 'val_l2r', 'val_ao', 'val_elbo', 'val_loss'):
            if ra[k] is None:
                assert rb[k] is None
            else:
                assert abs(ra[k] - rb[k]) <= tol, (k, ra, rb)
    return la


# ---------------------------------------------------------------------------------------------- the sharded model

def test_a_sharded_model_is_the_unsharded_one():
    """On 2 gloo ranks (tests/fsdp_checks.py): built on meta from a seed, every formulation's gathered weights are
    GPT(config)'s bit for bit; every entry point gives its numbers; a Muon step on the same gradients is the
    unsharded one bit for bit (and torch's Muon on the shards is not); each rank holds at most 55% of the weights,
    gradients, AdamW state and EMA."""
    p = torchrun(CHECKS, 'init', 'entry_points', 'muon_step', 'bytes')
    for check in ('init', 'entry_points', 'muon_step', 'bytes'):
        assert p.stdout.count(f'ok {check} ') == 2, p.stdout


@pytest.mark.slow
def test_sharded_steps_are_the_unsharded_ones():
    """Two steps of AdamW, and of Muon with activation checkpointing, with clipping and the EMA, on the paper's
    block, the rope block and the encoder: losses, norms, weights and EMA as one process's."""
    p = torchrun(CHECKS, 'steps')
    assert p.stdout.count('ok steps ') == 2, p.stdout


@pytest.mark.parametrize('block', ['paper', 'rope'])
def test_activation_checkpointing_gives_the_same_gradients(block):
    """Each block recomputed in backward: the gradients of every parameter equal those kept in memory (float64; the
    recomputation runs the same ops on the same inputs, dropout's draws replayed), and the weights' names stay."""
    from aogpt.parallel import recompute_blocks
    from model import GPT, GPTConfig
    cfg = dict(block_size=16, vocab_size=64, n_layer=2, n_head=2, n_embd=32, target_dim=16, dropout=0.1)
    if block == 'rope':
        cfg.update(pos='rope', mlp='swiglu', n_kv_head=1, bias=False)
    grads = []
    for ac in (False, True):
        torch.manual_seed(0)
        model = GPT(GPTConfig(**cfg)).double()
        names = [n for n, _ in model.named_parameters()]
        if ac:
            recompute_blocks(model)
        x = torch.randint(0, 64, (3, 16), generator=torch.Generator().manual_seed(1))
        order = torch.stack([torch.randperm(16, generator=torch.Generator().manual_seed(i)) for i in range(3)])
        torch.manual_seed(2)  # dropout's draws
        model(x, order=order, targets=x)[1].backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
        assert [n for n, _ in model.named_parameters()] == names
    for n in grads[0]:
        assert torch.equal(grads[0][n], grads[1][n]), n


# ---------------------------------------------------------------------------------------------- train.py, one rank

ONE_RANK = {  # settings a world of one runs bit for bit as one unsharded process
    'ao': [],
    'rope_muon_ac': ROPE + ['--optimizer=muon', '--muon_dtype=float32', '--activation_checkpointing=True'],
    'mdm_chunks': ['--causal=False', '--cond=none', '--loss_chunk=24', '--dropout=0.1'],
    'table_fixed': ['--adaln_table=True', '--order=fixed:3', '--dropout=0.1', '--keep_ckpt_every=2'],
}


@pytest.mark.parametrize('case', list(ONE_RANK))
def test_a_world_of_one_is_the_unsharded_run_bit_for_bit(env, monkeypatch, case, tmp_path):
    """fsdp=True without torchrun runs as a world of one: its reduce-scatter over one rank is the identity, so its
    losses, weights and EMA are the unsharded run's bit for bit, whatever the formulation, block, optimizer,
    recomputation or loss chunking; its export is the same folder (the same safetensors bytes)."""
    common = ['--max_iters=4', '--eval_interval=2', *ONE_RANK[case]]
    run_inprocess(monkeypatch, args(env, f'one_{case}', *common))
    run_inprocess(monkeypatch, args(env, f'one_{case}_fsdp', *common, '--fsdp=True'))
    same_logs(env / f'one_{case}', env / f'one_{case}_fsdp')
    same_weights(env / f'one_{case}', env / f'one_{case}_fsdp')
    held = sorted(os.listdir(env / f'one_{case}_fsdp'))
    assert [f for f in held if f.endswith('.dcp')] == (['ckpt_0000002.dcp', 'ckpt_0000004.dcp']
                                                       if case == 'table_fixed' else ['ckpt_0000004.dcp'])
    if case == 'ao':
        import export  # noqa: E402 (a command: imported where it is used)
        outs = []
        for run_dir in (f'one_{case}', f'one_{case}_fsdp'):
            export.main([f"--ckpt={env / run_dir}", f"--dest={tmp_path / run_dir}"])
            outs.append((tmp_path / run_dir / 'model.safetensors').read_bytes())
        assert outs[0] == outs[1]


def test_a_sharded_run_refuses_what_it_cannot_do(env, monkeypatch, capsys):
    """One line each, never a silent fallback: float16 (its gradient scaler does not take shards), and a resume that
    would change fsdp (the optimizer states are kept in the layout the run saved)."""
    def line(*extra):
        with pytest.raises(SystemExit) as e:
            run_inprocess(monkeypatch, args(env, *extra))
        err = capsys.readouterr().err.strip().splitlines()
        assert e.value.code == 1 and len(err) == 1, err
        return err[0]
    assert 'trains in bfloat16 or float32' in line('f16', '--fsdp=True', '--dtype=float16', '--max_iters=1')
    from aogpt.errors import UserError
    from aogpt.parallel import check_sharding
    with pytest.raises(UserError, match='not over mps'):  # no machine here has one: the check itself
        check_sharding(True, 'mps', 'float32')
    run_inprocess(monkeypatch, args(env, 'plain_run', '--max_iters=2', '--eval_interval=2'))
    assert 'resumes with fsdp=False' in line('plain_run', '--fsdp=True', '--init_from=auto', '--max_iters=4')
    run_inprocess(monkeypatch, args(env, 'sharded_run', '--max_iters=2', '--eval_interval=2', '--fsdp=True'))
    assert 'resumes with fsdp=True' in line('sharded_run', '--init_from=auto', '--max_iters=4')


# ---------------------------------------------------------------------------------------------- train.py, two ranks

@pytest.mark.slow
@pytest.mark.parametrize('case', ['paper_adamw_ac', 'rope_muon'])
def test_two_ranks_match_one_process_over_20_steps(env, case):
    """torchrun, 2 gloo ranks, fsdp=True against one unsharded process on the same global batch (4 micro-steps: 2
    per rank), 20 steps: every logged loss within 1e-5 (the module's docstring), the weights and EMA to 1e-5.
    The paper's block with AdamW and activation checkpointing; the rope block with Muon."""
    extra = ['--activation_checkpointing=True'] if case == 'paper_adamw_ac' else \
        ROPE + ['--optimizer=muon', '--muon_dtype=float32']
    common = ['--max_iters=20', '--eval_interval=10', '--batch_size=4', '--gradient_accumulation_steps=4', *extra]
    run(env, args(env, f'w1_{case}', *common))
    p = run(env, args(env, f'w2_{case}', *common, '--fsdp=True'), torchrun=True)
    assert '2 rank(s) (FSDP)' in p.stdout
    recs = same_logs(env / f'w1_{case}', env / f'w2_{case}', tol=1e-5)
    assert recs[-1]['val_ao'] < recs[0]['val_ao'] - 0.3  # the runs moved
    same_weights(env / f'w1_{case}', env / f'w2_{case}', atol=1e-5)


@pytest.mark.slow
def test_a_sharded_resume_is_bit_identical_and_reshards(env):
    """2 ranks for 6 steps in one go == 3 steps, then a resume on 2 ranks (bit for bit: the same shards, the same
    summation order); the 3-step save resumed on one process (2 -> 1), and a one-process save resumed on 2 ranks
    (1 -> 2), each within the float32 summation bound of the module's docstring."""
    common = ['--eval_interval=3', '--batch_size=4', '--gradient_accumulation_steps=4', '--fsdp=True']
    run(env, args(env, 'r_whole', *common, '--max_iters=6'), torchrun=True)
    run(env, args(env, 'r_split', *common, '--max_iters=3'), torchrun=True)
    os.system(f"cp -r {env / 'r_split'} {env / 'r_to1'}")
    p = run(env, args(env, 'r_split', *common, '--max_iters=6', '--init_from=auto'), torchrun=True)
    assert 'resumed' in p.stdout
    same_logs(env / 'r_whole', env / 'r_split')
    same_weights(env / 'r_whole', env / 'r_split')
    run(env, args(env, 'r_to1', *common, '--max_iters=6', '--init_from=auto'))
    same_logs(env / 'r_whole', env / 'r_to1', tol=1e-5)
    same_weights(env / 'r_whole', env / 'r_to1', atol=1e-5)
    run(env, args(env, 'r_from1', *common, '--max_iters=3'))
    assert load_checkpoint(str(env / 'r_from1'))['world_size'] == 1
    run(env, args(env, 'r_from1', *common, '--max_iters=6', '--init_from=auto'), torchrun=True)
    same_logs(env / 'r_whole', env / 'r_from1', tol=1e-5)
    same_weights(env / 'r_whole', env / 'r_from1', atol=1e-5)


@pytest.mark.slow
def test_a_kill_during_a_sharded_save_loses_nothing(env):
    """Rank 1 is SIGKILLed while it writes its rows of the second save: the first save stays whole and loadable,
    the half-written one never gets a save's name, and torchrun --max-restarts=1 resumes both ranks from the first
    (init_from=auto), cleaning the temp folder, to the uninterrupted run's numbers bit for bit."""
    common = ['--eval_interval=3', '--batch_size=4', '--gradient_accumulation_steps=4', '--fsdp=True',
              '--max_iters=6']
    run(env, args(env, 'k_whole', *common), torchrun=True)
    kill = """
    import signal
    from torch.distributed.checkpoint import HuggingFaceStorageWriter
    orig = HuggingFaceStorageWriter.write_data
    calls = [0]
    def write_data(self, plan, planner):
        calls[0] += 1
        if calls[0] == 2 and os.environ['RANK'] == '1' and os.environ['TORCHELASTIC_RESTART_COUNT'] == '0':
            open(os.path.join(str(self.path), 'half.safetensors'), 'wb').write(b'x' * 100)
            os.kill(os.getpid(), signal.SIGKILL)
        return orig(self, plan, planner)
    HuggingFaceStorageWriter.write_data = write_data
    """
    p = run(env, args(env, 'k_split', *common, '--init_from=auto'), pre=kill, torchrun=True, restarts=1)
    assert 'resumed' in p.stdout and 'ckpt_0000003.dcp' in p.stdout
    assert not [f for f in os.listdir(env / 'k_split') if '.tmp.' in f]
    same_logs(env / 'k_whole', env / 'k_split')
    same_weights(env / 'k_whole', env / 'k_split')


@pytest.mark.slow
def test_two_nodes_of_one_process_each_are_one_process(env):
    """Two torchrun invocations, --nnodes=2 --node_rank=0/1, one process each, meeting at a rendezvous on
    127.0.0.1: the run a multi-node job makes, within the float32 summation bound of one process's."""
    common = ['--max_iters=4', '--eval_interval=2', '--batch_size=4', '--gradient_accumulation_steps=4']
    run(env, args(env, 'n_one', *common))
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        port = s.getsockname()[1]
    argv = [os.path.join(ROOT, 'train.py'), *args(env, 'n_two', *common, '--fsdp=True')]
    nodes = [subprocess.Popen([sys.executable, '-m', 'torch.distributed.run', '--nnodes=2', f'--node_rank={r}',
                               '--nproc_per_node=1', '--rdzv_backend=c10d', f'--rdzv_endpoint=127.0.0.1:{port}',
                               '--rdzv_id=aogpt-test', *argv], cwd=ROOT, env=ENVIRON, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    outs = [n.communicate(timeout=600) for n in nodes]
    assert all(n.returncode == 0 for n in nodes), outs
    assert '2 rank(s) (FSDP)' in outs[0][0] + outs[1][0]
    same_logs(env / 'n_one', env / 'n_two', tol=1e-5)
    same_weights(env / 'n_one', env / 'n_two', atol=1e-5)


# ---------------------------------------------------------------------------------------------- from a source folder

@pytest.fixture(scope='module')
def sources(tmp_path_factory):
    """A tiny Qwen3 (tied head) and Llama folder built by transformers, each with data prepared by its tokenizer
    (tests/test_sources.py's build_source): {family: (root, folder, transformers model, data)}."""
    from test_sources import build_source
    out = {}
    for family in ('qwen3', 'llama'):
        root = tmp_path_factory.mktemp(f'fsdp_{family}')
        out[family] = (root, *build_source(root, family))
    return out


def source_args(root, out, folder, *extra):
    return [str(root / 'tiny.py'), f"--data_root={root / 'data'}", '--dataset=book', f'--out_dir={root / out}',
            f'--init_from={folder}', *extra]


@pytest.mark.parametrize('family', ['qwen3', 'llama', 'gpt2'])
def test_a_source_parameter_is_read_by_rows(family, sources, tmp_path):
    """families.source_rows: every parameter's rows [a, b), for cuts of every size, are the rows of the model
    hf_source builds (GPT-2's Conv1D columns transposed, fused q/k/v and gate/up across their tensors' edges, [None]'s
    one row, GPT-2's positions cut to block_size), so a rank that reads only its rows holds its shard of that model."""
    from aogpt.families import hf_source, source_rows
    if family == 'gpt2':
        import transformers
        cfg = transformers.GPT2Config(vocab_size=70, n_positions=24, n_embd=16, n_layer=2, n_head=2, bos_token_id=0,
                                      eos_token_id=0)
        transformers.GPT2LMHeadModel(cfg).save_pretrained(tmp_path)
        folder, over = str(tmp_path), dict(block_size=13)
    else:
        folder, over = str(sources[family][1]), {}
    whole, _ = hf_source(folder, **over)
    _, _, rows = source_rows(folder, **over)
    params = dict(whole.named_parameters())
    assert set(rows) == set(params)
    for name, read in rows.items():
        n = params[name].shape[0]
        for parts in (1, 2, 3, 5):
            size = -(-n // parts)
            got = torch.cat([read(min(n, i * size), min(n, (i + 1) * size)) for i in range(parts)])
            assert torch.equal(got.float(), params[name].detach()), (name, parts)


@pytest.mark.slow
def test_a_sharded_start_from_a_folder_is_exact_and_reads_only_its_rows(sources):
    """2 ranks, --init_from=<Qwen3 folder> --cond=adaln --eval_only: val_l2r is the source's own loss computed by
    transformers (rel 1e-5: float32 sums in another order, as tests/test_sources.py holds it), and no rank reads the
    whole state dict: each reads at most 55% of the source's elements, every element read by exactly one rank."""
    from test_sources import FAMILIES, source_loss
    from aogpt import bins
    root, folder, hf, data = sources['qwen3']
    count = f"""
    import json, torch
    from aogpt import families
    orig, seen = families._read_rows, [0]
    def counted(how, parts, a, b):
        out = orig(how, parts, a, b)
        seen[0] += out.numel()
        with open({str(root)!r} + '/read_rank' + os.environ['RANK'], 'w') as f:
            f.write(str(seen[0]))
        return out
    families._read_rows = counted
    """
    run(root, source_args(root, 'exact', folder, '--cond=adaln', '--eval_only=True', '--fsdp=True',
                          '--gradient_accumulation_steps=2'), pre=count,
        torchrun=True)
    val = torch.from_numpy(bins.load_bin(str(data), 'val').astype(np.int64))
    got = [json.loads(line) for line in open(root / 'exact' / 'log.jsonl')][-1]['val_l2r']
    assert got == pytest.approx(source_loss(hf, val, FAMILIES['qwen3'][5]), rel=1e-5)
    total = sum(p.numel() for n, p in hf.named_parameters() if n != 'lm_head.weight')  # tied: the embedding's
    read = [int((root / f'read_rank{r}').read_text()) for r in (0, 1)]
    assert sum(read) == total and max(read) <= 0.55 * total, (read, total)


@pytest.mark.slow
@pytest.mark.parametrize('family', ['qwen3', 'llama'])
def test_two_ranks_adapt_a_folder_as_one_process(sources, family):
    """An adaptation from a source folder (its rows read by each rank, the new table drawn as one process draws it),
    2 ranks against one unsharded process over 20 steps: Qwen3 (tied head) with AdamW, Llama with Muon, to the
    module's float32 bound. The same command run again with more steps (torchrun --max-restarts' rerun) resumes
    its own run."""
    root, folder, _, _ = sources[family]
    extra = ['--optimizer=muon', '--muon_dtype=float32'] if family == 'llama' else []
    common = ['--max_iters=20', '--eval_interval=10', '--batch_size=2', '--gradient_accumulation_steps=4', *extra]
    run(root, source_args(root, 'one', folder, *common))
    run(root, source_args(root, 'two', folder, *common, '--fsdp=True'), torchrun=True)
    recs = same_logs(root / 'one', root / 'two', tol=1e-5)
    assert recs[-1]['val_ao'] < recs[0]['val_ao'] - 0.05  # the runs moved
    same_weights(root / 'one', root / 'two', atol=1e-5)
    a, b = (load_checkpoint(str(root / d))['started_from'] for d in ('one', 'two'))
    assert a == dict(b, path=a['path']) and a['weights_sha256'] is not None  # the same record, hash included
    p = run(root, source_args(root, 'two', folder, *common[1:], '--max_iters=22', '--fsdp=True'), torchrun=True)
    assert 'holds the run this command started' in p.stdout and 'resumed' in p.stdout


def test_a_fine_tune_command_run_again_resumes_its_own_run(sources, monkeypatch, capsys):
    """The same --init_from=<folder> command into an out_dir holding its run resumes it (bit for bit the run in one
    go); a command with another source there is refused in one line; a command killed before its first save starts
    over from its source (step 0 is the source's loss), never from scratch."""
    root, folder, _, _ = sources['llama']
    common = ['--eval_interval=2', '--batch_size=2']
    run_inprocess(monkeypatch, source_args(root, 'ft_whole', folder, *common, '--max_iters=4'))
    run_inprocess(monkeypatch, source_args(root, 'ft_split', folder, *common, '--max_iters=2'))
    run_inprocess(monkeypatch, source_args(root, 'ft_split', folder, *common, '--max_iters=4'))
    assert 'holds the run this command started' in capsys.readouterr().out
    same_logs(root / 'ft_whole', root / 'ft_split')
    same_weights(root / 'ft_whole', root / 'ft_split')
    with pytest.raises(SystemExit):
        run_inprocess(monkeypatch, source_args(root, 'ft_split', sources['qwen3'][1], *common, '--max_iters=6'))
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and 'already holds checkpoints' in err[0], err
    # killed before its first save (SIGKILL in iteration 1): only the step-0 eval is logged; the same command run
    # again starts over from its source, not from scratch, and is then the run in one go
    kill = """
    import signal, torch
    from model import GPT
    orig = GPT.forward
    def forward(self, *a, **k):
        if torch.is_grad_enabled():
            os.kill(os.getpid(), signal.SIGKILL)
        return orig(self, *a, **k)
    GPT.forward = forward
    """
    p = run(root, source_args(root, 'ft_early', folder, *common, '--max_iters=4'), pre=kill, check=False)
    assert p.returncode == -signal.SIGKILL and not os.path.exists(root / 'ft_early' / 'ckpt.pt')
    run_inprocess(monkeypatch, source_args(root, 'ft_early', folder, *common, '--max_iters=4'))
    assert 'resum' not in capsys.readouterr().out
    same_logs(root / 'ft_whole', root / 'ft_early')


@pytest.mark.slow
@pytest.mark.parametrize('config, family, repo', [('adapt_qwen3_8b.py', 'qwen3', 'Qwen/Qwen3-8B'),
                                                  ('adapt_llama3_8b.py', 'llama', 'meta-llama/Llama-3.1-8B')])
def test_the_8b_configs_run_as_shipped(tmp_path, config, family, repo):
    """config/adapt_*_8b.py under torchrun on 2 gloo ranks, offline, against a tiny model of its family served under
    the config's own hub id from a Hugging Face cache (the Llama with Llama 3's rope scaling, as 3.1's config.json
    has it), its data prepared with that model's tokenizer under the config's dataset name. As shipped (fsdp,
    activation checkpointing, bfloat16, the recipe, the accumulation), but for what a tiny model on a CPU needs: the
    window and its order warmup, the micro-batch, two steps, no compile."""
    from helpers import hub_cache
    from test_sources import build_source
    folder, _, data = build_source(tmp_path, family)
    if family == 'llama':
        hf = json.loads((folder / 'config.json').read_text())
        hf['rope_scaling'] = dict(rope_type='llama3', factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                  original_max_position_embeddings=8)
        (folder / 'config.json').write_text(json.dumps(hf))
    hub_cache(tmp_path / 'hub', repo, {name: folder / name for name in os.listdir(folder)})
    shipped = {}
    exec(open(os.path.join(ROOT, 'config', config)).read(), shipped)
    os.symlink(data, tmp_path / 'data' / shipped['dataset'])
    cmd = [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2', 'train.py',
           f'config/{config}', f"--data_root={tmp_path / 'data'}", f"--out_dir={tmp_path / 'out'}", '--compile=False',
           '--block_size=16', '--order_warmup=semiar:1:16', '--batch_size=2', '--max_iters=2', '--eval_interval=2',
           '--eval_iters=2', '--warmup_iters=1', '--order_warmup_iters=1']
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=600,
                       env=dict(ENVIRON, HF_HUB_CACHE=str(tmp_path / 'hub'), HF_HUB_OFFLINE='1'))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-5000:]
    assert '2 rank(s) (FSDP) on cpu, bfloat16' in p.stdout and 'adapting the GPT' in p.stdout
    ckpt = load_checkpoint(str(tmp_path / 'out'))
    assert ckpt['sharded'].endswith('ckpt_0000002.dcp') and ckpt['started_from']['init_from'] == f'hf:{repo}'
    assert ckpt['config']['activation_checkpointing'] and ckpt['config']['gradient_accumulation_steps'] == 32
    recs = [json.loads(line) for line in open(tmp_path / 'out' / 'log.jsonl')]
    assert [r['iter'] for r in recs] == [0, 2] and all(np.isfinite(r['val_ao']) for r in recs)


@pytest.mark.slow
def test_compiled_blocks_shard_and_recompute(env, monkeypatch):
    """compile=True with fsdp=True compiles each block before it is sharded (torchtitan's order), with activation
    checkpointing inside: 2 ranks train as one eager unsharded process, to the module's float32 bound (the compiled
    kernels fuse elementwise ops, which rounds a few ulps otherwise). The kernels go to a cache of this test's own:
    inductor's shared one does not key them on ATEN_CPU_CAPABILITY (test_train's compile test says what follows)."""
    import test_train
    monkeypatch.setitem(test_train.ENVIRON, 'TORCHINDUCTOR_CACHE_DIR', str(env / 'inductor-cache-fsdp'))
    common = ['--max_iters=4', '--eval_interval=2', '--batch_size=4', '--gradient_accumulation_steps=4']
    run(env, args(env, 'c_eager', *common))
    run(env, args(env, 'c_compiled', *common, '--fsdp=True', '--compile=True', '--activation_checkpointing=True'),
        torchrun=True)
    same_logs(env / 'c_eager', env / 'c_compiled', tol=1e-5)
    same_weights(env / 'c_eager', env / 'c_compiled', atol=1e-5)


def test_a_damaged_sharded_save_is_one_line(env, monkeypatch, capsys):
    """A save whose shard file was lost, or cut short, is one line for a resume and for every reader, never a
    model assembled with rows missing (meta.json records each tensor's whole shape, which the shards must cover)
    nor DCP's tracebacks. The save that is whole resumes as before."""
    import shutil

    import sample
    run_inprocess(monkeypatch, args(env, 'dmg', '--max_iters=2', '--eval_interval=2', '--fsdp=True'))
    save = env / 'dmg' / 'ckpt_0000002.dcp'
    shard = next(save.glob('shard-*.safetensors'))
    for damage, says in [('lost', 'lacks rows of'), ('cut', 'a shard file is truncated')]:
        shutil.copy(shard, env / 'shard.bak')
        if damage == 'lost':
            shard.unlink()
        else:
            shard.write_bytes(shard.read_bytes()[:100])
        with pytest.raises(SystemExit):
            run_inprocess(monkeypatch, args(env, 'dmg', '--max_iters=4', '--eval_interval=2', '--fsdp=True',
                                            '--init_from=auto'))
        with pytest.raises(SystemExit):
            sample.main([f"--ckpt={env / 'dmg'}", '--num_batches=1', '--batch_size=1'])
        err = [line for line in capsys.readouterr().err.strip().splitlines() if line.strip()]
        assert len(err) == 2 and all(line.startswith('error: ') and says in line for line in err), err
        shutil.copy(env / 'shard.bak', shard)
    run_inprocess(monkeypatch, args(env, 'dmg', '--max_iters=4', '--eval_interval=2', '--fsdp=True',
                                    '--init_from=auto'))
    assert 'resumed' in capsys.readouterr().out
