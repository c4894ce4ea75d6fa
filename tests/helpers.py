"""Tiny models, a fake Hugging Face cache and the exact laws of the order distributions, shared by the tests."""
import contextlib
import hashlib
import itertools
import math
import os
import subprocess
from fractions import Fraction

import torch

from aogpt.generate import logits_to_probs
from aogpt.samplers import Sampling
from aogpt.orders import parse_order
from aogpt.speculative import Speculation, generate_speculative
from model import GPT, GPTConfig


def tiny(seed=0, **kw):
    """A small random model; AdaLN weights are made non-trivial so target conditioning matters."""
    args = dict(block_size=8, vocab_size=11, n_layer=2, n_head=2, n_embd=16, target_dim=8)
    args.update(kw)
    torch.manual_seed(seed)
    model = GPT(GPTConfig(**args))
    with torch.no_grad():  # larger random weights than the 0.02 init, so every path visibly matters
        for name, p in model.named_parameters():
            if 'adaLN' in name or 'wtpe' in name or 'wnonee' in name or 'wpe' in name:
                p.add_(torch.randn_like(p) * 0.3)
    return model.eval()


# the blocks every law is checked on (tests/conftest.py's `backbone` fixture): the paper's, and a Llama/Qwen one
# (rotary positions, SwiGLU, grouped-query attention with 4 query and 2 key/value heads of their own width 8 on a
# 16-wide stream, q/k/v biases only)
BACKBONES = {'paper': {}, 'rope': dict(pos='rope', rope_theta=100.0, mlp='swiglu', mlp_hidden=24, n_head=4, n_kv_head=2,
                                       head_dim=8, bias=False, qkv_bias=True, norm_eps=1e-6)}


def hub_cache(root, repo, files, sha=None, refs=('main',), repo_type='model'):
    """One repo in an HF hub cache, laid out as huggingface_hub writes it: blobs/<sha256> hold the bytes,
    snapshots/<commit>/<path> are symlinks to them, refs/<ref> names the commit (no newline). files:
    {path in the repo: bytes, str, or a local file to copy}. Returns the commit (sha, or one derived
    from the contents)."""
    data = {p: (open(v, 'rb').read() if isinstance(v, os.PathLike) else v.encode() if isinstance(v, str) else v)
            for p, v in files.items()}
    sha = sha or hashlib.sha1(repr(sorted(data.items())).encode()).hexdigest()
    store = root / (f'{repo_type}s--' + repo.replace('/', '--'))
    for path, b in data.items():
        blob = store / 'blobs' / hashlib.sha256(b).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(b)
        link = store / 'snapshots' / sha / path
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.exists():
            link.symlink_to(os.path.relpath(blob, link.parent))
    (store / 'refs').mkdir(parents=True, exist_ok=True)
    for ref in refs:
        (store / 'refs' / ref).write_text(sha)
    return sha


# ---------------------------------------------------------------------- exact laws of the order distributions

