"""loss_chunk (model.head_loss): the training loss's head + cross-entropy a chunk of rows at a time, recomputed in
backward, is the same loss and the same gradients as the whole logits at once, and never keeps those logits."""
import pytest
import torch
from helpers import tiny

from model import GPTConfig

B, n = 3, 8                     # 24 rows: chunks of 5 leave a partial last one
KINDS = {
    'ao': dict(cond='adaln'),
    'ao_table_rope': dict(cond='adaln', adaln_table=True, pos='rope', mlp='swiglu', mlp_hidden=24, n_head=4,
                          n_kv_head=2, head_dim=8),
    'sigma': dict(cond='sigma'),
    'gpt': dict(cond='none'),
    'mdm': dict(causal=False, cond='none', mask_token_id=10),
}


def batch(kind, seed=0):
    """(model inputs, targets): a decoder gets a random order per row and two ignored targets (-1); the encoder a
    masked input and its ELBO's t."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 10, (B, n), generator=g)
    y = x.clone()
    y[0, 3] = y[2, 0] = -1
    if kind == 'mdm':
        masked = torch.rand(B, n, generator=g) < 0.5
        return dict(idx=torch.where(masked, 10, x), t=torch.full((B,), 0.5)), y
    if kind == 'gpt':
        return dict(idx=x), y
    return dict(idx=x, order=torch.stack([torch.randperm(n, generator=g) for _ in range(B)])), y


def loss_and_grads(model, chunk, inputs, y, reduction='mean'):
    model.config.loss_chunk = chunk
    model.zero_grad()
    logits, loss = model(**inputs, targets=y, reduction=reduction)
    (loss if reduction == 'mean' else loss.sum()).backward()
    return logits, loss.detach(), {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize('kind', list(KINDS))
def test_chunked_loss_and_gradients_equal_the_whole_logits_in_float64(kind):
    """float64: each row's NLL is the same function of the same numbers; only the sums over 24 rows (the loss, the
    head's gradient) change order, which moves them by at most about 24 u |terms| (u = 1.1e-16, |terms| <= 10):
    3e-14, so 1e-12 holds on any CPU (tests/README.md, class 5)."""
    model = tiny(**KINDS[kind], vocab_size=11).double().train()
    inputs, y = batch(kind)
    for reduction in ('mean', 'none'):
        logits, ref, ref_g = loss_and_grads(model, 0, inputs, y, reduction)
        assert logits is not None and logits.shape == (B, n, 11)
        for chunk in (1, 5, B * n, 100):
            logits, loss, g = loss_and_grads(model, chunk, inputs, y, reduction)
            assert logits is None  # the point: never all of them
            torch.testing.assert_close(loss, ref, atol=1e-12, rtol=0)
            assert g.keys() == ref_g.keys()
            for k in g:
                torch.testing.assert_close(g[k], ref_g[k], atol=1e-12, rtol=0, msg=lambda m: f"{k}: {m}")
    with torch.no_grad():  # the eval paths (valloss, likelihood: reduction='none' without gradients) chunk too
        model.config.loss_chunk = 5
        torch.testing.assert_close(model(**inputs, targets=y, reduction='none')[1], ref, atol=1e-12, rtol=0)


@pytest.mark.parametrize('kind', ['ao', 'mdm'])
def test_chunked_loss_in_float32_is_within_a_change_of_summation_order(kind):
    """float32: the loss is a mean of 24 NLLs summed in another order (class 4: rel 1e-5); the gradients are sums of
    per-row terms in another order (class 3's gradient bound, atol 1e-6, rtol 1e-4)."""
    model = tiny(**KINDS[kind], vocab_size=11).train()
    inputs, y = batch(kind, seed=1)
    _, ref, ref_g = loss_and_grads(model, 0, inputs, y)
    _, loss, g = loss_and_grads(model, 7, inputs, y)
    assert loss.item() == pytest.approx(ref.item(), rel=1e-5)
    for k in g:
        torch.testing.assert_close(g[k], ref_g[k], atol=1e-6, rtol=1e-4, msg=lambda m: f"{k}: {m}")


@pytest.mark.parametrize('kind', ['ao', 'mdm'])
def test_chunked_loss_keeps_no_full_logits_for_backward(kind):
    """What backward holds after the training forward: with loss_chunk nothing of B x n x V elements (the logits,
    their float32 copy, log-softmax's output), only the chunks' inputs; without it the logits are there (so the
    hook does see them). A vocabulary far wider than the model makes the logits the largest tensor by far."""
    V = 512
    model = tiny(**KINDS[kind], vocab_size=V, n_embd=16).train()
    inputs, y = batch(kind)
    for chunk, holds_logits in ((0, True), (4, False)):
        model.config.loss_chunk = chunk
        sizes = []

        def pack(t):
            sizes.append(t.numel())
            return t
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            _, loss = model(**inputs, targets=y)
        loss.backward()
        assert (max(sizes) >= B * n * V) == holds_logits, (chunk, max(sizes))


@pytest.mark.parametrize('bad', [-1, 2.5, True, '8'])
def test_a_bad_loss_chunk_is_refused_by_name(bad):
    with pytest.raises(ValueError, match=r"^loss_chunk must be an integer >= 0"):
        GPTConfig(loss_chunk=bad)
