"""What the bench scripts share: appending a measured table to BENCHMARKS.md with device, date and command."""
import os
import sys
from datetime import date

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def append_benchmark(title, cuda, description, table):
    """Append `table` under a heading naming the device, the date and torch, with the exact command."""
    dev = torch.cuda.get_device_name() if cuda else f'CPU ({os.cpu_count()} cores)'
    with open(os.path.join(ROOT, 'BENCHMARKS.md'), 'a') as f:
        f.write(f"\n### {title}: {dev}, {date.today()}, torch {torch.__version__}\n\n"
                f"`python {' '.join(sys.argv)}`  \n{description}\n\n{table}\n")