def law_semiar(perm, pos, K):
    """P(perm): blocks (position // K) must come in order, then each block's order is uniform."""
    blocks = [p // K for p in perm]
    if blocks != sorted(blocks):
        return Fraction(0)
    return Fraction(1, math.prod(math.factorial(blocks.count(b)) for b in set(blocks)))


def law_nearl2r(perm, pos, W):
    """P(perm) for keys p + W U_p, U_p ~ U[0, 1): every key's density is 1/W on [p, p + W), so between
    consecutive breakpoints (all p and p + W) the densities are constant. Sum over the ways to put the keys,
    in perm's order, into nondecreasing segments: the product of the segment probabilities, times 1/m! for
    m keys sharing a segment (uniform there, so each of their m! orders is equally likely; the j-th key of a
    run contributes its 1/j)."""
    if W == 0:
        return Fraction(int(list(perm) == sorted(perm)))
    b = sorted({Fraction(p) for p in pos} | {p + W for p in pos})
    seg = [(b[t], b[t + 1]) for t in range(len(b) - 1)]

    def paths(j, t0, run):  # keys perm[j:], the previous one in segment t0 as the run-th of its run
        if j == len(perm):
            return Fraction(1)
        p, total = perm[j], Fraction(0)
        for t in range(t0, len(seg)):
            if p <= seg[t][0] and seg[t][1] <= p + W:
                r = run + 1 if t == t0 else 1                     # this key's place in its segment's run
                total += (seg[t][1] - seg[t][0]) / W / r * paths(j + 1, t, r)
        return total
    return paths(0, 0, 0)


def exact_law(spec, pos):
    """{permutation of pos: probability} of a spec, by enumeration."""
    out = {}
    for perm in itertools.permutations(pos):
        p = Fraction(0)
        for w, kind, arg in parse_order(spec):
            one = {'random': lambda *_: Fraction(1, math.factorial(len(pos))),
                   'l2r': lambda perm, pos, _: Fraction(int(list(perm) == sorted(pos))),
                   'semiar': law_semiar, 'nearl2r': law_nearl2r}[kind]
            p += Fraction(w).limit_denominator(10 ** 6) * one(perm, pos, Fraction(arg).limit_denominator(1000)
                                                              if kind == 'nearl2r' else arg)
        out[perm] = p
    return out


@torch.no_grad()
def seq_law(model, n, V, orders, given=None, **tf):
    """P(x) over all V^n sequences x of sequential sampling along each order (given tokens first,
    ascending), averaged over `orders` (a list), or weighted by them ({order: probability}); tf:
    temperature / top_p. One uncached forward per order reads every conditional: slot j of
    model(x, order) predicts order[j] from order[:j]."""
    xs = torch.tensor(list(itertools.product(range(V), repeat=n)))            # (V^n, n)
    law = torch.zeros(len(xs), dtype=torch.float64)
    g = [] if given is None else [i for i in range(n) if given[i] >= 0]
    ok = torch.ones(len(xs), dtype=torch.bool)
    for i in g:
        ok &= xs[:, i] == given[i]
    weighted = orders.items() if isinstance(orders, dict) else [(sigma, 1 / len(orders)) for sigma in orders]
    for sigma, w in weighted:
        o = torch.tensor(g + [s for s in sigma if s not in g])
        logits = model(xs, order=o.expand(len(xs), n))[0]                     # (V^n, n, V')
        p = logits_to_probs(logits, vocab_size=V, **tf)
        lp = torch.ones(len(xs), dtype=torch.float64)
        for j in range(len(g), n):
            lp *= p[:, j].gather(1, xs[:, o[j]][:, None]).squeeze(1)
        law += torch.where(ok, lp, 0.0) * w
    return xs, law


def chi2_cells(samples, law):
    """Pearson chi-square p-value of samples (a list of hashable cells, e.g. tuples of ids of any length)
    against law {cell: probability}; cells expecting < 5 are pooled. A sample in a cell the law gives
    probability 0, or does not list, gives 0.0."""
    obs = {}
    for x in samples:
        obs[x] = obs.get(x, 0) + 1
    if any(law.get(x, 0) <= 0 for x in obs):
        return 0.0
    N = len(samples)
    o, e, so, se = [], [], 0.0, 0.0
    for cell, p in law.items():
        if p * N < 5:
            so, se = so + obs.get(cell, 0), se + p * N
        else:
            o.append(obs.get(cell, 0)), e.append(p * N)
    if se > 0:
        o.append(so), e.append(se)
    o, e = torch.tensor(o, dtype=torch.float64), torch.tensor(e, dtype=torch.float64)
    stat = ((o - e) ** 2 / e).sum()
    return torch.special.gammaincc(torch.tensor((len(e) - 1) / 2.0, dtype=torch.float64), stat / 2).item()


def alive(pid):
    """Whether pid is a running (not zombie) process, from /proc."""
    try:
        with open(f'/proc/{pid}/stat') as f:
            return f.read().rsplit(')', 1)[1].split()[0] != 'Z'
    except OSError:
        return False


def processes(text):
    """The running pids, other than this one, whose command line or environment holds text (from /proc: no
    psutil needed). A forked worker has its parent's command line; a bash script's child, its environment."""
    pids = []
    for d in os.listdir('/proc'):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            if any(text in open(f'/proc/{d}/{f}', 'rb').read().decode(errors='replace') for f in ('cmdline', 'environ')):
                pids.append(int(d))
        except OSError:
            pass
    return [q for q in pids if alive(q)]


@contextlib.contextmanager
def small_fs(path, size='64k'):
    """A tmpfs of `size` mounted at path (made here) for a test of a full disk or a read-only folder: yields
    remount(options), e.g. remount('ro'). Skips the test where mounting is not allowed (not root, a container
    without CAP_SYS_ADMIN): a monkeypatched ENOSPC test covers the same code there."""
    import pytest
    os.makedirs(path, exist_ok=True)
    if subprocess.run(['mount', '-t', 'tmpfs', '-o', f'size={size}', 'tmpfs', str(path)],
                      capture_output=True).returncode:
        pytest.skip("cannot mount a small tmpfs here (needs root with mount rights)")

    def remount(options):
        subprocess.run(['mount', '-o', f'remount,{options}', str(path)], check=True, capture_output=True)
    try:
        yield remount
    finally:
        subprocess.run(['umount', '-l', str(path)], capture_output=True)


def fill(folder, leave):
    """Fill the filesystem holding folder until about `leave` bytes are free (a file named filler)."""
    st = os.statvfs(folder)
    free = st.f_bavail * st.f_frsize
    with open(os.path.join(folder, 'filler'), 'wb') as f:
        f.write(b'\0' * max(0, free - leave))


def speculate(model, n, batch_size, settings=None, **kw):
    """generate_speculative with a test's keywords kw: those that name a Speculation field make its speculation,
    the rest are generate_speculative's own."""
    names = set(Speculation.__dataclass_fields__)
    sp = Speculation(**{k: v for k, v in kw.items() if k in names})
    return generate_speculative(model, n, batch_size, settings, speculation=sp,
                                **{k: v for k, v in kw.items() if k not in names})


def split_settings(kw, **fields):
    """A sampler call's keywords kw (a test's parameters) as (the samplers.Sampling of fields and of kw's
    settings, the sampler's other keywords)."""
    names = set(Sampling.__dataclass_fields__)
    return (Sampling(**fields, **{k: v for k, v in kw.items() if k in names}),
            {k: v for k, v in kw.items() if k not in names})
