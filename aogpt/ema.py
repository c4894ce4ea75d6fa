"""
The exponential moving average of the weights that train.py keeps, evaluates with (eval_ema) and saves.

    ema = EMA(model, decay)        # float32 copies of the parameters, keyed by name
    ema.update()                   # after each optimizer step
    ema.swap(); ...; ema.swap()    # evaluate with the EMA weights, then the live ones are back exactly

The decay warms up, min(decay, (1 + n) / (10 + n)) after n updates, so the random initial weights fade
fast. A checkpoint holds state_dict(), ema=dict(decay, num_updates, params) keyed by parameter *name*
(checkpoint.py): the paper's EMA is a positional list, which silently scrambles if modules are reordered.
"""

if __name__ == '__main__':  # run as a script (python aogpt/ema.py): one line, not an ImportError
    raise SystemExit("error: aogpt/ema.py is a library module, with nothing to run: the commands are train.py, "
                     "sample.py, eval_ppl.py, eval_harness.py and export.py at the repository's root")

import torch

from model import strip_prefixes


class EMA:

    def __init__(self, model, decay):
        self.decay, self.num_updates = decay, 0
        self.live = dict(model.named_parameters())  # tied weights appear once, by their first name
        self.params = {n: p.detach().clone().float() for n, p in self.live.items()}

    def update(self):
        d = min(self.decay, (1 + self.num_updates) / (10 + self.num_updates))  # warm-up: early weights fade fast
        with torch.no_grad():
            torch._foreach_lerp_(list(self.params.values()), [self.live[n].detach() for n in self.params], 1.0 - d)
        self.num_updates += 1

    def swap(self):
        """Exchange the live weights with the EMA weights in place (doing it twice restores both exactly)."""
        with torch.no_grad():
            for n, e in self.params.items():
                tmp = self.live[n].detach().clone()
                self.live[n].copy_(e)
                e.copy_(tmp)

    def state_dict(self):
        return dict(decay=self.decay, num_updates=self.num_updates, params=self.params)

    def load_state_dict(self, state):
        """A checkpoint's EMA (this run's decay stays: a resume may change it)."""
        for n, v in strip_prefixes(state['params']).items():
            self.params[n].copy_(v)
        self.num_updates = state['num_updates']
