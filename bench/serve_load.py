#!/usr/bin/env python3
"""Load and fault checks of `sluice serve` over loopback (issue 16), not part of the test suite.

  bench/serve_load.py --sluice build/sluice --model models/moby-moe [--clients 64]
                      [--max-tokens 128] [--flags "--batch 64"]

1. Load: --clients concurrent streaming clients (one chat or completion request each, greedy)
   while /health is polled; reports mean running batch (from /metrics), generated tokens/s, p50
   and p99 time to first token and end-to-end latency; then the same requests through
   `sluice run` with the same policy flags, and the server's throughput as a fraction of it.
2. Faults, on a server with a small queue: clients killed mid-stream, garbage and oversized
   bodies, 1000 requests beyond the queue size; /health must answer throughout and KV use return
   to 0; then SIGTERM mid-load must end the server with exit status 0.
"""
import argparse, http.client, json, os, re, signal, socket, statistics, subprocess, sys
import tempfile, threading, time

PROMPTS = ["Call me Ishmael.", "The whale", "It was the sea that", "Captain Ahab said",
           "The ship sailed", "In the morning the harpooneers", "Queequeg", "The white whale"]


def start_server(sluice, model, flags, log):
    cmd = [sluice, "serve", "--model", model, "--port", "0"] + flags
    proc = subprocess.Popen(cmd, stderr=open(log, "w"))
    for _ in range(1200):
        time.sleep(0.1)
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", open(log).read())
        if m:
            return proc, int(m.group(1))
        if proc.poll() is not None:
            sys.exit(f"serve exited early:\n{open(log).read()}")
    sys.exit("serve did not start")


