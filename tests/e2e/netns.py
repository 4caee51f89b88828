"""A test cluster on one machine: network namespaces as nodes.

  netns.py up N [--tag T]     make N nodes (T: a short name, default llc)
  netns.py down [--tag T]     remove them, and stop what runs in them
  netns.py exec I CMD...      run CMD on node I
  netns.py status [--tag T]

Each node is a namespace of its own (TAG-nI) with one interface, eth0, at
10.77.0.(I+1)/24, and its own loopback. The eth0s are veth pairs whose
other ends sit on one bridge in a further namespace (TAG-sw), so traffic
between nodes crosses two interfaces and a bridge, and none of it touches
the machine's own network: the host namespace gets no interface, route or
address. Making namespaces needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN) and
iproute2; `available()` says why not where it cannot.

From Python (tests/e2e/test_netns_cluster.py):

  c = Cluster(3, tag="ll1234")
  c.up()
  p = c.start(1, [binary, args...], log_path)   # a process on node 1
  c.addr(1)                                     # "10.77.0.2"
  c.link(2, False)                              # node 2's interface down
  c.enter(0)                                    # this thread's sockets: node 0's
  c.down()                                      # everything gone
"""
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import time

CLONE_NEWNET = 0x40000000
NETNS_DIR = "/var/run/netns"


def _ip(*args, check=True):
    p = subprocess.run(["ip"] + list(args), capture_output=True, text=True, timeout=30)
    if check and p.returncode:
        raise RuntimeError("ip %s: %s" % (" ".join(args), p.stderr.strip()))
    return p


def available():
    """None where namespaces can be made here, else why not."""
    if not shutil.which("ip"):
        return "iproute2 (ip) is not installed"
    if os.geteuid() != 0:
        return "making network namespaces needs root"
    probe = "llprobe%d" % os.getpid()
    p = _ip("netns", "add", probe, check=False)
    if p.returncode:
        return "ip netns add failed: %s" % p.stderr.strip()
    q = _ip("-n", probe, "link", "add", "br0", "type", "bridge", check=False)
    _ip("netns", "del", probe, check=False)
    if q.returncode:
        return "a bridge cannot be made in a namespace: %s" % q.stderr.strip()
    return None


class Cluster:
    def __init__(self, nodes, tag="llc"):
        if not 1 <= nodes <= 200 or len(tag) > 8 or not tag.isalnum():
            raise ValueError("1 to 200 nodes, a tag of up to 8 letters and digits")
        self.n, self.tag = nodes, tag
        self.sw = tag + "-sw"
        self.procs = []

    def ns(self, i):
        return "%s-n%d" % (self.tag, i)

    def addr(self, i):
        return "10.77.0.%d" % (i + 1)

    def _all(self):
        return [self.ns(i) for i in range(self.n)] + [self.sw]

    def up(self):
        self.down()  # what a crashed run with this tag left
        _ip("netns", "add", self.sw)
        _ip("-n", self.sw, "link", "set", "lo", "up")
        _ip("-n", self.sw, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.sw, "link", "set", "br0", "up")
        for i in range(self.n):
            ns = self.ns(i)
            _ip("netns", "add", ns)
            _ip("-n", ns, "link", "set", "lo", "up")
            # one end in the switch, the other in the node: made there, nothing in the host namespace
            _ip("-n", self.sw, "link", "add", "p%d" % i, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("-n", self.sw, "link", "set", "p%d" % i, "master", "br0", "up")
            _ip("-n", ns, "addr", "add", self.addr(i) + "/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
        # the bridge without STP forwards as soon as its ports are up: no learning delay to wait out
        _ip("-n", self.sw, "link", "set", "br0", "type", "bridge", "stp_state", "0", "forward_delay", "0")
        return self

    def run(self, i, args, **kw):
        kw.setdefault("capture_output", True)
        kw.setdefault("timeout", 60)
        return subprocess.run(["ip", "netns", "exec", self.ns(i)] + list(args), **kw)

    def start(self, i, args, log):
        """A process on node i, its output to log; stopped by down() if still running."""
        p = subprocess.Popen(["ip", "netns", "exec", self.ns(i)] + list(args), stdout=open(log, "w"),
                             stderr=subprocess.STDOUT)
        self.procs.append(p)
        return p

    def link(self, i, up):
        """Node i's interface up or down: its peers see silence, not a reset."""
        _ip("-n", self.ns(i), "link", "set", "eth0", "up" if up else "down")

    def enter(self, i):
        """This thread (and the threads and sockets it makes later) into node i's network."""
        libc = ctypes.CDLL(None, use_errno=True)
        fd = os.open(os.path.join(NETNS_DIR, self.ns(i)), os.O_RDONLY)
        try:
            if libc.setns(fd, CLONE_NEWNET):
                raise OSError(ctypes.get_errno(), "setns into %s" % self.ns(i))
        finally:
            os.close(fd)

    def down(self):
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs = []
        for ns in self._all():
            if not os.path.exists(os.path.join(NETNS_DIR, ns)):
                continue
            pids = _ip("netns", "pids", ns, check=False).stdout.split()
            for pid in pids:  # anything else left running there (not this process, which may have entered one)
                try:
                    if int(pid) != os.getpid():
                        os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            _ip("netns", "del", ns, check=False)

    def status(self):
        return {ns: os.path.exists(os.path.join(NETNS_DIR, ns)) for ns in self._all()}


def main(argv):
    tag = "llc"
    if "--tag" in argv:
        k = argv.index("--tag")
        tag = argv[k + 1]
        del argv[k:k + 2]
    if not argv or argv[0] not in ("up", "down", "exec", "status"):
        print(__doc__)
        return 2
    if argv[0] == "up":
        why = available()
        if why:
            print("netns: %s" % why)
            return 1
        c = Cluster(int(argv[1]), tag).up()
        for i in range(c.n):
            print("node %d: namespace %s, address %s" % (i, c.ns(i), c.addr(i)))
        return 0
    if argv[0] == "exec":
        n = int(argv[1])
        return subprocess.call(["ip", "netns", "exec", Cluster(n + 1, tag).ns(n)] + argv[2:])
    # down and status: as many nodes as exist under the tag
    n = 0
    while os.path.exists(os.path.join(NETNS_DIR, "%s-n%d" % (tag, n))):
        n += 1
    c = Cluster(max(n, 1), tag)
    if argv[0] == "down":
        c.down()
        print("netns: %d nodes under %s removed" % (n, tag))
    else:
        for ns, there in c.status().items():
            print("%s %s" % (ns, "up" if there else "absent"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
