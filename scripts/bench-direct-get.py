#!/usr/bin/env python3
# Server CPU of one entity-load read: $JS.API.STREAM.MSG.GET (the API get jetshard's
# loads sent) against $JS.API.DIRECT.GET (allow_direct), the same `last_by_subj` requests on the
# same stream of N one-message subjects, alternating rounds, 256 requests in flight. Speaks the
# NATS protocol on a plain socket (no client library); starts its own nats-server
# (NATS_SERVER_BIN) on a free port and kills it by its pid.
#   NATS_SERVER_BIN=$(scripts/install-nats-server) N=10000 ROUNDS=4 scripts/bench-direct-get.py
import socket, subprocess, tempfile, time, os, json, sys
BIN = os.environ["NATS_SERVER_BIN"]
d = tempfile.mkdtemp(prefix="hotpath-dg-")
s0 = socket.socket(); s0.bind(("127.0.0.1", 0)); port = s0.getsockname()[1]; s0.close()
srv = subprocess.Popen([BIN, "-js", "-sd", d + "/js", "-a", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=open(d + "/log", "w"))
def cpu():
    f = open(f"/proc/{srv.pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
try:
    for _ in range(100):
        try:
            c = socket.create_connection(("127.0.0.1", port)); break
        except OSError:
            time.sleep(0.05)
    buf = b""
    def readline():
        global buf
        while b"\r\n" not in buf:
            buf += c.recv(1 << 20)
        line, buf = buf.split(b"\r\n", 1)
        return line
    def readn(n):
        global buf
        while len(buf) < n + 2:
            buf += c.recv(1 << 20)
        data, buf = buf[:n], buf[n + 2:]
        return data
    readline()  # INFO
    c.sendall(b'CONNECT {"verbose":false,"pedantic":false,"headers":true,"no_responders":true}\r\nSUB _R.* 1\r\nPING\r\n')
    def next_msg():
        while True:
            line = readline()
            if line == b"PING":
                c.sendall(b"PONG\r\n"); continue
            if line in (b"PONG", b"+OK") or not line:
                continue
            p = line.split()
            if p[0] == b"MSG":
                return p[1], readn(int(p[-1]))
            if p[0] == b"HMSG":
                return p[1], readn(int(p[-1]))
            raise RuntimeError(line)
    def request(subj, body):
        c.sendall(b"PUB %s _R.x %d\r\n%s\r\n" % (subj, len(body), body))
        return next_msg()
    print(request(b"$JS.API.STREAM.CREATE.J", json.dumps({"name": "J", "subjects": ["j.>"], "allow_direct": True, "storage": "file"}).encode())[1][:80], file=sys.stderr)
    N = int(os.environ.get("N", "10000"))
    out = []
    for i in range(N):
        out.append(b"PUB j.evt.3.e%d 10\r\n0123456789\r\n" % i)
    c.sendall(b"".join(out) + b"PING\r\n")
    while readline() != b"PONG":
        pass
    time.sleep(0.5)
    def run(api, window=256):
        t, c0 = time.time(), cpu()
        sent = got = 0
        while got < N:
            chunk = []
            while sent < N and sent - got < window:
                body = b'{"last_by_subj":"j.evt.3.e%d"}' % sent
                chunk.append(b"PUB %s _R.y %d\r\n%s\r\n" % (api, len(body), body))
                sent += 1
            if chunk:
                c.sendall(b"".join(chunk))
            next_msg(); got += 1
        return (cpu() - c0) * 1e6 / N, N / (time.time() - t)
    res = {"msg.get": [], "direct.get": []}
    for r in range(int(os.environ.get("ROUNDS", "3"))):
        for name, api in ([("msg.get", b"$JS.API.STREAM.MSG.GET.J"), ("direct.get", b"$JS.API.DIRECT.GET.J")][:: 1 if r % 2 == 0 else -1]):
            us, rate = run(api)
            res[name].append(us)
            print(f"round {r+1} {name:10} server {us:6.1f} us/read  {rate:8.0f} reads/s", file=sys.stderr)
    for k, v in res.items():
        v.sort()
        print(f"{k}: median {v[len(v)//2]:.1f} us of server CPU per read (rounds {v})")
finally:
    srv.kill(); srv.wait()