def request(port, method, path, body=None, timeout=600):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request(method, path, body=body, headers={"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, data


def metrics(port):
    _, text = request(port, "GET", "/metrics")
    return {m.group(1): float(m.group(2))
            for m in re.finditer(r"^sluice_(\w+) (\S+)$", text.decode(), re.M)}


def body_of(i, max_tokens, stream):
    b = {"max_tokens": max_tokens, "temperature": 0, "stream": stream}
    if stream:
        b["stream_options"] = {"include_usage": True}
    if i % 2:
        b["messages"] = [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}]
    else:
        b["prompt"] = PROMPTS[i % len(PROMPTS)]
    return b


def stream_one(port, i, max_tokens, out):
    path = "/v1/chat/completions" if i % 2 else "/v1/completions"
    t0 = time.monotonic()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", path, body=json.dumps(body_of(i, max_tokens, True)),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    first, tokens, done = None, 0, False
    for line in r:
        line = line.strip()
        if not line.startswith(b"data: "):
            continue
        data = line[6:]
        if data == b"[DONE]":
            done = True
            break
        chunk = json.loads(data)
        if "error" in chunk:  # failed by the server (e.g. waiting when SIGTERM came)
            break
        if chunk.get("usage"):
            tokens = chunk["usage"]["completion_tokens"]
        if first is None and chunk["choices"] and (
                chunk["choices"][0].get("text") or chunk["choices"][0].get("delta", {}).get("content")):
            first = time.monotonic() - t0
    c.close()
    out[i] = {"ok": r.status == 200 and done, "ttft": first, "e2e": time.monotonic() - t0,
              "tokens": tokens}


class HealthWatch(threading.Thread):
    def __init__(self, port):
        super().__init__(daemon=True)
        self.port, self.failures, self.checks, self.stop = port, 0, 0, False

    def run(self):
        while not self.stop:
            try:
                ok = request(self.port, "GET", "/health", timeout=5)[0] == 200
            except OSError:
                ok = False
            self.checks += 1
            self.failures += not ok
            time.sleep(0.05)


def pct(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def load(args, flags, work):
    proc, port = start_server(args.sluice, args.model, flags + args.serve_flags.split(),
                              os.path.join(work, "load.log"))
    watch = HealthWatch(port)
    watch.start()
    before = metrics(port)
    results = {}
    t0 = time.monotonic()
    threads = [threading.Thread(target=stream_one, args=(port, i, args.max_tokens, results))
               for i in range(args.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    after = metrics(port)
    watch.stop = True
    watch.join()
    proc.send_signal(signal.SIGTERM)
    status = proc.wait()
    ok = sum(r["ok"] for r in results.values())
    tokens = sum(r["tokens"] for r in results.values())
    steps = after["steps_total"] - before["steps_total"]
    mean_batch = (after["running_sequences_step_total"] - before["running_sequences_step_total"]) / steps
    ttft = [r["ttft"] for r in results.values() if r["ttft"] is not None]
    e2e = [r["e2e"] for r in results.values()]
    # The same requests through `sluice run`.
    with open(os.path.join(work, "in.jsonl"), "w") as f:
        for i in range(args.clients):
            b = body_of(i, args.max_tokens, False)
            del b["stream"]
            b["custom_id"] = f"r{i}"
            f.write(json.dumps(b) + "\n")
    run = subprocess.run([args.sluice, "run", "--model", args.model, "--input",
                          os.path.join(work, "in.jsonl"), "--output",
                          os.path.join(work, "out.jsonl")] + flags,
                         capture_output=True, text=True)
    m = re.search(r"(\d+) generated tokens, ([0-9.]+) tokens/s generated", run.stderr)
    if not m:
        sys.exit(f"sluice run failed:\n{run.stderr}")
    run_tokens, run_rate = int(m.group(1)), float(m.group(2))
    rate = tokens / wall
    print(f"load: {ok}/{args.clients} streaming clients completed; {tokens} tokens in {wall:.2f} s "
          f"= {rate:.1f} tokens/s; mean running batch {mean_batch:.1f} over {steps:.0f} steps")
    print(f"load: TTFT p50 {pct(ttft, 50)*1e3:.0f} ms p99 {pct(ttft, 99)*1e3:.0f} ms; end-to-end "
          f"p50 {pct(e2e, 50):.2f} s p99 {pct(e2e, 99):.2f} s")
    print(f"load: sluice run on the same requests: {run_tokens} tokens, {run_rate:.1f} tokens/s; "
          f"server/run = {rate / run_rate:.2f}")
    print(f"load: /health {watch.checks - watch.failures}/{watch.checks} answered; "
          f"KV use after {after['kv_cache_usage_ratio']}; exit status after SIGTERM {status}")
    return ok == args.clients and watch.failures == 0 and status == 0


def killed_mid_stream(port, n):
    for i in range(n):
        s = socket.create_connection(("127.0.0.1", port))
        body = json.dumps(body_of(i, 200, True)).encode()
        path = "/v1/chat/completions" if i % 2 else "/v1/completions"
        s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        s.recv(512)
        s.close()


def faults(args, flags, work):
    proc, port = start_server(args.sluice, args.model, flags + args.serve_flags.split() + ["--max-queue", "16",
                              "--max-body-bytes", "65536"], os.path.join(work, "faults.log"))
    watch = HealthWatch(port)
    watch.start()
    killed_mid_stream(port, 20)
    garbage = [request(port, "POST", "/v1/completions", b)[0]
               for b in [b"\x00\xff garbage", b"{", b"[]", b'{"prompt": 5}', b'{"messages": "x"}']]
    oversized = request(port, "POST", "/v1/completions", b'{"prompt": "' + b"a" * 200000 + b'"}')[0]
    statuses = {}
    lock = threading.Lock()

    def one(i):
        try:
            s = request(port, "POST", "/v1/completions",
                        json.dumps({"prompt": PROMPTS[i % 8], "max_tokens": 16}).encode())[0]
        except OSError:
            s = "connection error"
        with lock:
            statuses[s] = statuses.get(s, 0) + 1

    burst = [threading.Thread(target=one, args=(i,)) for i in range(1000 + 16 + 64)]
    for t in burst:
        t.start()
    for t in burst:
        t.join()
    for _ in range(600):  # until every admitted request has ended (finished or cancelled)
        m = metrics(port)
        ended = m["requests_finished_total"] + m["requests_cancelled_total"]
        if (m["requests_accepted_total"] == ended and m["running_sequences"] == 0
                and m["kv_cache_usage_ratio"] == 0):
            break
        time.sleep(0.1)
    print(f"faults: 20 clients killed mid-stream; garbage bodies -> {garbage}; 200 kB body -> "
          f"{oversized}; burst of {len(burst)} requests -> {statuses}")
    print(f"faults: after: running {m['running_sequences']}, KV use {m['kv_cache_usage_ratio']}, "
          f"cancelled {m['requests_cancelled_total']}, rejected {m['requests_rejected_total']}")
    # SIGTERM while streams run.
    results = {}
    threads = [threading.Thread(target=stream_one, args=(port, i, 200, results)) for i in range(32)]
    for t in threads:
        t.start()
    time.sleep(1.0)
    watch.stop = True  # /health is counted up to the signal, not while the server exits
    watch.join()
    proc.send_signal(signal.SIGTERM)
    status = proc.wait()
    for t in threads:
        t.join()
    print(f"faults: SIGTERM mid-load: exit status {status}; {sum(r['ok'] for r in results.values())}"
          f"/32 streams ended cleanly; /health {watch.checks - watch.failures}/{watch.checks} "
          f"answered before the signal")
    return status == 0 and m["kv_cache_usage_ratio"] == 0 and oversized == 413


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sluice", default="build/sluice")
    ap.add_argument("--model", default="models/moby-moe")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--flags", default="", help="policy flags for both serve and run")
    ap.add_argument("--serve-flags", default="", help="flags for serve alone (--prompt-len ...)")
    args = ap.parse_args()
    flags = args.flags.split()
    with tempfile.TemporaryDirectory() as work:
        ok = load(args, flags, work)
        ok = faults(args, flags, work) and ok
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
