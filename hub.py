"""
The Hugging Face hub, in one place: whether it can be reached, and switching the HF libraries to
offline mode when it cannot (cache only: an immediate failure instead of ~20 s of retries).
Data (evalsets.py, data/*/prepare.py) and checkpoints (checkpoint.py) go through these.
"""

import os
import socket
import sys
import threading


def hub_reachable(timeout=1.5):
    """Can we open a TCP connection to huggingface.co? Honours HF_HUB_OFFLINE / HF_DATASETS_OFFLINE.
    The probe runs in a thread so that a slow DNS lookup cannot block us past the timeout either."""
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        if os.environ.get(var, "").upper() in ("1", "ON", "YES", "TRUE"):
            return False
    ok = []

    def probe():
        try:
            socket.create_connection(("huggingface.co", 443), timeout=timeout).close()
            ok.append(True)
        except OSError:
            pass

    t = threading.Thread(target=probe, daemon=True)
    t.start()
    t.join(timeout + 0.5)
    return bool(ok)


def go_offline():
    """Put HF datasets/hub in offline mode (cache only, immediate failure instead of ~20 s of retries)."""
    os.environ["HF_HUB_OFFLINE"] = os.environ["HF_DATASETS_OFFLINE"] = "1"
    if "huggingface_hub" in sys.modules:  # already imported: they read the variables at import time
        sys.modules["huggingface_hub"].constants.HF_HUB_OFFLINE = True
    if "datasets" in sys.modules:
        sys.modules["datasets"].config.HF_HUB_OFFLINE = True
        sys.modules["datasets"].config.HF_DATASETS_OFFLINE = True
