"""The paper's findings put to the test at CPU scale (`make findings`: reproduce.py, with the sampling
studies in sampling.py) and `make demo` (demo.sh, demo_summary.py). Their record is results/."""
