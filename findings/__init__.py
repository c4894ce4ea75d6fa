"""The findings put to the test at CPU scale: the paper's (`make findings`: reproduce.py, with the sampling
studies in sampling.py), finding 9 (optimizers.py: Muon against AdamW) and finding 10 (orders.py: order
distributions), whose sections report.py merges into results/README.md; and `make demo` (demo.sh,
demo_summary.py). Their record is results/."""
