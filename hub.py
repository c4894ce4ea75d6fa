"""
The Hugging Face hub, in one place: whether it can be reached, and switching the HF libraries to
offline mode when it cannot (cache only: an immediate failure instead of ~20 s of retries).
Data (evalsets.py, data/*/prepare.py) and checkpoints (checkpoint.py) go through these.
"""

import os
import sys
import threading

_TRUE = ("1", "ON", "YES", "TRUE")


# -------------------------------------------------------------------------------------- reachability

def offline():
    """Is offline mode on: HF_HUB_OFFLINE / HF_DATASETS_OFFLINE, or go_offline() earlier in this process?"""
    if any(os.environ.get(v, "").upper() in _TRUE for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")):
        return True
    hf = sys.modules.get("huggingface_hub")
    return bool(hf is not None and hf.constants.HF_HUB_OFFLINE)


def hub_reachable(timeout=1.5):
    """Does huggingface_hub's endpoint answer? huggingface_hub sends the request, so its endpoint
    (HF_ENDPOINT: a mirror), its HTTP client's proxies (HTTPS_PROXY, ALL_PROXY, NO_PROXY) and its offline
    flag all count. One HEAD request, no retries; it runs in a thread so that a slow DNS lookup cannot hold
    us past the timeout either. Any answer but a 5xx (a gateway or proxy error) means reachable."""
    if offline():
        return False
    from huggingface_hub import constants, get_session
    ok = []

    def probe():
        try:
            ok.append(get_session().head(constants.ENDPOINT + "/", timeout=timeout).status_code < 500)
        except Exception:  # connection refused, timeout, proxy error, offline mode: all mean "cannot reach"
            pass

    t = threading.Thread(target=probe, daemon=True)
    t.start()
    t.join(timeout + 0.5)
    return bool(ok and ok[0])


def go_offline():
    """Put HF datasets/hub in offline mode (cache only, immediate failure instead of ~20 s of retries)."""
    os.environ["HF_HUB_OFFLINE"] = os.environ["HF_DATASETS_OFFLINE"] = "1"
    if "huggingface_hub" in sys.modules:  # already imported: they read the variables at import time
        sys.modules["huggingface_hub"].constants.HF_HUB_OFFLINE = True
    if "datasets" in sys.modules:
        sys.modules["datasets"].config.HF_HUB_OFFLINE = True
        sys.modules["datasets"].config.HF_DATASETS_OFFLINE = True
